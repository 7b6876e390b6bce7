package distlock

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// TestRoomLingersFromItsLastLeave checks the room's linger (W5, and the
// shared subscription of a lock taken over and over): a room keeps its
// subscription for roomLinger after its last waiter left, counted from the
// last leave when waiters came and went during the linger, or stayed
// while its timer ran, and then it closes.
func TestRoomLingersFromItsLastLeave(t *testing.T) {
	bubble(t, func(t *testing.T) {
		e := &fakeMutex(t, &fakeStore{}).e
		const slack = 10 * time.Millisecond
		enter := func() (*room, *waiter) {
			r, _ := proc.enterRoom(e, true)
			w := r.join("waiter")
			r.listen()
			synctest.Wait() // the subscription is up
			return r, w
		}
		rooms := func() int {
			synctest.Wait()
			return RoomsOf(e.keys.Lease)
		}

		r, w := enter()
		r.leave(w)
		time.Sleep(roomLinger - slack)
		r, w = enter() // back during the linger
		r.leave(w)
		time.Sleep(roomLinger - slack) // the first linger has run out meanwhile
		require.Equal(t, 1, rooms(), "rooms %v after the last leave, which was at most roomLinger ago", roomLinger-slack)
		time.Sleep(2 * slack)
		require.Equal(t, 0, rooms(), "rooms roomLinger after the last leave")

		r, w = enter()
		r.leave(w)
		r, w = enter() // in the room while its linger timer runs
		time.Sleep(2 * roomLinger)
		require.Equal(t, 1, rooms(), "rooms while a waiter is in it")
		r.leave(w)
		time.Sleep(roomLinger - slack)
		require.Equal(t, 1, rooms(), "rooms less than roomLinger after the last leave")
		time.Sleep(2 * slack)
		require.Equal(t, 0, rooms(), "rooms roomLinger after the last leave")
	})
}

// TestDeliverPassesWakesTheWaiter checks that a release's reply wakes the
// waiters of this process it passed the lock (or permits) to, and only
// them, with the release's send time, and costs no allocation.
func TestDeliverPassesWakesTheWaiter(t *testing.T) {
	e := &fakeMutex(t, &fakeStore{}).e
	r, _ := proc.enterRoom(e, true)
	w, other := r.join("next"), r.join("other")
	defer r.leave(other)
	defer r.leave(w)
	sent := time.Now()
	rel := lease.Release{Deleted: true, Passed: lease.Pass{Value: "next", Token: 7, Room: proc.roomID}}
	deliverPasses(e, rel, sent)
	select {
	case n := <-w.grant:
		require.Equal(t, grantNote{token: 7, sent: sent}, n)
	default:
		t.Fatal("the waiter the lock was passed to was not woken")
	}
	select {
	case n := <-other.grant:
		t.Fatalf("another waiter was woken: %+v", n)
	default:
	}
	elsewhere := rel
	elsewhere.Passed.Room = "another process"
	deliverPasses(e, elsewhere, sent)
	select {
	case n := <-w.grant:
		t.Fatalf("woken by a pass to another process's room: %+v", n)
	default:
	}
	// A semaphore's release passes several permits: the first here to
	// another process, the next to w.
	several := elsewhere
	several.More = []lease.Pass{{Value: "next", Token: 8, Room: proc.roomID}}
	deliverPasses(e, several, sent)
	select {
	case n := <-w.grant:
		require.Equal(t, grantNote{token: 8, sent: sent}, n)
	default:
		t.Fatal("the waiter a later permit was passed to was not woken")
	}
	for _, rel := range []lease.Release{rel, several} {
		allocs := testing.AllocsPerRun(100, func() {
			deliverPasses(e, rel, sent)
			<-w.grant
		})
		require.Zero(t, allocs, "allocations per pass delivered, %d passes", len(rel.Passes()))
	}
}

// keepingLineStore is a lineStore that records the goroutine the first
// AcquireOrQueue call of each value ran on.
type keepingLineStore struct {
	*lineStore
	firstCallOn map[string]int64 // by value
}

func (s *keepingLineStore) AcquireOrQueue(ctx context.Context, k lease.Keys, value string, ttl time.Duration, p lease.Place) (lease.Grant, error) {
	s.mu.Lock()
	if _, ok := s.firstCallOn[value]; !ok {
		s.firstCallOn[value] = goid()
	}
	s.mu.Unlock()
	return s.lineStore.AcquireOrQueue(ctx, k, value, ttl, p)
}

// TestFirstCallInLineRunsOnTheCallersGoroutine: a Lock whose context
// cannot end sends its first call on its own goroutine even when a room
// of this process waits for the lock already (the contended case: every
// waiter but the first finds the room), since nothing of its value is in
// Redis yet and no grant can come to it before that call's reply. It
// costs no goroutine and no hand-off per contended acquisition. The
// grants still reach every waiter, in order.
func TestFirstCallInLineRunsOnTheCallersGoroutine(t *testing.T) {
	s := &keepingLineStore{lineStore: newLineStore(), firstCallOn: map[string]int64{}}
	mutex := func() *Mutex {
		m, err := newMutex("first-call", nil)
		require.NoError(t, err)
		m.e.client, m.e.store = s, s
		return m
	}
	holder := mutex()
	g, err := holder.Lock(context.Background())
	require.NoError(t, err)

	type result struct {
		value string
		on    int64
		err   error
	}
	results := make(chan result, 2)
	waiter := func() {
		m := mutex()
		on := goid()
		g, err := m.Lock(context.Background())
		if err != nil {
			results <- result{err: err}
			return
		}
		results <- result{value: g.value, on: on}
		_, err = g.Release(context.Background())
		if err != nil {
			results <- result{err: err}
		}
	}
	go waiter()
	s.waitInLine()
	require.Eventually(t, func() bool { return proc.lookupRoom(&holder.e) != nil }, 5*time.Second, time.Millisecond,
		"the first waiter's room")
	go waiter() // finds the room of the first
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.line) == 2
	}, 5*time.Second, time.Millisecond, "both waiters in line")
	_, err = g.Release(context.Background())
	require.NoError(t, err)
	for range 2 {
		r := <-results
		require.NoError(t, r.err)
		s.mu.Lock()
		on := s.firstCallOn[r.value]
		s.mu.Unlock()
		require.Equal(t, r.on, on, "the goroutine of the first call in line of %s", r.value)
	}
}
