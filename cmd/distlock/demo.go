package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock"
)

const demoUsage = `Usage: distlock demo [flags]

A few workers contend for one lock. Each prints its transitions (acquired,
lost, released) with its fencing token; "acquired" also says how long the
worker waited and how many calls to Redis its Lock made: a waiter stands
in line with its first call, and then only refreshes its place (every half
claim window) and claims its grant, which reaches it by pub/sub: it does
not poll. Half-way through, an "operator"
overwrites the key (--steal) to show how a holder learns of a loss. A summary
closes the run: acquisitions per worker, wait p50 and p99, whether the tokens
strictly increased, and overlaps (two workers holding at once: must be 0).

The demo runs on an embedded Redis unless --redis or $REDIS_URL names one.
Exit status: 0; 1 if the lock misbehaved or Redis failed; 64 for a usage
error.

Examples:
  distlock demo --workers 5 --duration 10s
  distlock demo --redis redis://127.0.0.1:6379 --ttl 2s --hold 1s

Flags:
`

// demoConfig is the demo's command line.
type demoConfig struct {
	common
	key      string
	workers  int
	duration time.Duration
	hold     time.Duration
	rest     time.Duration
	steal    bool
	verbose  bool
}

// demoFlags returns the flag set of "distlock demo", bound to c.
func demoFlags(c *demoConfig) *flag.FlagSet {
	fs := newFlagSet("demo")
	c.register(fs, ", else an embedded Redis", 900*time.Millisecond)
	fs.StringVar(&c.key, "key", "demo", "lock `NAME`")
	fs.IntVar(&c.workers, "workers", 3, "number (`N`) of workers contending for the lock")
	durationVar(fs, &c.duration, "duration", 4*time.Second, "how long (`DURATION`) the demo runs")
	durationVar(fs, &c.hold, "hold", 400*time.Millisecond, "how long (`DURATION`) each worker holds the lock")
	durationVar(fs, &c.rest, "rest", 100*time.Millisecond, "how long (`DURATION`) a worker works elsewhere between holds")
	fs.BoolVar(&c.steal, "steal", true, "half-way through, overwrite the key as an operator would, to show a Lost")
	fs.BoolVar(&c.verbose, "v", false, "also print every renewal, with its outcome and how long it took")
	alias(fs, "v", "verbose")
	return fs
}

func parseDemo(args []string) (demoConfig, error) {
	var c demoConfig
	fs := demoFlags(&c)
	if err := parseFlags(fs, args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, usagef("unexpected arguments %q", fs.Args())
	case c.workers < 1:
		return c, usagef("--workers must be at least 1")
	case c.duration <= 0:
		return c, usagef("--duration must be positive")
	case c.hold < 0 || c.rest < 0:
		return c, usagef("--hold and --rest must not be negative")
	}
	return c, nil
}

// grant is one acquisition, as the demo records it.
type grant struct {
	worker int
	token  int64
	at     time.Time
	waited time.Duration
}

// demo is the shared state of one demo run.
type demo struct {
	cfg    demoConfig
	client rueidis.Client
	out    io.Writer
	start  time.Time

	mu      sync.Mutex // guards everything below; taken before outMu
	grants  []grant
	current map[int]*distlock.Guard // each worker's guard while it holds one
	losses  int
	overlap int
	stolen  bool

	// outMu serialises the lines written to out. The demoObserver, which
	// the guards' goroutines call, takes only outMu: mu may be held by a
	// worker that waits for a guard's goroutine (in release).
	outMu sync.Mutex
}

func (d *demo) printf(worker int, format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.printfLocked(worker, format, args...)
}

// printfLocked prints a line of worker; the caller holds d.mu.
func (d *demo) printfLocked(worker int, format string, args ...any) {
	d.line(worker, format, args...)
}

// line prints a line of worker, the time since the start first. It takes
// only outMu.
func (d *demo) line(worker int, format string, args ...any) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	fmt.Fprintf(d.out, "%7.3fs  worker %d  %s\n", time.Since(d.start).Seconds(), worker, fmt.Sprintf(format, args...))
}

