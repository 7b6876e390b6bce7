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
