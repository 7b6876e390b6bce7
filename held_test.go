package distlock_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Many locks held by one process on one client: what the renewals cost
// (commands, Redis CPU) and what a held lock costs in memory.

// heldConfig is one hold of many locks.
type heldConfig struct {
	locks   int
	ttl     time.Duration
	hold    time.Duration // the measured hold, from a renewal period after the last acquisition to the first release
	workers int           // goroutines that call Lock, and then Release
	profile string        // a file to write the heap profile to at the end of the hold (DISTLOCK_BENCH_HEAPPROFILE)
}

// heldResult is what a hold measured.
type heldResult struct {
	acquireTime   time.Duration
	lockErrors    int64
	firstLockErr  error
	commands      int64 // sent by the client during the hold
	renewals      int64 // renewals answered during the hold (the Observer's)
	renewFailures int64 // of those, the ones that failed or were refused
	renewErrors   map[string]int
	lost          int64 // transitions to Lost, at any time before the releases
	notAcquired   int   // guards not Acquired at the end of the hold
	releaseErrors int64
	redisCPU      time.Duration // used_cpu_sys + used_cpu_user during the hold
	clientCPU     time.Duration // this process's user and system time during the hold
	heapPerLock   float64       // bytes, at the end of the hold
	stackPerLock  float64
	goroutines    float64 // per lock
	keysLeft      []string
	fenceKeys     int
}

func (r heldResult) perSecond(n int64, hold time.Duration) float64 {
	return float64(n) / hold.Seconds()
}

// heldObserver counts renewals and losses.
type heldObserver struct {
	renewals, failures, lost atomic.Int64
	mu                       sync.Mutex
	errs                     map[string]int // failed renewals by error text
}

func (o *heldObserver) ObserveAcquire(distlock.AcquireInfo) {}
func (o *heldObserver) ObserveRenew(r distlock.RenewInfo) {
	o.renewals.Add(1)
	if r.Err != nil {
		o.failures.Add(1)
		o.mu.Lock()
		if o.errs == nil {
			o.errs = map[string]int{}
		}
		if len(o.errs) < 10 {
			o.errs[r.Err.Error()]++
		}
		o.mu.Unlock()
	}
}
func (o *heldObserver) ObserveTransition(t distlock.TransitionInfo) {
	if t.To == distlock.Lost {
		o.lost.Add(1)
	}
}

// holdMany has cfg.workers goroutines take cfg.locks locks with
// Lock(context.Background()) on one counting rueidis client of a private
// server, holds them all for cfg.hold, releases them, and reports.
func holdMany(tb testing.TB, cfg heldConfig) heldResult {
	tb.Helper()
	srv := redistest.Start(tb)
	c, counter := srv.CountingClient(tb)
	obs := &heldObserver{}
	var res heldResult

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutinesBefore := runtime.NumGoroutine()

	guards := make([]*distlock.Guard, cfg.locks)
	var lockErrs, releaseErrs atomic.Int64
	var firstErr atomic.Value
	each := func(f func(i int)) {
		var wg sync.WaitGroup
		for w := range cfg.workers {
			wg.Go(func() {
				for i := w; i < cfg.locks; i += cfg.workers {
					f(i)
				}
			})
		}
		wg.Wait()
	}
	start := time.Now()
	each(func(i int) {
		m, err := distlock.NewMutex(c, "held:"+strconv.Itoa(i), distlock.WithTTL(cfg.ttl), distlock.WithObserver(obs))
		if err == nil {
			guards[i], err = m.Lock(context.Background())
		}
		if err != nil {
			lockErrs.Add(1)
			firstErr.CompareAndSwap(nil, err)
		}
	})
	res.acquireTime = time.Since(start)
	res.lockErrors = lockErrs.Load()
	if e, ok := firstErr.Load().(error); ok {
		res.firstLockErr = e
	}

	// Two renewal periods first, so that the window sees every lock's
	// renewals at their steady rate: a lock's first renewal comes a period
	// after its acquisition, and the Observer hears of a renewal through
	// the batcher when the guard's actor next wakes, a period later.
	time.Sleep(2 * renewPeriod(cfg.ttl))
	cpu0 := redisCPU(tb, srv)
	self0, _ := clientUsage()
	cmds0, renewals0, failures0 := counter.Load(), obs.renewals.Load(), obs.failures.Load()
	time.Sleep(cfg.hold)
	res.commands = counter.Load() - cmds0
	res.renewals = obs.renewals.Load() - renewals0
	res.renewFailures = obs.failures.Load() - failures0
	res.redisCPU = redisCPU(tb, srv) - cpu0
	self1, _ := clientUsage()
	res.clientCPU = self1 - self0

	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	res.heapPerLock = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(cfg.locks)
	res.stackPerLock = float64(int64(after.StackInuse)-int64(before.StackInuse)) / float64(cfg.locks)
	res.goroutines = float64(runtime.NumGoroutine()-goroutinesBefore) / float64(cfg.locks)
	if cfg.profile != "" {
		writeHeapProfile(tb, cfg.profile)
	}

	for _, g := range guards {
		if g != nil && g.State() != distlock.Acquired {
			res.notAcquired++
		}
	}
	res.lost = obs.lost.Load()
	obs.mu.Lock()
	res.renewErrors = obs.errs
	obs.mu.Unlock()
	each(func(i int) {
		if g := guards[i]; g != nil {
			if _, err := g.Release(context.Background()); err != nil {
				releaseErrs.Add(1)
			}
		}
	})
	res.releaseErrors = releaseErrs.Load()
	res.keysLeft, res.fenceKeys = leftKeys(tb, srv)
	return res
}

