package distlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// The RWMutex's tests against redis-server (sharing, exclusion, arrival
// order, per-reader leases, Downgrade, the refusals of other kinds, quiet
// waiting) are client-independent and live in internal/suite
// (TestSuiteRWMutex); here is what concerns the constructor and the zero
// value alone.

func TestRWMutexZeroAndBadInput(t *testing.T) {
	var rw distlock.RWMutex
	for _, f := range []func(context.Context) (*distlock.Guard, error){rw.RLock, rw.Lock, rw.TryRLock, rw.TryLock} {
		_, err := f(context.Background())
		assert.ErrorIs(t, err, distlock.ErrInvalidOption)
	}
	_, err := rw.TryLockFor(context.Background(), time.Second, 0)
	assert.ErrorIs(t, err, distlock.ErrInvalidOption)
	_, err = distlock.NewRWMutex(nil, "k")
	assert.ErrorIs(t, err, distlock.ErrInvalidOption)
	srv := redistest.Start(t)
	_, err = distlock.NewRWMutex(srv.Client(), "{bad}")
	assert.ErrorIs(t, err, distlock.ErrInvalidOption)
	good, err := distlock.NewRWMutex(srv.Client(), "k")
	require.NoError(t, err)
	//lint:ignore SA1012 a nil context on purpose
	_, err = good.RLock(nil)
	assert.ErrorIs(t, err, distlock.ErrInvalidArgument)
	_, err = good.TryRLockFor(t.Context(), -time.Second, 0)
	assert.ErrorIs(t, err, distlock.ErrInvalidOption)
	n, err := srv.MustDo("DBSIZE").ToInt64()
	require.NoError(t, err)
	assert.Zero(t, n, "keys written for bad input")
}
