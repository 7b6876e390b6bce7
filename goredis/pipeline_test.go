package goredis_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/goredis"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/internal/suite"
)

// Scripts sent while others are in flight go through go-redis's automatic
// pipeliner; they must behave as the plain calls do: every lock granted
// once at a time, tokens increasing, the NOSCRIPT fallback working inside
// a batch, and nothing left in Redis.
func TestConcurrentScriptsThroughThePipeliner(t *testing.T) {
	srv := redistest.Start(t)
	rdb := newClient(t, srv.Addr())
	const workers, rounds = 32, 20
	before := goredis.PipelinedEvals()
	srv.MustDo("SCRIPT", "FLUSH") // the first batches meet NOSCRIPT
	ctx := ctxFor(t, time.Minute)
	probe := suite.StartSchedProbe(t)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			key := fmt.Sprintf("pipelined-%d", w%8) // 4 workers on each key
			var last int64
			for range rounds {
				m, err := goredis.NewMutex(rdb, key, distlock.WithTTL(10*time.Second))
				if err != nil {
					errs <- err
					return
				}
				g, err := m.Lock(ctx)
				if err != nil {
					errs <- fmt.Errorf("lock %s: %w", key, err)
					return
				}
				if g.Token() <= last {
					errs <- fmt.Errorf("%s: token %d after %d", key, g.Token(), last)
				}
				last = g.Token()
				left, start := time.Until(g.Deadline()), time.Now()
				st, err := g.Release(context.WithoutCancel(ctx))
				if err == nil && st == distlock.Lost {
					// A lease passed to a waiter lasts its claim window
					// until renewed: a process kept from running for longer
					// than it had left loses it before its release (no
					// breach; the tokens are still checked).
					if late := probe.Delay(start, time.Now()); late >= left {
						t.Logf("release %s: Lost, with %v of the lease left and a scheduling delay of %v meanwhile: the machine's doing",
							key, left.Round(time.Millisecond), late.Round(time.Millisecond))
						continue
					}
				}
				if err != nil || st != distlock.Released {
					errs <- fmt.Errorf("release %s: %v, %v, with %v of the lease left when Release began", key, st, err, left.Round(time.Millisecond))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Greater(t, goredis.PipelinedEvals()-before, int64(workers),
		"with %d workers in flight, scripts should go through the pipeliner", workers)
	assert.Positive(t, cmdStat(t, srv, "eval", "calls"), "NOSCRIPT was answered with EVAL")
	require.NoError(t, distlock.Settle(ctx))
	for k := range 8 {
		key := fmt.Sprintf("distlock:{pipelined-%d}", k)
		n, err := srv.MustDo("EXISTS", key, key+":queue").ToInt64()
		require.NoError(t, err)
		assert.Zero(t, n, "%s: lease or line left behind", key)
	}
}
