package distlock

import (
	"context"
	"net"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One attempt waits for its reply no longer than MaxReplyWait, however
// long the TTL: TryLock on an hour's lease against a store that never
// answers returns ErrNoReply after MaxReplyWait, not after the hour.
func TestTryLockWaitsAtMostMaxReplyWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{}
		f.acquireFn = func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		}
		start := time.Now()
		_, err := fakeMutex(t, f, WithTTL(time.Hour)).TryLock(context.Background())
		require.ErrorIs(t, err, ErrNoReply)
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "no deadline of the caller's passed")
		assert.Equal(t, MaxReplyWait, time.Since(start), "how long TryLock waited")
		var nr *NoReplyError
		require.ErrorAs(t, err, &nr)
		assert.Equal(t, MaxReplyWait, nr.After)
		assert.NoError(t, nr.Err, "distlock's deadline ended the call, not the client's")
		Settle(context.Background())
	})
}

// A client that gives up by a timeout of its own (rueidis's
// ConnWriteTimeout, go-redis's ReadTimeout: "read tcp ...: i/o timeout")
// before distlock's deadline for the call has got no reply either:
// TryLock reports ErrNoReply, which unwraps to the client's error, and a
// Lock asks again.
func TestClientTimeoutIsNoReply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const clientTimeout = time.Second
		f := &fakeStore{}
		timeouts := 1
		f.acquireFn = func(ctx context.Context) error {
			f.mu.Lock()
			fail := timeouts > 0
			timeouts--
			f.mu.Unlock()
			if !fail {
				return nil
			}
			time.Sleep(clientTimeout)
			return &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
		}
		_, err := fakeMutex(t, f).TryLock(context.Background())
		require.ErrorIs(t, err, ErrNoReply)
		assert.ErrorIs(t, err, os.ErrDeadlineExceeded, "the client's error is kept")
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "no deadline of the caller's passed")
		var nr *NoReplyError
		require.ErrorAs(t, err, &nr)
		assert.Equal(t, clientTimeout, nr.After)

		f.mu.Lock()
		timeouts = 1
		f.mu.Unlock()
		g, err := fakeMutex(t, f).Lock(context.Background())
		require.NoError(t, err, "Lock after an attempt that timed out in the client")
		assert.Equal(t, 1, g.Attempt(), "attempts before the one that acquired")
		_, err = g.Release(context.Background())
		require.NoError(t, err)
		time.Sleep(roomLinger) // the Lock's waiting room closes (fake time)
		Settle(context.Background())
	})
}

// A client's timeout that comes once the caller's deadline has passed is
// the caller's: Lock reports ctx's error, not ErrNoReply.
func TestClientTimeoutAtCallersDeadlineIsCallers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const callerWait = time.Second
		f := &fakeStore{}
		f.acquireFn = func(ctx context.Context) error {
			time.Sleep(callerWait)
			return &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
		}
		ctx, cancel := context.WithTimeout(context.Background(), callerWait)
		defer cancel()
		_, err := fakeMutex(t, f).TryLock(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.NotErrorIs(t, err, ErrNoReply)
		Settle(context.Background())
	})
}
