package distlock_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// BenchmarkReplicaAck measures what WithReplicaAck costs, against a primary
// with one replica on loopback: lock + release pairs (the acquisition
// waits, the release does not), single renewals, and renewals from many
// goroutines at once. Each runs without and then with the wait, in the same
// process; the run with the wait reports its time per operation as a ratio
// to the run without (x-no-ack; with -count, to the latest run without), so
// the result does not depend on the machine's speed:
//
//	go test -bench ReplicaAck -run '^$' .
func BenchmarkReplicaAck(b *testing.B) {
	p := redistest.Start(b, "--repl-diskless-sync-delay", "0")
	redistest.StartReplica(b, p, p.Addr())
	c := p.Client()
	ctx := context.Background()
	ack := lease.Ack{Replicas: 1, Timeout: time.Second}

	// compare runs op without and then with the wait, and reports the
	// ratio. op gets the lease client or Mutex options to use.
	compare := func(b *testing.B, op func(b *testing.B, ack lease.Ack)) {
		var base float64
		for _, mode := range []struct {
			name string
			ack  lease.Ack
		}{{"no-ack", lease.Ack{}}, {"ack", ack}} {
			b.Run(mode.name, func(b *testing.B) {
				op(b, mode.ack)
				perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
				if mode.ack.Replicas == 0 {
					base = perOp
				} else if base > 0 {
					b.ReportMetric(perOp/base, "x-no-ack")
				}
			})
		}
	}

	b.Run("lock-release", func(b *testing.B) {
		compare(b, func(b *testing.B, ack lease.Ack) {
			opts := []distlock.Option{}
			if ack.Replicas > 0 {
				opts = append(opts, distlock.WithReplicaAck(ack.Replicas, ack.Timeout))
			}
			m, err := distlock.NewMutex(c, "bench-pair", opts...)
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
		})
	})

	// hold acquires the lease name through lc, until the benchmark ends.
	hold := func(b *testing.B, lc *lease.Client, name string) (lease.Keys, string, error) {
		k, err := lease.NewKeys("bench", name)
		if err != nil {
			return k, "", err
		}
		value := lease.NewValue("bench")
		if g, err := lc.Acquire(ctx, k, value, time.Minute); err != nil || !g.Acquired {
			return k, "", fmt.Errorf("acquire %s: %+v, %w", name, g, err)
		}
		b.Cleanup(func() { _, _ = lc.Release(ctx, k, value) })
		return k, value, nil
	}

	b.Run("renew", func(b *testing.B) {
		compare(b, func(b *testing.B, ack lease.Ack) {
			lc, err := lease.NewWithAck(c, ack)
			if err != nil {
				b.Fatal(err)
			}
			k, value, err := hold(b, lc, "renew")
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if r, err := lc.Renew(ctx, k, value, time.Minute); err != nil || !r.OK {
					b.Fatalf("renew: %+v, %v", r, err)
				}
			}
		})
	})

	b.Run("renew-parallel", func(b *testing.B) {
		compare(b, func(b *testing.B, ack lease.Ack) {
			lc, err := lease.NewWithAck(c, ack)
			if err != nil {
				b.Fatal(err)
			}
			var n atomic.Int32
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				// Each goroutine renews a lease of its own, as many guards
				// would.
				k, value, err := hold(b, lc, fmt.Sprint("parallel-", n.Add(1)))
				if err != nil {
					b.Error(err)
					return
				}
				for pb.Next() {
					if r, err := lc.Renew(ctx, k, value, time.Minute); err != nil || !r.OK {
						b.Errorf("renew: %+v, %v", r, err)
						return
					}
				}
			})
		})
	})
}
