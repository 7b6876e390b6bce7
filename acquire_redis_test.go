package distlock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// noReplySlack is how much later than its bound an attempt against a
// stopped server may return on a loaded machine.
const noReplySlack = time.Second

// TestTryLockAgainstStoppedRedis stops the server (SIGSTOP: commands are
// sent and no reply ever comes) and checks that one TryLock, with a
// context that never ends, returns an error matching ErrNoReply, never the
// client's raw timeout, within its bound: the lease deadline for a short
// TTL, and MaxReplyWait (or rueidis's ConnWriteTimeout, as long by
// default) for a long one.
func TestTryLockAgainstStoppedRedis(t *testing.T) {
	srv := redistest.Start(t)
	ttls := []time.Duration{2 * time.Second, 10 * time.Second, 30 * time.Second}
	mutexes := make([]*distlock.Mutex, len(ttls))
	for i, ttl := range ttls {
		// A client each, connected before the server stops, so that one's
		// broken connection does not end another's call.
		c := srv.Client()
		mutexes[i] = newMutex(t, c, fmt.Sprintf("stopped:%v", ttl), distlock.WithTTL(ttl))
		g, err := mutexes[i].TryLock(t.Context())
		require.NoError(t, err, "TryLock before the server stops")
		_, err = g.Release(t.Context())
		require.NoError(t, err)
	}
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	type result struct {
		took time.Duration
		err  error
	}
	results := make([]result, len(ttls))
	var wg sync.WaitGroup
	for i := range ttls {
		wg.Go(func() {
			start := time.Now()
			g, err := mutexes[i].TryLock(context.Background())
			results[i] = result{time.Since(start), err}
			if g != nil {
				_, _ = g.Release(context.Background())
			}
		})
	}
	wg.Wait()
	// Once more on the short TTL: the attempt before may have left its
	// connection broken, and this one starts by making another.
	start := time.Now()
	_, err := mutexes[0].TryLock(context.Background())
	again := time.Since(start)
	// TryLockFor's timeout bounds the attempt in flight, and not the hold.
	const tryFor = 500 * time.Millisecond
	start = time.Now()
	_, forErr := mutexes[2].TryLockFor(context.Background(), tryFor, distlock.DefaultRetryInterval)
	forTook := time.Since(start)
	srv.Resume()
	resumed = true
	t.Logf("TTL %v, TryLockFor(%v): returned after %v: %v", ttls[2], tryFor, forTook.Round(time.Millisecond), forErr)
	require.ErrorIs(t, forErr, distlock.ErrTimeout, "TryLockFor against the stopped server")
	assert.Less(t, forTook, tryFor+noReplySlack, "TryLockFor's timeout did not bound the attempt")
	t.Logf("TTL %v, again: TryLock returned after %v: %v", ttls[0], again.Round(time.Millisecond), err)
	require.ErrorIs(t, err, distlock.ErrNoReply, "TTL %v, again", ttls[0])
	assert.Less(t, again, ttls[0]+noReplySlack, "TTL %v, again: how long one attempt waited", ttls[0])
	for i, ttl := range ttls {
		r := results[i]
		t.Logf("TTL %v: TryLock returned after %v: %v", ttl, r.took.Round(time.Millisecond), r.err)
		require.ErrorIs(t, r.err, distlock.ErrNoReply, "TTL %v", ttl)
		assert.NotErrorIs(t, r.err, context.DeadlineExceeded, "TTL %v: no deadline of the caller's passed", ttl)
		bound := min(ttl, distlock.MaxReplyWait)
		assert.Less(t, r.took, bound+noReplySlack, "TTL %v: how long one attempt waited", ttl)
		assert.Greater(t, r.took, bound/2, "TTL %v: the attempt returned before waiting for a reply", ttl)
	}
	// What the attempts may have written is cancelled in the background
	// once the server answers again.
	settle, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, distlock.Settle(settle))
}

// A lock's key set by hand without an expiry would never free itself:
// TryLock and Lock refuse it at once with ErrWrongKind (a
// *WrongKindError), rather than reporting it held (TryLock) or waiting
// forever (Lock), and leave it as it is. Set with an expiry, it is a
// holder like any other, which Lock waits out.
func TestLockRefusesKeyWithoutExpiry(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	m := newMutex(t, c, "manual")
	srv.MustDo("SET", m.Key(), "an operator")

	_, err := m.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrWrongKind, "TryLock on a key without expiry")
	assert.NotErrorIs(t, err, distlock.ErrNotAcquired)
	var wk *distlock.WrongKindError
	require.ErrorAs(t, err, &wk)
	assert.Equal(t, m.Key(), wk.Key)
	assert.Equal(t, "lock", wk.Want)
	assert.Contains(t, err.Error(), "without expiry")

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = m.Lock(ctx)
	require.ErrorIs(t, err, distlock.ErrWrongKind, "Lock on a key without expiry")
	assert.NoError(t, ctx.Err(), "Lock waited for its context to end")
	got, err := srv.MustDo("GET", m.Key()).ToString()
	require.NoError(t, err)
	assert.Equal(t, "an operator", got, "the key was changed")

	// With an expiry the same value is an ordinary holder.
	srv.MustDo("PEXPIRE", m.Key(), "300")
	_, err = m.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "TryLock on a key with an expiry")
	g, err := m.Lock(ctx)
	require.NoError(t, err, "Lock once the key has expired")
	_, err = g.Release(t.Context())
	require.NoError(t, err)
	require.NoError(t, distlock.Settle(ctx))
}
