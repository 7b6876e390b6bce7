package distlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/distlocktest"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Tests of the Semaphore against a real redis-server; a client stands for a
// process.

func TestSemaphoreBoundsHoldersAndTokensIncrease(t *testing.T) {
	for _, real := range []bool{true, false} {
		name := "in-process"
		if real {
			name = "redis-server"
		}
		t.Run(name, func(t *testing.T) {
			var srv *distlocktest.Server
			if real {
				srv = distlocktest.New(t, distlocktest.WithRealRedis())
			} else {
				srv = distlocktest.New(t)
			}
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
		})
	}
}

func TestSemaphoreFIFOAcrossClients(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	const permits = 2
	newSem := func() *distlock.Semaphore {
		s, err := distlock.NewSemaphore(redistest.NewClient(t, srv.ClientOption()), "fifo", permits, distlock.WithTTL(longTTL))
		require.NoError(t, err)
		return s
	}
	holder := newSem()
	var held []*distlock.Guard
	for range permits {
		g, err := holder.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, g)
	}
	// Four waiters in four clients, in order.
	type res struct {
		i int
		g *distlock.Guard
	}
	got := make(chan res, 4)
	var wg sync.WaitGroup
	for i := range 4 {
		s := newSem()
		wg.Go(func() {
			g, err := s.Acquire(ctx)
			if assert.NoError(t, err) {
				got <- res{i, g}
			}
		})
		waitQueueLen(t, srv, "distlock:{fifo}:queue", int64(i+1))
	}
	for _, g := range held {
		_, err := g.Release(ctx)
		require.NoError(t, err)
	}
	var order []int
	var last int64
	take := func() *distlock.Guard {
		r := <-got
		order = append(order, r.i)
		assert.Greater(t, r.g.Token(), last)
		last = r.g.Token()
		return r.g
	}
	a, b := take(), take()
	assert.ElementsMatch(t, []int{0, 1}, order, "the two oldest waiters get the two freed permits")
	select {
	case r := <-got:
		t.Fatalf("waiter %d got a third permit", r.i)
	case <-time.After(100 * time.Millisecond):
	}
	for _, g := range []*distlock.Guard{a, b} {
		_, err := g.Release(ctx)
		require.NoError(t, err)
	}
	c, d := take(), take()
	assert.Equal(t, []int{0, 1, 2, 3}, append(sortPair(order[:2]), sortPair(order[2:])...))
	c.Release(ctx)
	d.Release(ctx)
	wg.Wait()
}

func sortPair(p []int) []int {
	if p[0] > p[1] {
		return []int{p[1], p[0]}
	}
	return []int{p[0], p[1]}
}

// waitQueueLen waits until the line at key has n waiters.
func waitQueueLen(t *testing.T, srv *redistest.Server, key string, n int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		v, err := srv.MustDo("ZCARD", key).AsInt64()
		return err == nil && v == n
	}, 5*time.Second, 2*time.Millisecond)
}

var _ = errors.Is
var _ atomic.Int64
var _ rueidis.Client