func runDemo(ctx context.Context, args []string, stdout, _ io.Writer) error {
	cfg, err := parseDemo(args)
	if err != nil {
		return err
	}
	client, where, closeClient, err := connect(cfg.redis, true, time.Time{})
	if err != nil {
		return err
	}
	defer closeClient()

	d := &demo{cfg: cfg, client: client, out: stdout, start: time.Now(), current: make(map[int]*distlock.Guard)}
	mutexes := make([]*distlock.Mutex, cfg.workers)
	for i := range mutexes {
		opts := []distlock.Option{
			distlock.WithNamespace(cfg.namespace),
			distlock.WithTTL(cfg.ttl),
			distlock.WithOwner(fmt.Sprintf("demo-worker-%d", i+1)),
		}
		if cfg.verbose {
			opts = append(opts, distlock.WithObserver(demoObserver{d: d, worker: i + 1}))
		}
		mutexes[i], err = distlock.NewMutex(client, cfg.key, opts...)
		if err != nil {
			return usageError{err}
		}
	}
	fmt.Fprintf(stdout, "%d workers contend for %s on %s for %v\n",
		cfg.workers, mutexes[0].Key(), where, cfg.duration)
	d.start = time.Now()
	runCtx, cancel := context.WithTimeout(ctx, cfg.duration)
	defer cancel()

	var wg sync.WaitGroup
	for i, m := range mutexes {
		wg.Go(func() { d.worker(runCtx, i+1, m) })
	}
	wg.Wait()
	return d.summary(ctx)
}

// worker takes the lock, holds it for cfg.hold while printing every event,
// releases it, and starts over until ctx ends.
func (d *demo) worker(ctx context.Context, id int, m *distlock.Mutex) {
	for ctx.Err() == nil {
		asked := time.Now()
		// The Lock context ends the hold too, so the demo's end releases
		// whoever holds the lock at that moment.
		g, err := m.Lock(ctx)
		if err != nil {
			if ctx.Err() == nil {
				d.printf(id, "error: %v", err)
			}
			return
		}
		d.acquired(id, g, time.Since(asked))
		d.maybeSteal(ctx, id, m.Key())
		events := g.Subscribe(ctx)
		// The first event is the current state. Acquired was printed by
		// acquired; anything else (the staged overwrite can be refused at
		// the very first renewal, before this subscription) is news.
		if ev, ok := <-events; ok && ev.State != distlock.Acquired {
			d.event(id, g, ev)
		}
		hold := time.NewTimer(d.cfg.hold)
	holding:
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					break holding
				}
				d.event(id, g, ev)
			case <-hold.C:
				break holding
			}
		}
		hold.Stop()
		// Events that came with the end of the hold are printed too.
		for pending := true; pending; {
			select {
			case ev, ok := <-events:
				if pending = ok; ok {
					d.event(id, g, ev)
				}
			default:
				pending = false
			}
		}
		d.release(ctx, id, g)
		// Do some other work before competing again, so that the others
		// get their turn.
		rest := time.NewTimer(d.cfg.rest)
		select {
		case <-rest.C:
		case <-ctx.Done():
			rest.Stop()
		}
	}
}

// acquired records a grant and checks that no other worker's guard still
// reports Acquired.
func (d *demo) acquired(id int, g *distlock.Guard, waited time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for other, og := range d.current {
		if og.State() == distlock.Acquired {
			d.overlap++
			d.printfLocked(id, "OVERLAP with worker %d", other)
		}
	}
	d.current[id] = g
	d.grants = append(d.grants, grant{worker: id, token: g.Token(), at: time.Now(), waited: waited})
	d.printfLocked(id, "acquired  token=%d  waited=%v  %s", g.Token(), waited.Round(time.Millisecond), callsText(g.Attempt()))
}

// callsText says how many calls to Redis an acquisition made, from its
// guard's Attempt (the calls before its last one): "calls=1" when the first
// call granted it, and for a worker that waited in line, which is told of
// its grant by pub/sub and does not poll, "calls=4 (1 joined the line, 3
// refreshed its place or claimed)": its place is refreshed every
// half claim window, and a grant passed to it is claimed by one more call
// unless it holds enough of the claim window already.
func callsText(attempt int) string {
	if attempt == 0 {
		return "calls=1"
	}
	return fmt.Sprintf("calls=%d (1 joined the line, %d refreshed its place or claimed)", attempt+1, attempt)
}

