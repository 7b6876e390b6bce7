package distlock_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// Benchmarks run against a private redis-server. Each one measures distlock
// next to a baseline in the same run, doing the bare Redis work through the
// same client, so results read as ratios (see BENCHMARKS.md):
//
//	go test -run '^$' -bench . -benchtime 3s .

// holdFor is how long a contended benchmark holds the lock each time. The
// holder works (spins) rather than sleeps: on this kind of machine a sleep
// shorter than a millisecond in an otherwise idle process lasts a whole
// millisecond, which would measure the timer, not the lock.
const holdFor = 100 * time.Microsecond

// work keeps the CPU busy for d.
func work(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// bareLock takes key with SET NX PX; it reports whether it got it.
func bareLock(ctx context.Context, c rueidis.Client, key string) (bool, error) {
	err := c.Do(ctx, c.B().Set().Key(key).Value("v").Nx().Px(30*time.Second).Build()).Error()
	if rueidis.IsRedisNil(err) {
		return false, nil
	}
	return err == nil, err
}

// bareUnlock is DEL, with no ownership check.
func bareUnlock(ctx context.Context, c rueidis.Client, key string) error {
	return c.Do(ctx, c.B().Del().Key(key).Build()).Error()
}

func mustMutex(b *testing.B, c rueidis.Client, key string, opts ...distlock.Option) *distlock.Mutex {
	b.Helper()
	m, err := distlock.NewMutex(c, key, opts...)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// scriptsPair runs distlock's acquire and release scripts back to back,
// with no guard, actor or queue: the protocol floor, the fastest any lock
// built on these scripts can be.
func scriptsPair(ctx context.Context, lc *lease.Client, k lease.Keys, value string) error {
	g, err := lc.Acquire(ctx, k, value, 30*time.Second)
	if err != nil {
		return err
	}
	if !g.Acquired {
		return fmt.Errorf("protocol floor: %s is held", k.Lease)
	}
	_, err = lc.Release(ctx, k, value)
	return err
}

// reportPairs reports a lock + release rate with the bare and protocol-floor
// rates of the same run, and both ratios.
func reportPairs(b *testing.B, pairs int, ours, bare, floor time.Duration) {
	n := float64(pairs)
	b.ReportMetric(n/ours.Seconds(), "pairs/s")
	b.ReportMetric(n/bare.Seconds(), "baseline-pairs/s")
	b.ReportMetric(bare.Seconds()/ours.Seconds(), "ratio")
	b.ReportMetric(bare.Seconds()/floor.Seconds(), "floor-ratio")
}

// BenchmarkUncontended follows a worker's path: for each job a new Mutex,
// Lock, and Release with context.WithoutCancel(ctx), as the README does. It
// alternates, in one loop, that pair, a bare SET NX PX + DEL pair and the
// protocol floor (distlock's two scripts called directly), each on a key
// of its own, so all three see the same machine at the same moment. "ratio"
// is distlock against the bare pair, "floor-ratio" the scripts alone
// against it, "ceiling" distlock against the scripts alone.
//
// The sub-benchmarks differ in the Lock context: context.Background(),
// which nothing can cancel, and a cancellable one (what a worker usually
// passes); the bare pair and the floor are sent with the same context. Each
// has a client of its own: rueidis sends a command with a cancellable
// context and no deadline through its background pipeline, and keeps the
// connection in that mode from then on.
func BenchmarkUncontended(b *testing.B) {
	srv := redistest.Start(b)
	for _, cancellable := range []bool{false, true} {
		name := "ctx=background"
		if cancellable {
			name = "ctx=cancellable"
		}
		b.Run(name, func(b *testing.B) {
			c := srv.Client()
			ctx := context.Background()
			if cancellable {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
			}
			lc := lease.New(c)
			floorKeys, err := lease.NewKeys("bench", "floor")
			if err != nil {
				b.Fatal(err)
			}
			floorValue := lease.NewValue("bench")
			pair := func() {
				m := mustMutex(b, c, "bench")
				g, err := m.Lock(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := g.Release(context.WithoutCancel(ctx)); err != nil {
					b.Fatal(err)
				}
			}
			var bare, ours, floor time.Duration
			for b.Loop() {
				t0 := time.Now()
				if _, err := bareLock(ctx, c, "bench:bare"); err != nil {
					b.Fatal(err)
				}
				if err := bareUnlock(ctx, c, "bench:bare"); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				pair()
				t2 := time.Now()
				if err := scriptsPair(ctx, lc, floorKeys, floorValue); err != nil {
					b.Fatal(err)
				}
				t3 := time.Now()
				bare += t1.Sub(t0)
				ours += t2.Sub(t1)
				floor += t3.Sub(t2)
			}
			b.StopTimer()
			const allocRuns = 200
			var before, after runtime.MemStats
			started := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
			metrics.Read(started)
			runtime.ReadMemStats(&before)
			for range allocRuns {
				pair()
			}
			runtime.ReadMemStats(&after)
			created := started[0].Value.Uint64()
			metrics.Read(started)
			created = started[0].Value.Uint64() - created
			reportPairs(b, b.N, ours, bare, floor)
			b.ReportMetric(floor.Seconds()/ours.Seconds(), "ceiling")
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/allocRuns, "allocs/pair")
			b.ReportMetric(float64(created)/allocRuns, "goroutines/pair")
		})
	}
}

// contention is the outcome of one or more contended runs.
type contention struct {
	acquisitions int
	elapsed      time.Duration
	waits        []time.Duration
	commands     int64
}

func (r contention) rate() float64 { return float64(r.acquisitions) / r.elapsed.Seconds() }

// add accumulates another run into r.
func (r *contention) add(o contention) {
	r.acquisitions += o.acquisitions
	r.elapsed += o.elapsed
	r.waits = append(r.waits, o.waits...)
	r.commands += o.commands
}

func (r contention) percentile(p float64) time.Duration {
	if len(r.waits) == 0 {
		return 0
	}
	slices.Sort(r.waits)
	return r.waits[int(p*float64(len(r.waits)-1))]
}

// contend has workers goroutines take turns n times in all through lock,
// each holding for holdFor, and measures it.
func contend(b *testing.B, counter *redistest.CommandCounter, workers, n int, lock func(w int) (unlock func())) contention {
	b.Helper()
	var (
		next  atomic.Int64
		mu    sync.Mutex
		waits = make([]time.Duration, 0, n)
		wg    sync.WaitGroup
	)
	before := counter.Load()
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			var mine []time.Duration
			for next.Add(1) <= int64(n) {
				t := time.Now()
				unlock := lock(w)
				mine = append(mine, time.Since(t))
				work(holdFor)
				unlock()
			}
			mu.Lock()
			waits = append(waits, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	return contention{acquisitions: n, elapsed: elapsed, waits: waits, commands: counter.Load() - before}
}

// BenchmarkContended has 2, 8 and 64 goroutines take one lock in turns,
// each holding it ~100µs. The baseline spins on SET NX PX and releases with
// DEL through the same client, in the same run; distlock uses Lock with its
// defaults (one Mutex per goroutine, as separate call sites would).
func BenchmarkContended(b *testing.B) {
	srv := redistest.Start(b)
	c, counter := srv.CountingClient(b)
	ctx := context.Background()
	for _, workers := range []int{2, 8, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", workers), func(b *testing.B) {
			mutexes := make([]*distlock.Mutex, workers)
			for i := range mutexes {
				mutexes[i] = mustMutex(b, c, "contended")
			}
			// Each loop runs both, in turn, and the totals of all loops are
			// reported, so that both see the same moments of the machine.
			var base, ours contention
			for b.Loop() {
				n := 200
				base.add(contend(b, counter, workers, n, func(int) func() {
					for {
						ok, err := bareLock(ctx, c, "contended:bare")
						if err != nil {
							b.Error(err)
							return func() {}
						}
						if ok {
							return func() {
								if err := bareUnlock(ctx, c, "contended:bare"); err != nil {
									b.Error(err)
								}
							}
						}
					}
				}))
				ours.add(contend(b, counter, workers, n, func(w int) func() {
					g, err := mutexes[w].Lock(ctx)
					if err != nil {
						b.Error(err) // workers are not the benchmark's goroutine: no Fatal
						return func() {}
					}
					return func() {
						if _, err := g.Release(ctx); err != nil {
							b.Error(err)
						}
					}
				}))
			}
			b.ReportMetric(ours.rate(), "acq/s")
			b.ReportMetric(base.rate(), "baseline-acq/s")
			b.ReportMetric(ours.rate()/base.rate(), "ratio")
			b.ReportMetric(float64(ours.percentile(0.5).Microseconds()), "p50-wait-µs")
			b.ReportMetric(float64(ours.percentile(0.99).Microseconds()), "p99-wait-µs")
			b.ReportMetric(float64(ours.commands)/float64(ours.acquisitions), "cmds/acq")
			b.ReportMetric(float64(base.commands)/float64(base.acquisitions), "baseline-cmds/acq")
			b.ReportMetric(float64(base.percentile(0.99).Microseconds()), "baseline-p99-wait-µs")
		})
	}
}

// BenchmarkManyKeys runs 64 goroutines in parallel, each taking and
// releasing a key of its own, against the bare pair and the protocol floor
// run the same way, in turn, in the same loop.
func BenchmarkManyKeys(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client()
	ctx := context.Background()
	lc := lease.New(c)
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
	mutexes := make([]*distlock.Mutex, workers)
	floorKeys := make([]lease.Keys, workers)
	floorValues := make([]string, workers)
	for i := range mutexes {
		mutexes[i] = mustMutex(b, c, fmt.Sprint("many:", i))
		var err error
		if floorKeys[i], err = lease.NewKeys("bench", fmt.Sprint("floor:", i)); err != nil {
			b.Fatal(err)
		}
		floorValues[i] = lease.NewValue("bench")
	}
	var bare, ours, floor time.Duration
	pairs := 0
	for b.Loop() {
		const n = 2000
		pairs += n
		bare += run(n, func(w int) {
			key := fmt.Sprint("many:bare:", w)
			if _, err := bareLock(ctx, c, key); err != nil {
				b.Error(err)
			}
			if err := bareUnlock(ctx, c, key); err != nil {
				b.Error(err)
			}
		})
		ours += run(n, func(w int) {
			g, err := mutexes[w].Lock(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := g.Release(ctx); err != nil {
				b.Error(err)
			}
		})
		floor += run(n, func(w int) {
			if err := scriptsPair(ctx, lc, floorKeys[w], floorValues[w]); err != nil {
				b.Error(err)
			}
		})
	}
	reportPairs(b, pairs, ours, bare, floor)
}

// BenchmarkCrashedHolder measures how long after a dead holder's lease
// expires a waiter takes the lock: the holder's key is written with a TTL and
// never released, and Lock waits for it.
func BenchmarkCrashedHolder(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client()
	ctx := context.Background()
	m := mustMutex(b, c, "crashed")
	const ttl = 200 * time.Millisecond
	var lateness []time.Duration
	for b.Loop() {
		err := c.Do(ctx, c.B().Set().Key(m.Key()).Value("crashed#1").Px(ttl).Build()).Error()
		if err != nil {
			b.Fatal(err)
		}
		expires := time.Now().Add(ttl)
		g, err := m.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		lateness = append(lateness, time.Since(expires))
		if _, err := g.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(lateness)
	b.ReportMetric(float64(lateness[len(lateness)/2].Microseconds())/1000, "p50-ms-after-expiry")
	b.ReportMetric(float64(lateness[len(lateness)-1].Microseconds())/1000, "max-ms-after-expiry")
}

// envInt reads a count from the environment variable name, or returns def
// when it is not set.
func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	return n
}

// writeHeapProfile writes the heap profile, as of the last GC, to path.
func writeHeapProfile(tb testing.TB, path string) {
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		tb.Fatal(err)
	}
}
