package lease_test

import (
	"context"
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
