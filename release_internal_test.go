package distlock

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// These tests drive the end of a guard against a fake store inside a
// synctest bubble, where a call that waits on the (fake) network makes time
// move: a call that must not wait is checked to take no time at all.

// hangingStore is a fakeStore whose final delete hangs until its deadline,
// as it does when Redis is stopped, unless answer is closed first.
type hangingStore struct {
	*fakeStore
	answer chan struct{}
}

func newHangingStore() *hangingStore {
	return &hangingStore{fakeStore: &fakeStore{}, answer: make(chan struct{})}
}

func (s *hangingStore) Release(ctx context.Context, k lease.Keys, value string) (lease.Release, error) {
	select {
	case <-s.answer:
		return s.fakeStore.Release(ctx, k, value)
	case <-ctx.Done():
		return lease.Release{}, ctx.Err()
	}
}

// hangingMutex returns a Mutex with a TTL of ttl whose final deletes hang.
func hangingMutex(t *testing.T, ttl time.Duration) (*Mutex, *hangingStore) {
	t.Helper()
	s := newHangingStore()
	m, err := newMutex("job", []Option{WithTTL(ttl)})
	require.NoError(t, err)
	m.e.client, m.e.store = s, s
	return m, s
}

func TestReleaseWithCancelledContextNeverReportsAcquired(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		m := fakeMutex(t, f)
		done, cancel := context.WithCancel(t.Context())
		cancel()
		// The race is between Release returning and the actor noticing;
		// try it often enough that the old behaviour cannot hide.
		for i := range 50 {
			g, err := m.Lock(t.Context())
			require.NoError(t, err)
			before := g.Subscribe(t.Context())
			require.Equal(t, Acquired, (<-before).State)

			st, err := g.Release(done)
			if err != nil { // nil when the release was quick enough
				require.ErrorIs(t, err, context.Canceled, "round %d", i)
			}
			assert.NotEqual(t, Acquired, st, "round %d: state returned by Release", i)
			assert.Equal(t, Released, g.State(), "round %d: State after Release", i)
			assert.ErrorIs(t, context.Cause(g.Context()), ErrReleased, "round %d: cause after Release", i)
			if ev, ok := <-g.Subscribe(t.Context()); ok {
				assert.Equal(t, Released, ev.State, "round %d: first event of a subscription made after Release", i)
			}
			<-g.Done()
			for ev := range before {
				assert.Equal(t, Released, ev.State, "round %d: event after Release", i)
			}
		}
	})
}

func TestSubscribeAndStateDuringAHangingRelease(t *testing.T) {
	bubble(t, func(t *testing.T) {
		m, s := hangingMutex(t, fakeTTL)
		g, err := m.Lock(t.Context())
		require.NoError(t, err)
		go func() { _, _ = g.Release(context.Background()) }()
		synctest.Wait() // the delete is now hanging

		start := time.Now()
		subCtx, cancelSub := context.WithCancel(t.Context())
		during := g.Subscribe(subCtx)
		assert.Equal(t, Released, g.State())
		_ = g.Context()
		select {
		case <-g.Done():
			t.Fatal("Done closed while the delete hangs")
		default:
		}
		assert.Zero(t, time.Since(start), "Subscribe, State, Context or Done waited for the delete")

		// The subscription's own ctx ends it, delete or not.
		cancelSub()
		for ev := range during {
			assert.NotEqual(t, Acquired, ev.State)
		}
		assert.Zero(t, time.Since(start), "unsubscribing waited for the delete")

		// A subscription that stays gets the final Released when the delete
		// has its answer, and is closed.
		stays := g.Subscribe(t.Context())
		close(s.answer)
		<-g.Done()
		var got []State
		for ev := range stays {
			got = append(got, ev.State)
		}
		assert.Equal(t, []State{Released}, got)
	})
}

func TestReleaseWithoutDeadlineIsBounded(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const ttl = 30 * time.Second // the default, and far above the ReleaseTimeout
		m, _ := hangingMutex(t, ttl)
		g, err := m.Lock(t.Context())
		require.NoError(t, err)

		start := time.Now()
		st, err := g.Release(context.Background())
		assert.Equal(t, ReleaseTimeout, time.Since(start), "Release with a ctx without deadline")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, Released, st)
		// The delete goes on in the background until the lease ends.
		<-g.Done()
		assert.Equal(t, ttl, time.Since(start), "the delete's own deadline: the end of the lease")

		// A deadline of the caller's own is obeyed, even a longer one.
		m, _ = hangingMutex(t, ttl)
		g, err = m.Lock(t.Context())
		require.NoError(t, err)
		start = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 3*ReleaseTimeout)
		defer cancel()
		_, err = g.Release(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, 3*ReleaseTimeout, time.Since(start), "Release with the caller's deadline")
		<-g.Done()
	})
}

func TestDeadlineIsTheLocalLeaseDeadline(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		g, err := fakeMutex(t, f).Lock(t.Context())
		require.NoError(t, err)
		start := time.Now()
		assert.Equal(t, start.Add(fakeTTL-margin(fakeTTL)), g.Deadline(), "after the acquisition")

		// Each confirmed renewal moves it on, counted from its send time.
		time.Sleep(fakeTTL/3 + time.Millisecond)
		synctest.Wait()
		renewed := start.Add(fakeTTL / 3)
		assert.Equal(t, renewed.Add(fakeTTL-margin(fakeTTL)), g.Deadline(), "after a renewal")

		// A renewal that hangs: Acquired exactly until the deadline, then
		// Lost, and Deadline says so.
		f.set(renewHang)
		d := g.Deadline()
		time.Sleep(time.Until(d) - time.Nanosecond)
		assert.Equal(t, Acquired, g.State(), "just before the deadline")
		assert.Equal(t, d, g.Deadline(), "just before the deadline")
		time.Sleep(time.Nanosecond)
		assert.Equal(t, Lost, g.State(), "at the deadline")
		assert.Zero(t, g.Deadline(), "at the deadline: the guard vouches for nothing")

		// Back to Acquired: a deadline again, from the renewal that proved it.
		f.set(renewOK)
		time.Sleep(fakeTTL / 3)
		synctest.Wait()
		require.Equal(t, Acquired, g.State())
		assert.True(t, g.Deadline().After(time.Now()), "deadline %v after regaining, now %v", g.Deadline(), time.Now())

		_, err = g.Release(t.Context())
		require.NoError(t, err)
		assert.Zero(t, g.Deadline(), "after Release")
	})
}