// redisCPU returns the CPU time the server has used, user and system.
func redisCPU(tb testing.TB, srv *redistest.Server) time.Duration {
	tb.Helper()
	info, err := srv.Info("cpu")
	if err != nil {
		tb.Fatal(err)
	}
	var total time.Duration
	for _, f := range []string{"used_cpu_sys", "used_cpu_user"} {
		s, err := strconv.ParseFloat(info[f], 64)
		if err != nil {
			tb.Fatalf("INFO cpu %s=%q: %v", f, info[f], err)
		}
		total += time.Duration(s * float64(time.Second))
	}
	return total
}

// leftKeys returns the keys left in the server but the fencing keys (kept
// on purpose, FenceRetention: a lock used again must issue a larger
// token), and how many fencing keys there are.
func leftKeys(tb testing.TB, srv *redistest.Server) (left []string, fences int) {
	tb.Helper()
	cursor := "0"
	for {
		arr, err := srv.MustDo("SCAN", cursor, "COUNT", "10000").ToArray()
		if err != nil || len(arr) != 2 {
			tb.Fatalf("SCAN: %v", err)
		}
		cursor, _ = arr[0].ToString()
		keys, _ := arr[1].AsStrSlice()
		for _, k := range keys {
			if strings.HasSuffix(k, ":fence") {
				fences++
			} else {
				left = append(left, k)
			}
		}
		if cursor == "0" {
			return left, fences
		}
	}
}

// report logs a hold's figures (and, for a benchmark, reports them).
func (r heldResult) report(tb testing.TB, cfg heldConfig) {
	tb.Helper()
	tb.Logf("%d locks, TTL %v, held %v (acquired in %v by %d goroutines calling Lock)", cfg.locks, cfg.ttl, cfg.hold, r.acquireTime.Round(time.Millisecond), cfg.workers)
	tb.Logf("commands/s %.0f, renewals/s %.0f (expected %.0f), renewals per command %.1f, failed renewals %d",
		r.perSecond(r.commands, cfg.hold), r.perSecond(r.renewals, cfg.hold), float64(cfg.locks)/renewPeriod(cfg.ttl).Seconds(),
		float64(r.renewals)/float64(max(r.commands, 1)), r.renewFailures)
	tb.Logf("client CPU %.1f%% of a core (%.1f µs per renewal)", 100*r.clientCPU.Seconds()/cfg.hold.Seconds(), r.cpuPerRenewal())
	tb.Logf("Redis CPU %.1f%% of a core; memory per held lock: heap %.0f B, stacks %.0f B (%.2f KiB), goroutines per lock %.3f",
		100*r.redisCPU.Seconds()/cfg.hold.Seconds(), r.heapPerLock, r.stackPerLock, (r.heapPerLock+r.stackPerLock)/1024, r.goroutines)
	tb.Logf("Lock errors %d (first: %v), Lost %d, not Acquired at the end %d, Release errors %d, keys left %d (fencing keys kept: %d)",
		r.lockErrors, r.firstLockErr, r.lost, r.notAcquired, r.releaseErrors, len(r.keysLeft), r.fenceKeys)
	if b, ok := tb.(*testing.B); ok {
		b.ReportMetric(r.cpuPerRenewal(), "client-µs/renewal")
		b.ReportMetric((r.heapPerLock+r.stackPerLock)/1024, "KiB/lock")
		b.ReportMetric(r.heapPerLock, "heap-B/lock")
		b.ReportMetric(r.stackPerLock, "stack-B/lock")
		b.ReportMetric(r.goroutines, "goroutines/lock")
		b.ReportMetric(r.perSecond(r.commands, cfg.hold), "commands/s")
		b.ReportMetric(r.perSecond(r.renewals, cfg.hold), "renewals/s")
		b.ReportMetric(float64(r.renewals)/float64(max(r.commands, 1)), "renewals/command")
		b.ReportMetric(100*r.redisCPU.Seconds()/cfg.hold.Seconds(), "redis-cpu-%")
		b.ReportMetric(100*r.clientCPU.Seconds()/cfg.hold.Seconds(), "client-cpu-%")
		b.ReportMetric(float64(r.lost), "false-lost")
		b.ReportMetric(float64(r.notAcquired), "not-acquired-at-end")
		b.ReportMetric(float64(r.lockErrors), "lock-errors")
		b.ReportMetric(float64(len(r.keysLeft)), "keys-left")
	}
}

