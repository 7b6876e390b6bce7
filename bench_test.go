package distlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Benchmarks run against a private redis-server. Each distlock benchmark has
// a baseline in the same run, doing the bare Redis work through the same
// client, so results read as ratios (see BENCHMARKS.md):
//
//	go test -bench . -run '^$' .

// bareLockPair is the baseline for one lock + release: SET NX PX, then DEL,
// two round trips with no ownership check, renewal or token.
func bareLockPair(ctx context.Context, c rueidis.Client, key string) error {
	if err := c.Do(ctx, c.B().Set().Key(key).Value("v").Nx().Px(30*time.Second).Build()).Error(); err != nil {
		return err
	}
	return c.Do(ctx, c.B().Del().Key(key).Build()).Error()
}

// BenchmarkUncontended measures lock + release pairs by one goroutine on one
// key, against the bare two-round-trip baseline.
func BenchmarkUncontended(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client()
	ctx := context.Background()

	b.Run("baseline", func(b *testing.B) {
		for b.Loop() {
			if err := bareLockPair(ctx, c, "bench:bare"); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
	})
	b.Run("distlock", func(b *testing.B) {
		m, err := distlock.NewMutex(c, "bench")
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			g, err := m.TryLock(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := g.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
	})
}