func TestLeaveSendsNothing(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{mode: renewHang}
		rec := &recorder{}
		g, err := fakeMutex(t, f, WithObserver(rec)).Lock(t.Context())
		require.NoError(t, err)
		f.mu.Lock()
		f.done = g.Done()
		f.mu.Unlock()
		events := g.Subscribe(t.Context())
		require.Equal(t, Acquired, (<-events).State)
		time.Sleep(fakeTTL/3 + time.Millisecond) // a renewal is now hanging
		synctest.Wait()
		require.Len(t, f.renewCalls(), 1)

		start := time.Now()
		st, err := g.Leave(t.Context())
		require.NoError(t, err)
		assert.Equal(t, Released, st, "the lease was held when Leave was called")
		assert.Zero(t, time.Since(start), "Leave waited for the hanging renewal's deadline")
		assert.Equal(t, Released, g.State())
		assert.Zero(t, g.Deadline())
		assert.ErrorIs(t, context.Cause(g.Context()), ErrReleased)
		var got []State
		for ev := range events {
			got = append(got, ev.State)
		}
		assert.Equal(t, []State{Released}, got, "events after Leave")
		assert.NotEmpty(t, f.holder, "Leave deleted the lease")
		assert.Empty(t, f.releases, "Leave sent a delete")

		// Release afterwards changes nothing: Leave came first.
		st, err = g.Release(t.Context())
		require.NoError(t, err)
		assert.Equal(t, Released, st)
		time.Sleep(10 * fakeTTL)
		assert.Zero(t, f.afterDone, "a command reached the store after Leave returned")
		assert.Len(t, f.renewCalls(), 1)
		assert.Empty(t, f.releases)
		last := rec.transitions[len(rec.transitions)-1]
		assert.Equal(t, Released, last.To, "the observer hears of the end")
	})
}

func TestLeaveAfterLossReportsLost(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{mode: renewRefuse}
		g, err := fakeMutex(t, f).Lock(t.Context())
		require.NoError(t, err)
		time.Sleep(fakeTTL/3 + time.Millisecond)
		synctest.Wait()
		require.Equal(t, Lost, g.State())
		st, err := g.Leave(t.Context())
		require.NoError(t, err)
		assert.Equal(t, Lost, st)
		assert.Equal(t, Released, g.State())
	})
}

func TestReleaseThenLeaveWaitsForTheRelease(t *testing.T) {
	bubble(t, func(t *testing.T) {
		m, s := hangingMutex(t, fakeTTL)
		g, err := m.Lock(t.Context())
		require.NoError(t, err)
		go func() { _, _ = g.Release(t.Context()) }()
		synctest.Wait() // the delete is now hanging
		left := make(chan State, 1)
		go func() {
			st, _ := g.Leave(t.Context())
			left <- st
		}()
		synctest.Wait()
		select {
		case st := <-left:
			t.Fatalf("Leave returned %v while the release it follows was in flight", st)
		default:
		}
		close(s.answer)
		assert.Equal(t, Released, <-left, "Leave returns the release's result")
		assert.Empty(t, s.holder, "the release came first and deleted the lease")
	})
}

func TestNilContextIsAnArgument(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		g, err := fakeMutex(t, f).Lock(t.Context())
		require.NoError(t, err)
		for name, end := range map[string]func(context.Context) (State, error){"Release": g.Release, "Leave": g.Leave} {
			st, err := end(nil)
			require.ErrorIs(t, err, ErrInvalidArgument, name)
			assert.ErrorIs(t, err, ErrInvalidOption, "%s: still matches, for compatibility", name)
			var ae *ArgumentError
			require.ErrorAs(t, err, &ae, name)
			assert.Equal(t, "ctx", ae.Arg, name)
			assert.Equal(t, "distlock: ctx is nil", err.Error(), name)
			assert.Equal(t, Acquired, st, name)
			assert.Equal(t, Acquired, g.State(), "%s(nil) ended the guard", name)
		}
		synctest.Wait()
		assert.Empty(t, f.releases, "a nil ctx reached the store")
		st, err := g.Release(t.Context())
		require.NoError(t, err)
		assert.Equal(t, Released, st)
	})
}

func TestReleaseAfterTheDeadlineKeepsTheLossAsCause(t *testing.T) {
	bubble(t, func(t *testing.T) {
		// The lease lapses at D; Release is called at that very instant,
		// whether or not the actor's timer has been handled yet. The loss
		// came first, and the guard's context says so.
		for i := range 20 {
			f := &fakeStore{mode: renewHang}
			g, err := fakeMutex(t, f).Lock(t.Context())
			require.NoError(t, err)
			ctx := g.Context()
			time.Sleep(time.Until(g.Deadline()))
			st, err := g.Release(t.Context())
			require.NoError(t, err)
			assert.Equal(t, Lost, st, "round %d", i)
			assert.ErrorIs(t, context.Cause(ctx), ErrLost, "round %d", i)
		}
	})
}
