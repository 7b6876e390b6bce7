package goredis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/goredis"
	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/redistest"
)

// The give-up test's bounds. go-redis is given timeouts and retries far
// longer than giveUpBound, so a Lock that waited for go-redis to give up
// could not pass.
const (
	lockCtxTimeout = 200 * time.Millisecond
	giveUpBound    = 2 * time.Second // after lockCtxTimeout, on a slow machine
	slowTimeout    = 20 * time.Second
)

// TestLockGivesUpOnContextWhileRedisUnreachable holds a lock elsewhere (so
// that Lock must wait), makes Redis unreachable, and checks that a Lock
// whose ctx ends after lockCtxTimeout returns with ctx's error within
// giveUpBound, although go-redis keeps trying far longer: Redis stopped
// (SIGSTOP: the command is sent and no reply ever comes, and go-redis
// waits its ReadTimeout), and the port closed (every connection reset and
// every dial refused: go-redis re-dials and retries with back-off). Then
// Redis comes back, the work left behind ends (distlock.Settle), and the
// lock is free for the next Lock.
func TestLockGivesUpOnContextWhileRedisUnreachable(t *testing.T) {
	faults := map[string]struct {
		cut, heal func(*redistest.Server, *faultproxy.Proxy)
	}{
		"stopped": {
			cut:  func(s *redistest.Server, _ *faultproxy.Proxy) { s.Pause() },
			heal: func(s *redistest.Server, _ *faultproxy.Proxy) { s.Resume() },
		},
		"port closed": {
			cut:  func(_ *redistest.Server, p *faultproxy.Proxy) { p.Refuse() },
			heal: func(_ *redistest.Server, p *faultproxy.Proxy) { p.Heal() },
		},
	}
	ends := map[string]func(context.Context) (context.Context, context.CancelFunc, error){
		"cancelled": func(ctx context.Context) (context.Context, context.CancelFunc, error) {
			ctx, cancel := context.WithCancel(ctx)
			t := time.AfterFunc(lockCtxTimeout, cancel)
			return ctx, func() { t.Stop(); cancel() }, context.Canceled
		},
		"deadline": func(ctx context.Context) (context.Context, context.CancelFunc, error) {
			ctx, cancel := context.WithTimeout(ctx, lockCtxTimeout)
			return ctx, cancel, context.DeadlineExceeded
		},
	}
	for fname, f := range faults {
		for ename, end := range ends {
			t.Run(fname+"/"+ename, func(t *testing.T) {
				srv := redistest.Start(t)
				proxy := faultproxy.New(t, srv.Addr())
				rdb := newClient(t, proxy.Addr(), &redis.Options{
					ReadTimeout:     slowTimeout,
					WriteTimeout:    slowTimeout,
					DialTimeout:     slowTimeout,
					MaxRetries:      10,
					MinRetryBackoff: time.Second,
					MaxRetryBackoff: 2 * time.Second,
				})
				holder := newClient(t, srv.Addr())
				name := "unreachable"
				hm, err := goredis.NewMutex(holder, name)
				require.NoError(t, err)
				hg, err := hm.TryLock(t.Context())
				require.NoError(t, err)

				m, err := goredis.NewMutex(rdb, name)
				require.NoError(t, err)
				// A first call, so that go-redis has a pooled connection.
				_, err = m.TryLock(t.Context())
				require.ErrorIs(t, err, distlock.ErrNotAcquired)

				f.cut(srv, proxy)
				healed := false
				heal := func() {
					if !healed {
						healed = true
						f.heal(srv, proxy)
					}
				}
				defer heal()
				ctx, cancel, want := end(t.Context())
				defer cancel()
				start := time.Now()
				g, err := m.Lock(ctx)
				took := time.Since(start)
				if g != nil {
					t.Fatal("Lock acquired while Redis was unreachable")
				}
				if !errors.Is(err, want) {
					t.Fatalf("Lock: err = %v, want one matching %v", err, want)
				}
				if took > lockCtxTimeout+giveUpBound {
					t.Errorf("Lock returned %v after it was called, want at most %v (its ctx ended after %v)", took, lockCtxTimeout+giveUpBound, lockCtxTimeout)
				}

				heal()
				sctx, scancel := context.WithTimeout(t.Context(), slowTimeout)
				defer scancel()
				require.NoError(t, distlock.Settle(sctx), "the work left behind ends once Redis is back")
				_, err = hg.Release(t.Context())
				require.NoError(t, err)
				lctx, lcancel := context.WithTimeout(t.Context(), callTimeout)
				defer lcancel()
				g, err = m.Lock(lctx)
				require.NoError(t, err, "the lock is free once Redis is back")
				_, err = g.Release(lctx)
				assert.NoError(t, err)
			})
		}
	}
}
