package distlock

import (
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
