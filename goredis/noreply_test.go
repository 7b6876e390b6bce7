package goredis_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/goredis"
	"github.com/distkit-go/distlock/internal/redistest"
)

// TestTryLockBoundedWhenGoRedisWaitsLonger stops the server (SIGSTOP) and
// gives go-redis a ReadTimeout and retries far longer than the call's
// deadline: go-redis does not end a read at its context's deadline, so
// distlock waits for the deadline beside the call, and one TryLock still
// returns ErrNoReply at the lease deadline (TTL 2 s) or MaxReplyWait (TTL
// 30 s). The default timeouts are checked by the suite
// (TestSuiteMutex/TryLockAgainstStoppedRedis).
func TestTryLockBoundedWhenGoRedisWaitsLonger(t *testing.T) {
	const noReplySlack = time.Second // a loaded machine's lateness
	srv := redistest.Start(t)
	ttls := []time.Duration{2 * time.Second, 30 * time.Second}
	mutexes := make([]*distlock.Mutex, len(ttls))
	for i, ttl := range ttls {
		rdb := newClient(t, srv.Addr(), &redis.Options{ReadTimeout: slowTimeout, WriteTimeout: slowTimeout, MaxRetries: 10})
		m, err := goredis.NewMutex(rdb, "stopped:"+ttl.String(), distlock.WithTTL(ttl))
		require.NoError(t, err)
		g, err := m.TryLock(t.Context())
		require.NoError(t, err, "TryLock before the server stops")
		_, err = g.Release(t.Context())
		require.NoError(t, err)
		mutexes[i] = m
	}
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	took := make([]time.Duration, len(ttls))
	errs := make([]error, len(ttls))
	done := make(chan int, len(ttls))
	for i := range ttls {
		go func() {
			start := time.Now()
			_, errs[i] = mutexes[i].TryLock(context.Background())
			took[i] = time.Since(start)
			done <- i
		}()
	}
	for range ttls {
		<-done
	}
	srv.Resume()
	resumed = true
	for i, ttl := range ttls {
		t.Logf("TTL %v: TryLock returned after %v: %v", ttl, took[i].Round(time.Millisecond), errs[i])
		require.ErrorIs(t, errs[i], distlock.ErrNoReply, "TTL %v", ttl)
		assert.NotErrorIs(t, errs[i], context.DeadlineExceeded, "TTL %v: no deadline of the caller's passed", ttl)
		assert.Less(t, took[i], min(ttl, distlock.MaxReplyWait)+noReplySlack, "TTL %v: how long one attempt waited", ttl)
	}
	// The calls left behind end when go-redis has its reply.
	settle, cancel := context.WithTimeout(t.Context(), slowTimeout)
	defer cancel()
	require.NoError(t, distlock.Settle(settle))
}
