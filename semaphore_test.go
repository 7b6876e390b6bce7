package distlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/distlocktest"
)

// The Semaphore's tests against redis-server are client-independent and
// live in internal/suite (TestSuiteSemaphore). Here are the constructor's
// checks, and the Semaphore on distlocktest's in-process server.

// The Semaphore on distlocktest's in-process server (miniredis), which the
// examples use; on redis-server, TestSuiteSemaphore/BoundsHoldersAndTokensIncrease.
func TestSemaphoreBoundsHoldersAndTokensIncrease(t *testing.T) {
	srv := distlocktest.New(t)
	ctx := context.Background()
	s, err := distlock.NewSemaphore(srv.Client(), "pool", 3, distlock.WithTTL(2*time.Second))
	require.NoError(t, err)
	var guards []*distlock.Guard
	var last int64
	for range 3 {
		g, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		require.Greater(t, g.Token(), last)
		last = g.Token()
		guards = append(guards, g)
	}
	_, err = s.TryAcquire(ctx)
	var nae *distlock.NotAcquiredError
	require.ErrorAs(t, err, &nae)
	assert.Equal(t, 3, nae.Permits)
	assert.ErrorIs(t, err, distlock.ErrNotAcquired)
	t.Log(err)

	st, err := guards[1].Release(ctx)
	require.NoError(t, err)
	assert.Equal(t, distlock.Released, st)
	g, err := s.TryAcquire(ctx)
	require.NoError(t, err)
	assert.Greater(t, g.Token(), last)
	guards[1] = g
	for _, g := range guards {
		_, err := g.Release(ctx)
		require.NoError(t, err)
	}
}

func TestNewSemaphoreRefusesBadPermits(t *testing.T) {
	srv := distlocktest.New(t)
	for _, n := range []int{0, -1, distlock.MaxPermits + 1} {
		_, err := distlock.NewSemaphore(srv.Client(), "pool", n)
		var oe *distlock.OptionError
		require.ErrorAs(t, err, &oe, "permits %d", n)
		assert.Equal(t, "permits", oe.Field)
		assert.ErrorIs(t, err, distlock.ErrInvalidOption)
	}
	_, err := distlock.NewSemaphore(nil, "pool", 1)
	assert.ErrorIs(t, err, distlock.ErrInvalidOption)
	_, err = distlock.NewSemaphore(srv.Client(), "a{b}", 1)
	assert.ErrorIs(t, err, distlock.ErrInvalidOption)
}