// release releases g and prints the outcome. It holds the output lock
// throughout, so the next holder's "acquired" line comes after this one.
func (d *demo) release(ctx context.Context, id int, g *distlock.Guard) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.current, id)
	st, err := g.Release(context.WithoutCancel(ctx))
	switch {
	case err != nil:
		d.printfLocked(id, "release error: %v", err)
	case st == distlock.Lost:
		d.printfLocked(id, "released  token=%d  (the lease had already been lost)", g.Token())
	default:
		d.printfLocked(id, "released  token=%d", g.Token())
	}
}

func (d *demo) event(id int, g *distlock.Guard, ev distlock.Event) {
	switch ev.State {
	case distlock.Lost:
		d.mu.Lock()
		d.losses++
		d.mu.Unlock()
		d.printf(id, "LOST      token=%d  %s", g.Token(), message(ev.Err))
	case distlock.Acquired:
		if ev.Err != nil { // a renewal failed; the lease still holds
			d.printf(id, "renewal failed  token=%d  %s", g.Token(), message(ev.Err))
			return
		}
		d.printf(id, "regained  token=%d", g.Token())
	}
}

// maybeSteal overwrites the lease of worker id, as an operator clearing a
// stuck lock would, the first time a worker acquires after half the run. The
// holder finds out at its next renewal and reports Lost; the operator's value
// blocks everyone for one TTL, after which the workers carry on.
func (d *demo) maybeSteal(ctx context.Context, id int, key string) {
	d.mu.Lock()
	due := d.cfg.steal && !d.stolen && time.Since(d.start) >= d.cfg.duration/2
	d.stolen = d.stolen || due
	d.mu.Unlock()
	if !due {
		return
	}
	err := d.client.Do(ctx, d.client.B().Set().Key(key).Value("operator#demo").Px(d.cfg.ttl).Build()).Error()
	if err != nil {
		d.printf(id, "operator could not overwrite %s: %v", key, err)
		return
	}
	d.printf(id, "an operator overwrote %s for %v; the holder learns it at its next renewal", key, d.cfg.ttl)
}

func (d *demo) summary(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Fprintf(d.out, "\nsummary after %v\n", time.Since(d.start).Round(time.Millisecond))
	per := make(map[int]int)
	var waits []time.Duration
	increasing := true
	for i, g := range d.grants {
		per[g.worker]++
		waits = append(waits, g.waited)
		if i > 0 && g.token <= d.grants[i-1].token {
			increasing = false
		}
	}
	for w := 1; w <= d.cfg.workers; w++ {
		fmt.Fprintf(d.out, "  worker %d: %d acquisitions\n", w, per[w])
	}
	slices.Sort(waits)
	fmt.Fprintf(d.out, "  acquisitions: %d   wait p50: %v   p99: %v\n",
		len(d.grants), percentile(waits, 0.50), percentile(waits, 0.99))
	fmt.Fprintf(d.out, "  tokens strictly increasing: %v   overlaps: %d   losses seen: %d\n",
		increasing, d.overlap, d.losses)
	if !increasing || d.overlap > 0 {
		return errors.New("the lock misbehaved: see the summary")
	}
	return ctx.Err()
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted)-1) + 0.5)
	return sorted[i].Round(time.Millisecond)
}

// demoObserver prints, with -v, each renewal of a worker's guards in the
// demo's own format: the library's log is not used, so every line has one
// format and each event is printed once.
type demoObserver struct {
	d      *demo
	worker int
}

func (o demoObserver) ObserveAcquire(distlock.AcquireInfo)       {}
func (o demoObserver) ObserveTransition(distlock.TransitionInfo) {}

func (o demoObserver) ObserveRenew(i distlock.RenewInfo) {
	took := i.Latency.Round(time.Microsecond)
	switch {
	case i.Err == nil:
		o.d.line(o.worker, "renewed   token=%d  took=%v", i.Token, took)
	case errors.Is(i.Err, distlock.ErrLost):
		o.d.line(o.worker, "renewal refused  token=%d  took=%v", i.Token, took)
	default:
		o.d.line(o.worker, "renewal failed  token=%d  took=%v  %v", i.Token, took, message(i.Err))
	}
}
