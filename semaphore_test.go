package distlock_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/distlocktest"
	"github.com/distkit-go/distlock/internal/suite"
)

// The Semaphore's tests against redis-server are client-independent and
// live in internal/suite (TestSuiteSemaphore). Here are the constructor's
// checks, and the Semaphore on distlocktest's in-process server.

// The Semaphore on distlocktest's in-process server (miniredis), which the
// examples use; on redis-server, TestSuiteSemaphore/BoundsHoldersAndTokensIncrease.
func TestSemaphoreBoundsHoldersAndTokensIncrease(t *testing.T) {
	srv := distlocktest.New(t)
	s, err := distlock.NewSemaphore(srv.Client(), "pool", 3, distlock.WithTTL(2*time.Second))
	require.NoError(t, err)
	suite.SemaphoreBounds(t, s)
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
