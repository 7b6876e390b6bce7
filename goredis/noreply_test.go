package goredis_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/goredis"
	"github.com/distkit-go/distlock/internal/redistest"
)

// noReplySlack is how much later than its bound an attempt against a
// stopped server may return on a loaded machine.
const noReplySlack = time.Second

// TestTryLockAgainstStoppedRedis stops the server (SIGSTOP) and checks that
// one TryLock on a go-redis client, with a context that never ends,
// returns an error matching ErrNoReply, never go-redis's raw "i/o
// timeout", within MaxReplyWait (or the lease deadline, for a short TTL):
// with go-redis's default timeouts (a ReadTimeout of 3 s, retried), and
// with timeouts and retries far longer than the bound.
func TestTryLockAgainstStoppedRedis(t *testing.T) {
	srv := redistest.Start(t)
	type tryCase struct {
		name string
		opt  *redis.Options
		ttl  time.Duration
	}
	slow := func() *redis.Options {
		return &redis.Options{ReadTimeout: slowTimeout, WriteTimeout: slowTimeout, MaxRetries: 10}
	}
	cases := []tryCase{
		{"defaults/ttl2s", &redis.Options{}, 2 * time.Second},
		{"defaults/ttl30s", &redis.Options{}, 30 * time.Second},
		{"slow/ttl2s", slow(), 2 * time.Second},
		{"slow/ttl30s", slow(), 30 * time.Second},
	}
	mutexes := make([]*distlock.Mutex, len(cases))
	for i, c := range cases {
		rdb := newClient(t, srv.Addr(), c.opt)
		m, err := goredis.NewMutex(rdb, fmt.Sprintf("stopped:%d", i), distlock.WithTTL(c.ttl))
		require.NoError(t, err)
		g, err := m.TryLock(t.Context())
		require.NoError(t, err, "%s: TryLock before the server stops", c.name)
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
	type result struct {
		took time.Duration
		err  error
	}
	results := make([]result, len(cases))
	var wg sync.WaitGroup
	for i := range cases {
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
	srv.Resume()
	resumed = true
	for i, c := range cases {
		r := results[i]
		t.Logf("%s: TryLock returned after %v: %v", c.name, r.took.Round(time.Millisecond), r.err)
		require.ErrorIs(t, r.err, distlock.ErrNoReply, c.name)
		assert.NotErrorIs(t, r.err, context.DeadlineExceeded, "%s: no deadline of the caller's passed", c.name)
		assert.Less(t, r.took, min(c.ttl, distlock.MaxReplyWait)+noReplySlack, "%s: how long one attempt waited", c.name)
	}
	settle, cancel := context.WithTimeout(t.Context(), slowTimeout)
	defer cancel()
	require.NoError(t, distlock.Settle(settle))
}
