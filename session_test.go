package distlock

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// stuckSubStore is a fakeStore whose subscriptions are never confirmed and
// return only once stuck is closed, whatever their context says: a client
// whose subscribe, and unsubscribe, hang on a dead connection.
type stuckSubStore struct {
	*fakeStore
	stuck chan struct{}
}

func (s stuckSubStore) Subscribe(ctx context.Context, k lease.Keys, room string, ready func(), granted func(string, int64)) error {
	<-s.stuck
	return ctx.Err()
}

// TestReleaseDoesNotWaitForTheSession checks that a Release is bounded by
// its context on every path while its client's session cannot stop (its
// restart watch's subscription hangs): a young guard's Release, which
// ends the guard on the caller's goroutine, and the Release of a guard
// with an actor, which reaches the actor as it exits, both return at once.
// The session leaves the registry when its linger has passed, and only
// its stop, which Settle waits for, waits for the hanging subscription.
func TestReleaseDoesNotWaitForTheSession(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := stuckSubStore{fakeStore: &fakeStore{}, stuck: make(chan struct{})}
		m := fakeMutex(t, s.fakeStore)
		m.e.client, m.e.store = s, s
		release := func(g *Guard, what string) {
			t.Helper()
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			start := time.Now()
			st, err := g.Release(ctx)
			require.NoError(t, err, what)
			assert.Equal(t, Released, st, what)
			assert.Zero(t, time.Since(start), "%s waited", what)
		}

		young, err := m.Lock(t.Context())
		require.NoError(t, err)
		require.False(t, young.hasActor())
		release(young, "the young guard's Release")

		g, err := m.Lock(t.Context())
		require.NoError(t, err)
		time.Sleep(fakeTTL / 3)
		synctest.Wait()
		require.True(t, g.hasActor(), "the guard past its first renewal")
		release(g, "the Release that reaches the exiting actor")
		synctest.Wait()
		assert.Zero(t, actorsRunning(), "actors after the Release")

		time.Sleep(keeperLinger)
		synctest.Wait()
		assert.Zero(t, proc.sessions.len(), "sessions after the linger")
		sctx, scancel := context.WithTimeout(t.Context(), 2*keeperSettle)
		defer scancel()
		assert.ErrorIs(t, Settle(sctx), context.DeadlineExceeded, "Settle while the session's subscription hangs")
		close(s.stuck)
		require.NoError(t, Settle(t.Context()))
	})
}

// rueidisIdentity is a client identity that is a rueidis.Client, so that
// the keepers of a fake store's locks subscribe late, as on rueidis. Its
// methods are never called: distlock only compares client identities.
type rueidisIdentity struct{ rueidis.Client }

// countingSubStore is a fakeStore that counts the subscriptions asked
// for, and the keeper's probes (which it also records as renewals).
type countingSubStore struct {
	*fakeStore
	subs, probes *atomic.Int64
}

func (s countingSubStore) Subscribe(ctx context.Context, k lease.Keys, room string, ready func(), granted func(string, int64)) error {
	s.subs.Add(1)
	return s.fakeStore.Subscribe(ctx, k, room, ready, granted)
}

func (s countingSubStore) Renew(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Renewal, error) {
	if value == probeValue {
		s.probes.Add(1)
	}
	return s.fakeStore.Renew(ctx, k, value, ttl)
}

// lateWatchMutex returns a Mutex of a fake store whose client is a
// rueidis client, with the store's counts.
func lateWatchMutex(t *testing.T) (*Mutex, countingSubStore) {
	s := countingSubStore{fakeStore: &fakeStore{}, subs: new(atomic.Int64), probes: new(atomic.Int64)}
	m := fakeMutex(t, s.fakeStore)
	m.e.client, m.e.store = &rueidisIdentity{}, s
	return m, s
}

// TestShortHoldsDoNotSubscribe checks that on rueidis the restart watch
// subscribes only once a guard has lived keeperDelay: locks taken and
// released one after the other within that, for several times
// keeperDelay in all, make no subscription; a guard held for keeperDelay
// makes one at that moment, and at its first confirmation the guard
// renews (a restart before it would have gone unheard). Before the watch
// waited, the first Lock subscribed.
func TestShortHoldsDoNotSubscribe(t *testing.T) {
	bubble(t, func(t *testing.T) {
		m, s := lateWatchMutex(t)
		for range 50 {
			g, err := m.Lock(t.Context())
			require.NoError(t, err)
			time.Sleep(keeperDelay / 10)
			_, err = g.Release(t.Context())
			require.NoError(t, err)
		}
		synctest.Wait()
		assert.Zero(t, s.subs.Load(), "subscriptions after %v of short holds", 5*keeperDelay)

		g, err := m.Lock(t.Context())
		require.NoError(t, err)
		time.Sleep(keeperDelay - time.Nanosecond)
		synctest.Wait()
		assert.Zero(t, s.subs.Load(), "subscriptions before the guard lived keeperDelay")
		assert.Empty(t, s.renewCalls(), "renewals before the subscription")
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		assert.EqualValues(t, 1, s.subs.Load(), "subscriptions once the guard lived keeperDelay")
		// The keeper's probe (see keeper.answered) asks once too.
		assert.EqualValues(t, 1, s.probes.Load(), "probes at the subscription's first confirmation")
		assert.Len(t, s.renewCalls(), 2, "renewals (the guard's and the probe's) at the subscription's first confirmation")
		assert.Equal(t, Acquired, g.State())
		_, err = g.Release(t.Context())
		require.NoError(t, err)
		time.Sleep(keeperLinger)
		synctest.Wait()
		assert.Zero(t, proc.sessions.len(), "sessions after the linger")
	})
}

// TestLateWatchNoticesAnEarlierRestart has the server forget a young
// guard's lease before its keeper subscribed (a restart then breaks no
// subscription): the guard renews at the subscription's first
// confirmation, keeperDelay after its acquisition, and is Lost then, not
// at its first scheduled renewal a third of the TTL in. Without the
// renewal at the first confirmation it was Lost at fakeTTL/3.
func TestLateWatchNoticesAnEarlierRestart(t *testing.T) {
	bubble(t, func(t *testing.T) {
		m, s := lateWatchMutex(t)
		g, err := m.Lock(t.Context())
		require.NoError(t, err)
		locked := time.Now()
		s.set(renewRefuse) // the server forgot the lease
		<-g.Context().Done()
		assert.Equal(t, keeperDelay, time.Since(locked), "the guard Lost after its acquisition")
		assert.Equal(t, Lost, g.State())
		assert.EqualValues(t, 1, s.subs.Load())
		_, err = g.Release(t.Context())
		require.NoError(t, err)
	})
}