// renewPeriod is how often a lock of ttl renews (distlock's TTL/3).
func renewPeriod(ttl time.Duration) time.Duration { return ttl / 3 }

// BenchmarkHeld100k holds 100,000 locks on one rueidis client, TTL 6 s,
// for two TTLs, and reports what issue 30 asks of them: the process's CPU
// per renewal (at most 8 µs), heap and goroutine stacks per held lock (at
// most 6 KiB), the commands a second (at most 1,000), Redis's CPU (at most
// 25% of a core), and the guards that left Acquired (none). Sub-benchmark
// quiet runs alone; busy runs beside a loop burning one core, in a process
// of its own started for it (its CPU is not the client's), where still no
// guard may leave Acquired. Run it once per sub-benchmark:
//
//	go test -run '^$' -bench 'Held100k' -benchtime 1x -timeout 20m .
//
// Each takes about a minute and most of two cores. DISTLOCK_HELD_LOCKS
// changes the number of locks (10000 for a quick run), DISTLOCK_HELD_TTL
// the TTL and DISTLOCK_HELD_HOLD the hold (two TTLs by default);
// DISTLOCK_BENCH_HEAPPROFILE names a file for the heap profile at the end
// of the hold. The figures are reported as metrics; the limits are logged
// beside them, not enforced: a benchmark measures, and a machine busier
// than the one busy loop can miss them.
func BenchmarkHeld100k(b *testing.B) {
	cfg := heldConfig{locks: envInt(b, "DISTLOCK_HELD_LOCKS", 100000), ttl: 6 * time.Second, workers: 64,
		profile: os.Getenv("DISTLOCK_BENCH_HEAPPROFILE")}
	cfg.ttl = envDuration(b, "DISTLOCK_HELD_TTL", cfg.ttl)
	cfg.hold = envDuration(b, "DISTLOCK_HELD_HOLD", 2*cfg.ttl)
	for _, busy := range []bool{false, true} {
		name := "quiet"
		if busy {
			name = "busy"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				stop := func() {}
				if busy {
					stop = burnCore(b)
				}
				r := holdMany(b, cfg)
				stop()
				r.report(b, cfg)
				r.judge(b, cfg, !busy)
				r.logRenewErrors(b)
			}
		})
	}
}

// judge logs each of issue 30's limits beside the figure, and whether it
// was met; all of them when all is set, only that no guard left Acquired
// otherwise (beside a busy loop). It does not fail the benchmark.
func (r heldResult) judge(b *testing.B, cfg heldConfig, all bool) {
	b.Helper()
	var line []string
	check := func(what string, got, limit float64, unit string) {
		verdict := "met"
		if got > limit {
			verdict = "MISSED"
		}
		line = append(line, fmt.Sprintf("%s %.2f%s (at most %.0f: %s)", what, got, unit, limit, verdict))
	}
	if all {
		check("CPU per renewal", r.cpuPerRenewal(), 8, " µs")
		check("heap and stacks per lock", (r.heapPerLock+r.stackPerLock)/1024, 6, " KiB")
		check("commands a second", r.perSecond(r.commands, cfg.hold), 1000, "")
		check("Redis CPU", 100*r.redisCPU.Seconds()/cfg.hold.Seconds(), 25, "%")
	}
	check("guards that left Acquired", float64(r.lost+int64(r.notAcquired)), 0, "")
	b.Logf("targets: %s", strings.Join(line, "; "))
	if r.lockErrors > 0 || r.releaseErrors > 0 || len(r.keysLeft) > 0 {
		b.Logf("also: %d Lock errors, %d Release errors, %d keys left", r.lockErrors, r.releaseErrors, len(r.keysLeft))
	}
}

// logRenewErrors logs the failed renewals, a few of each error (a
// benchmark's log keeps only its first lines, so this comes last).
func (r heldResult) logRenewErrors(tb testing.TB) {
	tb.Helper()
	for e, n := range r.renewErrors {
		tb.Logf("failed renewals: %d× %s", n, e)
	}
}

// cpuPerRenewal is the process's CPU time per renewal answered, in µs.
func (r heldResult) cpuPerRenewal() float64 {
	return float64(r.clientCPU.Nanoseconds()) / 1000 / float64(max(r.renewals, 1))
}

// burnCore starts a process that burns one core until the returned
// function stops it (by its pid) and waits for it.
func burnCore(tb testing.TB) (stop func()) {
	tb.Helper()
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		tb.Fatalf("starting a busy loop: %v", err)
	}
	return func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// envDuration reads a duration from the environment variable name, or
// returns def when it is not set.
func envDuration(tb testing.TB, name string, def time.Duration) time.Duration {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		tb.Fatalf("%s=%q: want a positive duration", name, v)
	}
	return d
}
