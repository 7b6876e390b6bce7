package lease_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// BenchmarkProtocolFloor alternates the lease protocol's acquire + release
// scripts with a bare SET NX PX + DEL pair through the same client: the
// fastest any lock built on these scripts can be, as a ratio to the bare
// pair.
func BenchmarkProtocolFloor(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client()
	lc := lease.New(c)
	ctx := context.Background()
	k, err := lease.NewKeys("bench", "floor")
	if err != nil {
		b.Fatal(err)
	}
	value := lease.NewValue("bench")
	var bare, scripts time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := c.Do(ctx, c.B().Set().Key("bare").Value("v").Nx().Px(30*time.Second).Build()).Error(); err != nil {
			b.Fatal(err)
		}
		if err := c.Do(ctx, c.B().Del().Key("bare").Build()).Error(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if g, err := lc.Acquire(ctx, k, value, 30*time.Second); err != nil || !g.Acquired {
			b.Fatal(g, err)
		}
		if ok, err := lc.Release(ctx, k, value); err != nil || !ok {
			b.Fatal(ok, err)
		}
		t2 := time.Now()
		bare += t1.Sub(t0)
		scripts += t2.Sub(t1)
	}
	b.ReportMetric(float64(b.N)/scripts.Seconds(), "pairs/s")
	b.ReportMetric(float64(b.N)/bare.Seconds(), "baseline-pairs/s")
	b.ReportMetric(bare.Seconds()/scripts.Seconds(), "ratio")
}

// BenchmarkProtocolFloorParallel is BenchmarkProtocolFloor with 64
// goroutines, each on a key of its own, as distlock's BenchmarkManyKeys
// runs: with many pairs in flight, Redis's own CPU time per pair decides,
// and a Lua script costs it several times what SET and DEL do.
func BenchmarkProtocolFloorParallel(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client()
	lc := lease.New(c)
	ctx := context.Background()
	const workers = 64
	run := func(pairs int, pair func(w int)) time.Duration {
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for w := range workers {
			wg.Go(func() {
				for next.Add(1) <= int64(pairs) {
					pair(w)
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	keys := make([]lease.Keys, workers)
	values := make([]string, workers)
	for i := range keys {
		var err error
		if keys[i], err = lease.NewKeys("bench", fmt.Sprint("floor", i)); err != nil {
			b.Fatal(err)
		}
		values[i] = lease.NewValue("bench")
	}
	var bare, scripts time.Duration
	pairs := 0
	for b.Loop() {
		const n = 2000
		pairs += n
		bare += run(n, func(w int) {
			key := fmt.Sprint("bare", w)
			if err := c.Do(ctx, c.B().Set().Key(key).Value("v").Nx().Px(30*time.Second).Build()).Error(); err != nil {
				b.Error(err)
			}
			if err := c.Do(ctx, c.B().Del().Key(key).Build()).Error(); err != nil {
				b.Error(err)
			}
		})
		scripts += run(n, func(w int) {
			if g, err := lc.Acquire(ctx, keys[w], values[w], 30*time.Second); err != nil || !g.Acquired {
				b.Error(g, err)
			}
			if ok, err := lc.Release(ctx, keys[w], values[w]); err != nil || !ok {
				b.Error(ok, err)
			}
		})
	}
	b.ReportMetric(float64(pairs)/scripts.Seconds(), "pairs/s")
	b.ReportMetric(float64(pairs)/bare.Seconds(), "baseline-pairs/s")
	b.ReportMetric(bare.Seconds()/scripts.Seconds(), "ratio")
}
