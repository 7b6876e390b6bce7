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

// shardSubscribers returns how many connections listen on the sharded
// channel.
func shardSubscribers(t *testing.T, srv *redistest.Server, channel string) int64 {
	t.Helper()
	arr, err := srv.MustDo("PUBSUB", "SHARDNUMSUB", channel).ToArray()
	require.NoError(t, err)
	require.Len(t, arr, 2)
	n, err := arr[1].ToInt64()
	require.NoError(t, err)
	return n
}

func TestWaiterWakesOnReleaseElsewhere(t *testing.T) {
	srv := redistest.Start(t)
	// Two clients stand for two processes: the waiter can only learn of the
	// release through Redis.
	holder := newMutex(t, srv.Client(), "res", distlock.WithTTL(30*time.Second))
	waiter := newMutex(t, srv.Client(), "res", distlock.WithTTL(30*time.Second))
	g, err := holder.Lock(t.Context())
	require.NoError(t, err)

	type result struct {
		g   *distlock.Guard
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		g, err := waiter.Lock(t.Context())
		done <- result{g, err, time.Now()}
	}()
	channel := "distlock:{res}:released"
	require.Eventually(t, func() bool { return shardSubscribers(t, srv, channel) == 1 },
		eventually, pollEvery, "the waiter never subscribed")

	released := time.Now()
	release(t, g)
	r := <-done
	require.NoError(t, r.err)
	// The holder's lease had ~30 s left, so nothing but the announcement can
	// have woken the waiter this soon.
	assert.Less(t, r.at.Sub(released), 2*time.Second, "hand-off took %v", r.at.Sub(released))
	assert.LessOrEqual(t, r.g.Attempt(), 2, "arrival, head, then the attempt after the release")
	release(t, r.g)

	// Once idle, the queue unsubscribes.
	require.Eventually(t, func() bool { return shardSubscribers(t, srv, channel) == 0 },
		eventually, pollEvery, "subscription left behind")
}

func TestWaiterTakesCrashedHoldersLeaseAtExpiry(t *testing.T) {
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "res")
	const ttl = 700 * time.Millisecond
	// A holder that died without releasing: its value, with a TTL, and no
	// announcement ever.
	srv.MustDo("SET", m.Key(), "crashed#1", "PX", "700")
	written := time.Now()
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	late := time.Since(written) - ttl
	t.Logf("acquired %v after the crashed holder's lease expired", late)
	assert.GreaterOrEqual(t, late, -5*time.Millisecond, "acquired before the lease expired")
	assert.Less(t, late, 300*time.Millisecond, "took too long after expiry")
	assert.LessOrEqual(t, g.Attempt(), 3)
	release(t, g)
}

func TestCancelledWaiterLeavesNoSubscription(t *testing.T) {
	srv := redistest.Start(t)
	holder := newMutex(t, srv.Client(), "res")
	g, err := holder.Lock(t.Context())
	require.NoError(t, err)
	defer release(t, g)

	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := newMutex(t, srv.Client(), "res").Lock(ctx)
		errc <- err
	}()
	channel := "distlock:{res}:released"
	require.Eventually(t, func() bool { return shardSubscribers(t, srv, channel) == 1 },
		eventually, pollEvery)
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	require.Eventually(t, func() bool { return shardSubscribers(t, srv, channel) == 0 },
		eventually, pollEvery, "subscription left behind by a cancelled waiter")
}

func TestWaiterSurvivesSubscriptionLoss(t *testing.T) {
	srv := redistest.Start(t)
	holder := newMutex(t, srv.Client(), "res", distlock.WithTTL(30*time.Second))
	g, err := holder.Lock(t.Context())
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		g, err := newMutex(t, srv.Client(), "res").Lock(t.Context())
		if err == nil {
			_, err = g.Release(t.Context())
		}
		done <- err
	}()
	channel := "distlock:{res}:released"
	require.Eventually(t, func() bool { return shardSubscribers(t, srv, channel) == 1 },
		eventually, pollEvery)
	// Cut the waiter's connection: its subscription is gone, and the
	// announcement of the release below would be lost if it did not
	// subscribe again.
	killed, err := srv.MustDo("CLIENT", "KILL", "TYPE", "pubsub").ToInt64()
	require.NoError(t, err)
	require.Positive(t, killed, "no subscribed connection was found to kill")
	require.Eventually(t, func() bool { return shardSubscribers(t, srv, channel) == 1 },
		eventually, pollEvery, "the waiter never subscribed again")

	released := time.Now()
	release(t, g)
	select {
	case err := <-done:
		require.NoError(t, err)
		assert.Less(t, time.Since(released), 2*time.Second, "the holder's lease had 30 s left: only the announcement can explain this")
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never acquired the lock")
	}
}
