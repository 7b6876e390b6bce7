package distlocktest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
)

// An RWMutex works on both servers, and ForceLoss deletes its holders'
// hash: every reader (or the writer) is Lost at its next renewal, and the
// lock is free.
func TestForceLossRWMutex(t *testing.T) {
	modes(t, func(t *testing.T, opts ...Option) {
		s := New(t, opts...)
		rw, err := distlock.NewRWMutex(s.Client(), "config", distlock.WithTTL(testTTL))
		require.NoError(t, err)
		var guards []*distlock.Guard
		var events []<-chan distlock.Event
		for range 2 {
			g, err := rw.RLock(t.Context())
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = g.Release(context.Background()) })
			guards = append(guards, g)
			events = append(events, g.Subscribe(t.Context()))
		}
		_, err = rw.TryLock(t.Context())
		require.ErrorIs(t, err, distlock.ErrNotAcquired, "a writer while two read")
		err = s.OverwriteLease(rw.Key(), "intruder")
		require.ErrorContains(t, err, "read-write lock", "OverwriteLease of a read-write lock's hash")
		assert.NotErrorIs(t, err, ErrNoLease)
		require.NoError(t, s.ForceLoss(rw))
		for i, g := range guards {
			waitRefused(t, events[i])
			assert.Equal(t, distlock.Lost, g.State(), "state of reader %d", i)
		}
		w, err := rw.TryLock(t.Context())
		require.NoError(t, err, "TryLock after ForceLoss")
		assert.Greater(t, w.Token(), guards[1].Token())
		require.NoError(t, w.Downgrade(t.Context()))
		r, err := rw.TryRLock(t.Context())
		require.NoError(t, err, "a reader beside the downgraded writer")
		for _, g := range []*distlock.Guard{w, r} {
			st, err := g.Release(t.Context())
			require.NoError(t, err)
			assert.Equal(t, distlock.Released, st)
		}
	})
}
