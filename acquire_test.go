package distlock

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// One attempt waits for its reply no longer than MaxReplyWait, however
// long the TTL: TryLock on an hour's lease against a store that never
// answers returns ErrNoReply after MaxReplyWait, not after the hour.
func TestTryLockWaitsAtMostMaxReplyWait(t *testing.T) {
	bubble(t, func(t *testing.T) {
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
	bubble(t, func(t *testing.T) {
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
	bubble(t, func(t *testing.T) {
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

// A nil *Guard, as a failed Lock returns it, is safe to use: a "defer
// g.Release(ctx)" written before the error check returns an error that
// says so instead of panicking, and the other methods report that it holds
// nothing.
func TestNilGuard(t *testing.T) {
	var g *Guard
	ctx := context.Background()
	st, err := g.Release(ctx)
	require.ErrorIs(t, err, ErrInvalidArgument, "Release of a nil guard")
	var ae *ArgumentError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, "guard", ae.Arg)
	assert.Equal(t, State(0), st)
	st, err = g.Leave(ctx)
	require.ErrorIs(t, err, ErrInvalidArgument, "Leave of a nil guard")
	assert.Equal(t, State(0), st)
	assert.Equal(t, State(0), g.State())
	assert.True(t, g.Deadline().IsZero(), "Deadline of a nil guard")
	assert.Empty(t, g.Key())
	assert.Zero(t, g.Token())
	assert.Zero(t, g.Attempt())
	assert.Zero(t, g.TokenOf("job"))
	require.ErrorIs(t, g.Downgrade(ctx), ErrInvalidArgument, "Downgrade of a nil guard")
	select {
	case <-g.Done():
	default:
		t.Fatal("Done of a nil guard is not closed")
	}
	gctx := g.Context()
	require.Error(t, gctx.Err(), "Context of a nil guard")
	assert.ErrorIs(t, context.Cause(gctx), ErrInvalidArgument)
	var events []Event
	for ev := range g.Subscribe(ctx) {
		events = append(events, ev)
	}
	require.Len(t, events, 1, "events of a nil guard")
	assert.ErrorIs(t, events[0].Err, ErrInvalidArgument)
}

// Subscribe with a nil ctx refuses it as Release does: one event whose Err
// matches ErrInvalidArgument, then the channel closes; the guard is
// unchanged.
func TestSubscribeNilContext(t *testing.T) {
	bubble(t, func(t *testing.T) {
		g, err := fakeMutex(t, &fakeStore{}).TryLock(context.Background())
		require.NoError(t, err)
		var events []Event
		//lint:ignore SA1012 a nil ctx is what is tested
		for ev := range g.Subscribe(nil) {
			events = append(events, ev)
		}
		require.Len(t, events, 1, "events of a subscription with a nil ctx")
		assert.ErrorIs(t, events[0].Err, ErrInvalidArgument)
		assert.Equal(t, Acquired, events[0].State)
		assert.Equal(t, Acquired, g.State(), "the guard after the refused subscription")
		st, err := g.Release(context.Background())
		require.NoError(t, err)
		assert.Equal(t, Released, st)
		Settle(context.Background())
	})
}

// Settle with a nil ctx is refused as Lock refuses it.
func TestSettleNilContext(t *testing.T) {
	//lint:ignore SA1012 a nil ctx is what is tested
	err := Settle(nil)
	require.ErrorIs(t, err, ErrInvalidArgument)
}

// With a client that does not end a call at its context's deadline (as
// go-redis waits for its ReadTimeout), TryLock still returns at the call's
// deadline, with ErrNoReply, and leaves the call to end in the background.
func TestNoReplyFromClientThatIgnoresDeadlines(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const clientTimeout = time.Minute // far past the call's deadline
		f := &fakeStore{ignoresDeadlines: true}
		f.acquireFn = func(context.Context) error {
			time.Sleep(clientTimeout)
			return &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
		}
		start := time.Now()
		_, err := fakeMutex(t, f).TryLock(context.Background())
		require.ErrorIs(t, err, ErrNoReply)
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "no deadline of the caller's passed")
		assert.Equal(t, fakeTTL-margin(fakeTTL), time.Since(start), "how long TryLock waited")
		require.NoError(t, Settle(context.Background()))
		assert.Equal(t, clientTimeout, time.Since(start), "when the call left behind ended")
	})
}

// A grant whose reply comes too late to trust still holds the caller's
// value in Redis. When the call that should have renewed it fails instead
// (Redis answers with an error), TryLock gives up, and it must cancel that
// lease on its way out, not leave it to block the lock for a whole TTL.
func TestLateGrantIsCancelledWhenTheNextCallFails(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		calls := 0
		f.acquireFn = func(context.Context) error {
			f.mu.Lock()
			calls++
			n := calls
			f.mu.Unlock()
			if n == 1 {
				// The grant is made, but its reply comes at the lease's
				// deadline counted from the send: too late to use.
				time.Sleep(fakeTTL - margin(fakeTTL))
				return nil
			}
			return lease.NewReplyError("ERR something went wrong", nil)
		}
		_, err := fakeMutex(t, f).TryLock(context.Background())
		require.Error(t, err)
		assert.True(t, lease.IsReply(err), "the second call's error is reported: %v", err)
		require.NoError(t, Settle(context.Background()))
		f.mu.Lock()
		defer f.mu.Unlock()
		assert.Equal(t, 2, calls)
		assert.Empty(t, f.holder, "the late grant's lease was left in Redis")
		assert.Len(t, f.voided, 1, "the late grant's value was not cancelled")
	})
}
