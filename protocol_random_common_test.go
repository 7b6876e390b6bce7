package distlock_test

// The machinery that the randomized rounds share (TestRandomProtocol in
// protocol_random_test.go, TestRandomSemaphore, TestRandomRWMutex and
// TestRandomMultiMutex in protocol_random_sem_test.go, _rw_test.go and
// _multi_test.go): the processes and their proxies, the random moves and
// faults and their record, the waiters' calls and holds, the sampler of
// the lease and the line, and the checks of the line (W1, W2, W3, W5) that
// read the same things in all. What differs between the tests is in a
// roundKind (what a waiter calls, how its guard is watched, how the lease
// is read) and a lineRecord (how the wire record of the round answers the
// checks' questions); a MultiMutex's round runs the checks of the line
// once per name, on that name's samples and record.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// runRandomRounds runs the rounds of a randomized test: as many as
// DISTLOCK_SOAK says (one by default), with the seed DISTLOCK_RANDOM_SEED
// (or the clock's) and the next ones, each making DISTLOCK_RANDOM_OPS moves
// (defOps by default).
func runRandomRounds(t *testing.T, defOps int, run func(t *testing.T, seed uint64, ops int)) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(randomSeedVar); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "%s=%q", randomSeedVar, v)
		seed = n
	}
	ops := defOps
	if v := os.Getenv(randomOpsVar); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "%s=%q", randomOpsVar, v)
		require.Positive(t, n, "%s=%q", randomOpsVar, v)
		ops = n
	}
	for i := range runs(t, 1) {
		s := seed + uint64(i)
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			t.Logf("seed %d (replay the moves with %s=%d)", s, randomSeedVar, s)
			run(t, s, ops)
		})
	}
}

// procState is the state of a process of the round.
type procState int

const (
	procUp procState = iota
	procPartitioned
	procKilled
	// procHeld: its requests are held and delivered later (faultproxy.Hold),
	// its replies flow. Its holders release as usual: the release lands
	// when the hold ends.
	procHeld
	// procDelayed: every byte it sends or receives is delayed
	// (faultproxy.Delay). Its holders release as usual.
	procDelayed
)

// rproc is a process: one rueidis client behind one proxy.
type rproc struct {
	idx   int // its place in round.procs
	name  string
	proxy *faultproxy.Proxy
	calls sync.WaitGroup // its calls and their holds
	// Guarded by round.mu:
	state   procState
	changed chan struct{} // closed and replaced at every change of state
}

// faultSpan is one fault: of one process (proc >= 0) or of all (-1).
type faultSpan struct {
	kind       string
	proc       int
	start, end time.Time // end is zero while it lasts
}

// rwaiter is one Lock or Acquire call, with its own owner id (so that the
// lease and the line name it) and its own Mutex or Semaphore on its
// process's client.
type rwaiter struct {
	name   string
	proc   *rproc
	call   func(context.Context) (*distlock.Guard, error) // its Lock or Acquire
	cancel context.CancelFunc
	hold   time.Duration
	start  time.Time
	done   chan struct{} // closed when the call has returned

	// Guarded by round.mu:
	seq       int       // order of joining the line; -1 until then
	returned  time.Time // when the call returned
	err       error
	token     int64     // the acquisition's token, if the call acquired
	gaveUp    time.Time // when the test cancelled it (cancel or kill), or the call failed
	cancelled bool      // the driver cancelled it (W3 applies)
	killed    bool      // its process was killed while it waited
	released  string    // what its guard's Release returned, for failure messages
}

// lineSample is one read of the lease and the line.
type lineSample struct {
	at, end time.Time
	// now is the server's clock when the sample ran, in whole
	// milliseconds (the semaphore's and read-write lock's samplers only).
	now     time.Time
	fence   int64           // the last token issued (the semaphore's sampler only)
	holders []lease.Holding // the lease's live values (with what is left of each, the semaphore's only)
	line    []string        // the queue's values, first first
}

// has reports whether name stands in line.
func (s *lineSample) has(name string) bool {
	return slices.ContainsFunc(s.line, func(v string) bool { return lease.Owner(v) == name })
}

// roundKind is what a randomized test puts into the round's machinery.
type roundKind struct {
	call     string        // "Lock" or "Acquire", for messages
	unit     string        // what is held: "the lock" or "a permit", for messages
	figure   string        // the scenario name of the figure lines
	killOdds int           // kills per thousand moves, in a stormy phase
	maxHold  time.Duration // a holder holds a random moment below it
	// widen makes the bounds of promptness wider by the scheduling delay
	// measured over what they bound (world.delayed).
	widen bool
	// newCall returns the call of a new waiter named name in process p.
	newCall func(p *rproc, name string) func(context.Context) (*distlock.Guard, error)
	// granted, if not nil, runs when a waiter's call returned h, before
	// the hold.
	granted func(h *holding)
	// watch, if not nil, records the grant of g to wt and watches its
	// guard in place of client.watch (which records one key's history):
	// a MultiMutex's guard holds several keys.
	watch func(wt *rwaiter, g *distlock.Guard) heldGuard
	// read reads the lease and the line once.
	read func(ctx context.Context, admin rueidis.Client) (lineSample, error)
	// modeOf, if not nil, returns the mode of the waiter named name (a
	// read-write lock's), for its Granted op.
	modeOf func(name string) string
}

// round is one randomized run.
type round struct {
	t       *testing.T
	w       *world
	kind    roundKind
	permits int        // how many may hold at once: 1 for the lock
	rng     *rand.Rand // the driver's only
	ctx     context.Context
	stop    context.CancelFunc
	procs   []*rproc
	admin   rueidis.Client // the sampler's: straight to Redis, not through a proxy

	wg      sync.WaitGroup // the waiters (and their holds) and the sampler
	faultWG sync.WaitGroup // the goroutines that end faults

	mu       sync.Mutex
	waiters  []*rwaiter // in the order they started
	joined   []*rwaiter // in the order they joined the line
	byName   map[string]*rwaiter
	faults   []faultSpan
	paused   bool // Redis is paused
	samples  []lineSample
	newer    chan struct{} // closed and replaced at every sample
	nextName int
	moves    map[string]int
}

// newRound returns a round of w with the driver's generator seeded by seed
// and no processes yet.
func newRound(t *testing.T, w *world, seed uint64, kind roundKind) *round {
	ctx, cancel := context.WithCancel(context.Background())
	return &round{
		t: t, w: w, kind: kind, permits: 1, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), ctx: ctx, stop: cancel,
		admin:  redistest.NewClient(t, rueidis.ClientOption{InitAddress: []string{w.srv.Addr()}, DisableCache: true}),
		byName: make(map[string]*rwaiter), newer: make(chan struct{}), moves: make(map[string]int),
	}
}

// addProc adds a process whose client goes through proxy.
func (r *round) addProc(name string, proxy *faultproxy.Proxy) {
	r.procs = append(r.procs, &rproc{idx: len(r.procs), name: name, proxy: proxy, changed: make(chan struct{})})
}

// run makes ops moves, then lets the faults end and every waiter left take
// its turn, and returns how long the moves and the drain took.
func (r *round) run(ops int) (moved, drainedIn time.Duration) {
	t := r.t
	// On the way out, even after a failure: stop everything and wait.
	t.Cleanup(func() {
		r.stop()
		r.faultWG.Wait()
		r.wg.Wait()
	})
	sampling, stopSampling := context.WithCancel(r.ctx)
	r.wg.Go(func() { r.sample(sampling) })

	began := time.Now()
	calm := false
	for i := range ops {
		if i%randomPhase == 0 {
			calm = r.rng.IntN(2) == 0
		}
		r.move(calm)
	}
	moved = time.Since(began)

	// The end: faults end on their own, then every waiter left gets its
	// turn and releases.
	r.faultWG.Wait()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for _, wt := range r.allWaiters() {
			<-wt.done
		}
	}()
	select {
	case <-drained:
	case <-time.After(randomDrain):
		t.Fatalf("waiters still waiting %v after the last move: %v", randomDrain, r.pending())
	}
	drainedIn = time.Since(began) - moved
	// Wait for the holds to end, as the waiters' goroutines release.
	stopSampling()
	r.wg.Wait()
	return moved, drainedIn
}

// tally counts how the calls ended, and logs those that failed on their
// own.
func (r *round) tally() (acquired, cancelled, killed, failed int) {
	for _, wt := range r.waiters {
		if wt.err != nil && !wt.cancelled && !wt.killed {
			// A call ends its wait on a Redis error before it stands in line.
			r.t.Logf("%s of %s failed after %v: %v (faults near: %v)", r.kind.call, wt.name, wt.returned.Sub(wt.start), wt.err,
				r.faultsNear(wt.start, wt.returned))
		}
		switch {
		case wt.token != 0:
			acquired++
		case wt.killed:
			killed++
		case wt.cancelled:
			cancelled++
		default:
			failed++
		}
	}
	return acquired, cancelled, killed, failed
}

// allWaiters returns a copy of the waiters, in the order they started.
func (r *round) allWaiters() []*rwaiter {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.waiters)
}

// pending describes the calls that have not returned.
func (r *round) pending() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, wt := range r.waiters {
		if wt.returned.IsZero() {
			out = append(out, wt.name)
		}
	}
	return out
}

// move makes one random move, then lets a random moment pass. Out of a
// thousand: 420 start a waiter, 140 cancel one; in a stormy phase 30 drop
// every subscription, 30 reset a process's connections, 40 partition a
// process, 40 pause Redis, kind.killOdds kill a process, 40 hold a
// process's requests for a while (delayed delivery), 30 drop a process's
// replies for a while (its requests reach Redis) and 30 delay every byte
// of a process by a few milliseconds for a while; the rest, and the faults
// in a calm phase, let a longer moment pass.
func (r *round) move(calm bool) {
	t := r.t
	gap := time.Duration(r.rng.Int64N(int64(randomGap)))
	n := r.rng.IntN(1000)
	if calm && n >= 560 {
		n = 1000
	}
	switch {
	case n < 420:
		if p := r.pickProc(procUp); p != nil && len(r.pending()) < randomMaxWaiting {
			r.join(p)
			r.moves["join"]++
		}
	case n < 560:
		if wt := r.pickWaiting(); wt != nil {
			r.cancel(wt)
			r.moves["cancel"]++
		}
	case n < 590:
		// Every subscribed connection of every process: their in-flight
		// commands fail too, as on a real connection loss.
		r.fault("pubsub-kill", -1, func() { r.w.srv.MustDo("CLIENT", "KILL", "TYPE", "pubsub") }, 0, nil)
	case n < 620:
		if p := r.pickProc(procUp); p != nil {
			r.fault("reset", p.idx, p.proxy.Reset, 0, nil)
		}
	case n < 660:
		if p := r.pickProc(procUp); p != nil {
			d := randomPartitionMin + time.Duration(r.rng.Int64N(int64(randomPartitionMax-randomPartitionMin)))
			r.setState(p, procPartitioned)
			r.fault("partition", p.idx, func() { p.proxy.SetBoth(faultproxy.Blackhole) }, d, func() {
				p.proxy.Heal()
				r.setState(p, procUp)
			})
		}
	case n < 700:
		r.mu.Lock()
		paused := r.paused
		r.paused = true
		r.mu.Unlock()
		if !paused {
			d := randomPauseMin + time.Duration(r.rng.Int64N(int64(randomPauseMax-randomPauseMin)))
			r.fault("redis-pause", -1, r.w.srv.Pause, d, func() {
				r.w.srv.Resume()
				r.mu.Lock()
				r.paused = false
				r.mu.Unlock()
			})
		}
	case n < 700+r.kind.killOdds:
		if p := r.pickProc(procUp); p != nil && r.killable() {
			r.kill(p)
		}
	case n < 740+r.kind.killOdds:
		// Delayed delivery: the process's requests are held and land
		// later, in order, while Redis's replies and announcements keep
		// reaching it; what it gave up on meanwhile still arrives.
		if p := r.pickProc(procUp); p != nil {
			d := randomPartitionMin + time.Duration(r.rng.Int64N(int64(randomPartitionMax-randomPartitionMin)))
			r.setState(p, procHeld)
			r.fault("hold", p.idx, func() { p.proxy.Set(faultproxy.Up, faultproxy.Hold) }, d, func() {
				p.proxy.Set(faultproxy.Up, faultproxy.Pass)
				r.setState(p, procUp)
			})
		}
	case n < 770+r.kind.killOdds:
		// Replies lost: what the process sends lands, and it hears nothing
		// back until its connections are reset at the end (a stream that
		// lost bytes is broken), as a partition of the downlink alone.
		if p := r.pickProc(procUp); p != nil {
			d := randomPartitionMin + time.Duration(r.rng.Int64N(int64(randomPartitionMax-randomPartitionMin)))
			r.setState(p, procPartitioned)
			r.fault("drop", p.idx, func() { p.proxy.Set(faultproxy.Down, faultproxy.Blackhole) }, d, func() {
				p.proxy.Heal()
				r.setState(p, procUp)
			})
		}
	case n < 800+r.kind.killOdds:
		// A slow path: every chunk either way waits a few milliseconds.
		if p := r.pickProc(procUp); p != nil {
			d := randomPartitionMin + time.Duration(r.rng.Int64N(int64(randomPartitionMax-randomPartitionMin)))
			lag := randomDelayMin + time.Duration(r.rng.Int64N(int64(randomDelayMax-randomDelayMin)))
			r.setState(p, procDelayed)
			r.fault("delay", p.idx, func() {
				p.proxy.SetDelay(faultproxy.Up, lag)
				p.proxy.SetDelay(faultproxy.Down, lag)
				p.proxy.SetBoth(faultproxy.Delay)
			}, d, func() {
				p.proxy.SetBoth(faultproxy.Pass)
				r.setState(p, procUp)
			})
		}
	default:
		gap *= 4 // a quiet moment
	}
	select {
	case <-time.After(gap):
	case <-t.Context().Done():
	}
}

// fault records a fault of one process (proc >= 0) or of all (-1), starts
// it with begin and, if end is not nil, ends it with end after d, in the
// background. The span recorded covers begin and end.
func (r *round) fault(kind string, proc int, begin func(), d time.Duration, end func()) {
	r.moves[kind]++
	i := r.beginFault(kind, proc)
	begin()
	if end == nil {
		r.endFault(i)
		return
	}
	r.faultWG.Go(func() {
		select {
		case <-time.After(d):
		case <-r.ctx.Done():
		}
		end()
		r.endFault(i)
	})
}

// beginFault records the start of a fault and returns its index.
func (r *round) beginFault(kind string, proc int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults = append(r.faults, faultSpan{kind: kind, proc: proc, start: time.Now()})
	return len(r.faults) - 1
}

func (r *round) endFault(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults[i].end = time.Now()
}

// kill kills process p: its proxy drops everything both ways, as a dead
// host would, and its waiting calls are given up (their ctx is cancelled,
// so they return at once; the clean-up they start goes into the void). Its
// holders release into the void too (see hold). After randomKilledFor, and
// once all of that has ended, the process comes back as a new one: its
// connections are reset and new waiters may start in it.
func (r *round) kill(p *rproc) {
	r.moves["kill"]++
	i := r.beginFault("kill", p.idx)
	p.proxy.SetBoth(faultproxy.Blackhole)
	var victims []*rwaiter
	r.mu.Lock()
	r.setStateLocked(p, procKilled)
	for _, wt := range r.waiters {
		if wt.proc == p && wt.returned.IsZero() {
			wt.gaveUp, wt.killed = time.Now(), true
			victims = append(victims, wt)
		}
	}
	r.mu.Unlock()
	for _, wt := range victims {
		wt.cancel()
	}
	r.faultWG.Go(func() {
		select {
		case <-time.After(randomKilledFor):
		case <-r.ctx.Done():
		}
		p.calls.Wait()
		p.proxy.Heal()
		r.setState(p, procUp)
		r.endFault(i)
	})
}

// killable reports whether a process may be killed now: one at a time.
func (r *round) killable() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.procs {
		if p.state == procKilled {
			return false
		}
	}
	return true
}

func (r *round) setState(p *rproc, s procState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.setStateLocked(p, s)
}

func (r *round) setStateLocked(p *rproc, s procState) {
	p.state = s
	close(p.changed)
	p.changed = make(chan struct{})
}

// pickProc returns a random process in state s, or nil.
func (r *round) pickProc(s procState) *rproc {
	r.mu.Lock()
	var in []*rproc
	for _, p := range r.procs {
		if p.state == s {
			in = append(in, p)
		}
	}
	r.mu.Unlock()
	if len(in) == 0 {
		return nil
	}
	return in[r.rng.IntN(len(in))]
}

// pickWaiting returns a random call that waits in line, or nil.
func (r *round) pickWaiting() *rwaiter {
	r.mu.Lock()
	var in []*rwaiter
	for _, wt := range r.joined {
		if wt.returned.IsZero() && wt.gaveUp.IsZero() && wt.proc.state != procKilled {
			in = append(in, wt)
		}
	}
	r.mu.Unlock()
	if len(in) == 0 {
		return nil
	}
	return in[r.rng.IntN(len(in))]
}

// join starts a call in process p and waits until it stands in line (the
// sampler saw it in the queue) or has returned (it acquired at once, or
// failed). Waiters join one at a time, so the order of joining is the order
// of their places in line.
func (r *round) join(p *rproc) {
	t := r.t
	r.mu.Lock()
	r.nextName++
	name := fmt.Sprintf("%s.w%d", p.name, r.nextName)
	r.mu.Unlock()
	call := r.kind.newCall(p, name)
	ctx, cancel := context.WithCancel(r.ctx)
	wt := &rwaiter{
		name: name, proc: p, call: call, cancel: cancel, hold: time.Duration(r.rng.Int64N(int64(r.kind.maxHold))),
		start: time.Now(), done: make(chan struct{}), seq: -1,
	}
	r.mu.Lock()
	r.waiters = append(r.waiters, wt)
	r.byName[name] = wt
	r.mu.Unlock()
	p.calls.Add(1)
	r.wg.Go(func() { r.runWaiter(ctx, wt) })

	timeout := time.NewTimer(eventually)
	defer timeout.Stop()
	for in := false; !in; {
		r.mu.Lock()
		in = len(r.samples) > 0 && r.samples[len(r.samples)-1].has(name)
		newer := r.newer
		r.mu.Unlock()
		if in {
			break
		}
		select {
		case <-newer:
		case <-wt.done:
			in = true
		case <-timeout.C:
			t.Fatalf("%s neither stood in line nor returned within %v", name, eventually)
		}
	}
	r.mu.Lock()
	wt.seq = len(r.joined)
	r.joined = append(r.joined, wt)
	r.mu.Unlock()
}

// cancel cancels a waiting call and waits for it to return.
func (r *round) cancel(wt *rwaiter) {
	r.mu.Lock()
	wt.gaveUp, wt.cancelled = time.Now(), true
	r.mu.Unlock()
	wt.cancel()
	select {
	case <-wt.done:
	case <-time.After(eventually):
		r.t.Fatalf("%s of %s still running %v after its ctx was cancelled", r.kind.call, wt.name, eventually)
	}
}

// runWaiter runs wt's call and, if it acquires, watches the guard (State
// samples and events go to the world's history), holds it and releases it.
func (r *round) runWaiter(ctx context.Context, wt *rwaiter) {
	defer wt.proc.calls.Done()
	g, err := wt.call(ctx)
	now := time.Now()
	r.mu.Lock()
	wt.returned, wt.err = now, err
	if g != nil {
		wt.token = g.Token()
	} else if wt.gaveUp.IsZero() {
		wt.gaveUp = now
	}
	r.mu.Unlock()
	var h heldGuard
	var hl *holding
	switch {
	case g != nil && r.kind.watch != nil:
		h = r.kind.watch(wt, g)
	case g != nil:
		c := &client{w: r.w, name: wt.name}
		if r.kind.modeOf != nil {
			c.mode = r.kind.modeOf(wt.name)
		}
		hl = c.watch(g)
		h = hl
	}
	close(wt.done)
	if h == nil {
		return
	}
	if hl != nil && r.kind.granted != nil {
		r.kind.granted(hl)
	}
	r.hold(wt, h)
}

// heldGuard is a watched guard that a holder releases: a holding, or a
// MultiMutex's guard watched on each of its keys.
type heldGuard interface {
	release() (distlock.State, error)
}

// hold keeps h for wt's hold time, then releases it. A holder in a
// partitioned process waits until the partition ends to release (a release
// that cannot reach Redis leaves the lease to expire, which is a kill's
// business); a holder in a killed process releases at once, into the void,
// and its lease expires on its own; a holder in a process whose requests
// are held releases as usual, and its release lands when the hold ends.
func (r *round) hold(wt *rwaiter, h heldGuard) {
	until := time.Now().Add(wt.hold)
	timer := time.NewTimer(wt.hold)
	defer timer.Stop()
	for {
		r.mu.Lock()
		s, changed := wt.proc.state, wt.proc.changed
		r.mu.Unlock()
		live := s == procUp || s == procHeld || s == procDelayed
		if s == procKilled || (live && !time.Now().Before(until)) {
			break
		}
		var timerC <-chan time.Time
		if live {
			timerC = timer.C
		}
		select {
		case <-timerC:
		case <-changed:
		case <-r.ctx.Done():
			r.release(wt, h)
			return
		}
	}
	r.release(wt, h)
}

// release releases h and notes what Release returned.
func (r *round) release(wt *rwaiter, h heldGuard) {
	st, err := h.release()
	r.mu.Lock()
	defer r.mu.Unlock()
	wt.released = fmt.Sprintf("%v at %s (err %v)", st, time.Now().Format("05.000000"), err)
}

// describe tells what became of the call named name and the faults of the
// last seconds, for failure messages.
func (r *round) describe(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	if wt := r.byName[name]; wt != nil {
		fmt.Fprintf(&b, "%s: process %d, returned %s err %v token %d gave up %s cancelled %v killed %v released %q; ",
			name, wt.proc.idx, wt.returned.Format("05.000000"), wt.err, wt.token, wt.gaveUp.Format("05.000000"),
			wt.cancelled, wt.killed, wt.released)
	}
	for _, f := range r.faults {
		if time.Since(f.start) < 5*time.Second {
			fmt.Fprintf(&b, "%s of %d %s..%s; ", f.kind, f.proc, f.start.Format("05.000000"), f.end.Format("05.000000"))
		}
	}
	return b.String()
}

// sample reads the lease and the line every randomSample until ctx ends.
func (r *round) sample(ctx context.Context) {
	tick := time.NewTicker(randomSample)
	defer tick.Stop()
	for {
		at := time.Now()
		cctx, cancel := context.WithTimeout(ctx, eventually)
		s, err := r.kind.read(cctx, r.admin)
		cancel()
		end := time.Now()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			s.at, s.end = at, end
			r.mu.Lock()
			r.samples = append(r.samples, s)
			close(r.newer)
			r.newer = make(chan struct{})
			r.mu.Unlock()
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// late is how much a bound of promptness over [from, to] is widened: the
// scheduling delay measured meanwhile if the kind says so, else nothing.
func (r *round) late(from, to time.Time) time.Duration {
	if !r.kind.widen {
		return 0
	}
	return r.w.delayed(from, to)
}

// faulted reports whether process p (p < 0: any) had a fault of its own, or
// all had one, within [from, to], counting as part of each fault the
// aftermath that aftermath returns for its kind.
func (r *round) faulted(p int, from, to time.Time, aftermath func(kind string) time.Duration) bool {
	for _, f := range r.faults {
		if p >= 0 && f.proc >= 0 && f.proc != p {
			continue
		}
		if !f.start.After(to) && (f.end.IsZero() || !f.end.Add(aftermath(f.kind)).Before(from)) {
			return true
		}
	}
	return false
}

// shadow is how long a fault keeps the waiters of its process out of the
// checks after it ends: their failed calls are retried within a refresh.
func shadow(string) time.Duration { return randomShadow }

// consequences is how long after a fault ends the lease may still be idle
// because of it: after a kill, the dead holder's lease and grants to dead
// waiters; after other faults, a refresh period or a claim window.
func consequences(kind string) time.Duration {
	if kind == "kill" {
		return randomLookback
	}
	return randomShadow
}

// pausedWithin returns how long Redis was paused within [from, to].
func (r *round) pausedWithin(from, to time.Time) time.Duration {
	var d time.Duration
	for _, f := range r.faults {
		if f.kind != "redis-pause" {
			continue
		}
		end := f.end
		if end.IsZero() {
			end = to
		}
		if lo, hi := later(f.start, from), earlier(end, to); hi.After(lo) {
			d += hi.Sub(lo)
		}
	}
	return d
}

// faultsNear describes the faults that overlap [from, to] or ended at most
// a claim window before, relative to from, for failure messages.
func (r *round) faultsNear(from, to time.Time) []string {
	var out []string
	for _, f := range r.faults {
		if !f.start.After(to) && (f.end.IsZero() || !f.end.Add(randomClaim).Before(from)) {
			who := "all"
			if f.proc >= 0 {
				who = r.procs[f.proc].name
			}
			out = append(out, fmt.Sprintf("%s of %s %v..%v", f.kind, who,
				f.start.Sub(from).Round(time.Millisecond), f.end.Sub(from).Round(time.Millisecond)))
		}
	}
	return out
}

// faultsAt describes the faults that overlap [from, to], with their
// times on the wall clock, for failure messages.
func (r *round) faultsAt(from, to time.Time) []string {
	var out []string
	for _, f := range r.faults {
		if !f.start.After(to) && (f.end.IsZero() || !f.end.Before(from)) {
			out = append(out, fmt.Sprintf("%s of %d %s..%s", f.kind, f.proc, f.start.Format("05.000000"), f.end.Format("05.000000")))
		}
	}
	return out
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// pendingThrough reports whether x's call was still waiting at t: it had
// neither returned nor been given up.
func pendingThrough(x *rwaiter, t time.Time) bool {
	return (x.returned.IsZero() || x.returned.After(t)) && (x.gaveUp.IsZero() || x.gaveUp.After(t))
}

// placeHeld reports whether the calls of a waiter prove that its place in
// line was alive throughout [from, to]: at every instant some call of it
// that left it in line had been answered, and had been sent less than a
// claim window before. (Its place lapses a claim window after Redis ran the
// call, which was after the call was sent.) calls are those that left it in
// line.
func placeHeld(calls []wireCall, claim time.Duration, from, to time.Time) bool {
	type span struct{ lo, hi time.Time }
	var spans []span
	for _, c := range calls {
		spans = append(spans, span{c.end, c.start.Add(claim - clockSlop)})
	}
	slices.SortFunc(spans, func(a, b span) int { return a.lo.Compare(b.lo) })
	covered := from
	for _, s := range spans {
		if s.lo.After(covered) {
			break
		}
		covered = later(covered, s.hi)
		if covered.After(to) {
			return true
		}
	}
	return false
}

// describeCalls lists a waiter's calls that overlap [from, to], for
// failure messages.
func describeCalls(calls []wireCall, from, to time.Time) string {
	var b strings.Builder
	for _, c := range calls {
		if c.end.Before(from) || c.start.After(to) {
			continue
		}
		fmt.Fprintf(&b, "[%s..%s ok=%v err=%v] ", c.start.Format("05.000000"), c.end.Format("05.000000"), c.ok, c.err)
	}
	return b.String()
}

// The checks of the line.

// lineRecord is how a test's record of the wire answers the checks of the
// line.
type lineRecord interface {
	// inLine returns the acquire calls of the waiter named name that left
	// it standing in line.
	inLine(name string) []wireCall
	// firstGrant returns the token of the grant that W2 orders x by, and
	// whether a release passed it (so that its time is known exactly).
	firstGrant(x *rwaiter) (token int64, passed, ok bool)
	// grantedFirst reports whether a was granted before b's grant at g, of
	// token token (or in the same step).
	grantedFirst(a *rwaiter, g time.Time, token int64) bool
	// releases returns the release calls that deleted their value.
	releases() []releaseCallOf
	// grantedWithin reports whether the record shows a grant to x that a
	// release may have made within [from, to] (which takes x out of line).
	grantedWithin(x *rwaiter, from, to time.Time) bool
	// lastPass returns the last grant a release passed to x before the one
	// its guard holds, and the process that made the release.
	lastPass(x *rwaiter) (token int64, from int, ok bool)
	// describe lists every call of the waiter named name and every grant
	// to it, for failure messages.
	describe(name string) string
}

// releaseCallOf is a release call that deleted its value, and whether it
// passed anything on.
type releaseCallOf struct {
	value      string
	start, end time.Time
	passed     bool
}

// checkGiveUps checks W3: a cancelled call returned promptly.
func (r *round) checkGiveUps() {
	var worst time.Duration
	var late []string
	for _, wt := range r.waiters {
		if !wt.cancelled || wt.token != 0 || wt.returned.Before(wt.gaveUp) {
			continue
		}
		d := wt.returned.Sub(wt.gaveUp)
		worst = max(worst, d)
		if bound := randomGiveUp + r.late(wt.gaveUp, wt.returned); d > bound {
			late = append(late, fmt.Sprintf("%s returned %v after its ctx was cancelled, bound %v (faults near: %v)",
				wt.name, d, bound, r.faultsNear(wt.gaveUp, wt.returned)))
		}
	}
	figure(r.t, r.kind.figure+"-W3", "give_up_max", worst, "bound", randomGiveUp)
	assert.Empty(r.t, late, "W3: cancelled %s calls returned late (bound %v)", r.kind.call, randomGiveUp)
}

// checkOrder checks W2: no waiter B was granted while a waiter A that had
// joined the line before B was still waiting with a live place and had not
// been granted yet. The grant to B happened at its token's server time G
// (tokens are the server's clock in µs, and Redis runs on this machine's
// clock) when a release passed it; if it came from B's own call instead, a
// grant passed to B earlier may be what that call claimed, so the grant is
// only known to lie between B's last call that left it in line and G. A is
// excused if it had given up before G, or if its calls do not prove its
// place alive throughout that interval: a lapsed place is skipped, by
// design, until its waiter refreshes it (then with its old ticket, so at
// its old place).
func (r *round) checkOrder(rec lineRecord) {
	var breaches []string
	excused := map[string]int{}
	overtakes := 0
	for _, b := range r.joined {
		token, passed, ok := rec.firstGrant(b)
		if !ok {
			continue
		}
		g := time.UnixMicro(token)
		lo := g
		if !passed {
			lo = b.start
			for _, c := range rec.inLine(b.name) {
				if c.end.Before(g) {
					lo = later(lo, c.start)
				}
			}
		}
		for _, a := range r.joined[:b.seq] {
			if rec.grantedFirst(a, g, token) {
				continue // a got it first
			}
			if !a.gaveUp.IsZero() && a.gaveUp.Before(g.Add(clockSlop)) {
				continue // a had left (or was leaving) when b was granted
			}
			overtakes++
			calls := rec.inLine(a.name)
			if placeHeld(calls, randomClaim, lo.Add(-clockSlop), g.Add(clockSlop)) {
				breaches = append(breaches, fmt.Sprintf("%s (token %d) got %s at %s although %s, ahead of it in line, "+
					"was waiting with a live place (calls %s)", b.name, token, r.kind.unit, g.Format("15:04:05.000000"), a.name,
					describeCalls(calls, lo.Add(-randomClaim), g)))
				r.t.Logf("W2 breach: %s; %s; faults near: %v", rec.describe(a.name), rec.describe(b.name),
					r.faultsAt(lo.Add(-randomClaim), g))
				continue
			}
			switch {
			case r.faulted(a.proc.idx, lo.Add(-randomClaim), g, shadow):
				excused["faulted"]++
				if excused["faulted"] <= 3 {
					r.t.Logf("W2: %s overtook %s, whose place may have lapsed (faults near: %v; its calls %s)",
						b.name, a.name, r.faultsNear(lo.Add(-randomClaim), g), describeCalls(calls, lo.Add(-randomClaim), g))
				}
			default:
				excused["quiet"]++
				r.t.Logf("W2: %s overtook %s, whose place may have lapsed without a fault (calls %s)",
					b.name, a.name, describeCalls(calls, lo.Add(-randomClaim), g))
			}
		}
	}
	figure(r.t, r.kind.figure+"-W2", "overtakes", overtakes, "excused_faulted", excused["faulted"], "excused_quiet", excused["quiet"],
		"breaches", len(breaches))
	assert.Empty(r.t, breaches, "W2: waiters overtaken while waiting with a live place")
}

// checkPasses checks the step W1 rests on: a release (or a cancel) that
// deleted its value while a live waiter stood in line passed what it held
// on in the same script (for a semaphore: since at most N-1 holders were
// left). A waiter counts if the last sample before the release was sent
// shows it in line, its process had no fault, it was still waiting when
// the release returned, no release passed it anything meanwhile (which
// takes it out of line), and its calls prove its place alive when the
// release ran (see placeHeld). This needs no timing margin.
func (r *round) checkPasses(rec lineRecord) { r.checkPassesOf(rec, r.samples, r.kind.figure) }

// checkPassesOf is checkPasses on the samples of one lease (a MultiMutex's
// round has one line per name), with figure lines under scenario.
func (r *round) checkPassesOf(rec lineRecord, samples []lineSample, scenario string) {
	var breaches []string
	releases, passed, checked := 0, 0, 0
	for _, c := range rec.releases() {
		releases++
		if c.passed {
			passed++
			continue
		}
		i := sort.Search(len(samples), func(i int) bool { return !samples[i].end.Before(c.start) }) - 1
		if i < 0 {
			continue
		}
		s := samples[i]
		releaser := lease.Owner(c.value)
		for _, v := range s.line {
			x := r.byName[lease.Owner(v)]
			if x == nil || x.name == releaser || !pendingThrough(x, c.end) || r.faulted(x.proc.idx, s.at, c.end, shadow) {
				continue
			}
			if rec.grantedWithin(x, s.at.Add(-randomClaim), c.end) {
				continue
			}
			checked++
			if placeHeld(rec.inLine(x.name), randomClaim, c.start.Add(-clockSlop), c.end.Add(clockSlop)) {
				breaches = append(breaches, fmt.Sprintf("%s's release at %s freed %s and passed nothing on, "+
					"while %s waited in line with a live place", releaser, c.start.Format("15:04:05.000000"), r.kind.unit, x.name))
				r.t.Logf("W1 pass breach: release [%s..%s]; line %v in the sample %s..%s; %s; %s; %s; faults near: %v",
					c.start.Format("05.000000"), c.end.Format("05.000000"), s.line, s.at.Format("05.000000"), s.end.Format("05.000000"),
					rec.describe(x.name), rec.describe(releaser), r.describe(x.name), r.faultsAt(s.at.Add(-randomClaim), c.end))
				break
			}
		}
	}
	figure(r.t, scenario+"-passes", "releases", releases, "passed", passed, "unpassed_with_waiters_checked", checked,
		"breaches", len(breaches))
	assert.Empty(r.t, breaches, "W1: releases that freed %s and left a live waiter in line", r.kind.unit)
}

// checkIdle checks W1. An idle stretch is a run of samples in which fewer
// than N live leases were held (a lease passed to a waiter that had given
// up or died does not count) while a live waiter of an unfaulted process
// stood in line; its length is counted from the end of its first sample to
// the start of its last, which the real idle time cannot be shorter than.
// Away from faults it may last randomIdleQuiet, after one randomIdleFaulted
// plus any Redis pause (for the semaphore, both widened by the scheduling
// delay measured over the stretch). It also checks that, away from faults,
// a waiter's call returned soon after a release passed it the grant.
func (r *round) checkIdle(rec lineRecord) { r.checkIdleOf(rec, r.samples, r.kind.figure) }

// checkIdleOf is checkIdle on the samples of one lease (a MultiMutex's
// round has one line per name), with figure lines under scenario.
func (r *round) checkIdleOf(rec lineRecord, samples []lineSample, scenario string) {
	t := r.t
	dead := func(v string, at time.Time) bool {
		x := r.byName[lease.Owner(v)]
		return x != nil && x.token == 0 && !x.gaveUp.IsZero() && x.gaveUp.Before(at)
	}
	idle := func(s lineSample) bool {
		live := 0
		for _, h := range s.holders {
			if !dead(h.Value, s.at) {
				live++
			}
		}
		if live >= r.permits {
			return false
		}
		for _, v := range s.line {
			x := r.byName[lease.Owner(v)]
			if x == nil || !x.start.Before(s.at) {
				continue
			}
			if (!x.returned.IsZero() && !x.returned.After(s.end)) || (!x.gaveUp.IsZero() && !x.gaveUp.After(s.end)) {
				continue
			}
			if !r.faulted(x.proc.idx, s.at, s.end, shadow) {
				return true
			}
		}
		return false
	}
	var breaches []string
	var worstQuiet, worstFaulted time.Duration
	stretches := 0
	for i := 0; i < len(samples); {
		if !idle(samples[i]) {
			i++
			continue
		}
		j := i
		for j+1 < len(samples) && idle(samples[j+1]) {
			j++
		}
		first, last := samples[i], samples[j]
		d := last.at.Sub(first.end)
		stretches++
		late := r.late(first.at, last.end)
		if r.faulted(-1, first.at, last.end, consequences) {
			worstFaulted = max(worstFaulted, d)
			if bound := randomIdleFaulted + r.pausedWithin(first.at, last.end) + late; d > bound {
				breaches = append(breaches, fmt.Sprintf("%s free for %v (bound %v after a fault) from %s, holders %v, line %v",
					r.kind.unit, d, bound, first.at.Format("15:04:05.000"), first.holders, first.line))
			}
		} else {
			worstQuiet = max(worstQuiet, d)
			if bound := randomIdleQuiet + late; d > bound {
				breaches = append(breaches, fmt.Sprintf("%s free for %v (bound %v, no fault near) from %s, holders %v, line %v",
					r.kind.unit, d, bound, first.at.Format("15:04:05.000"), first.holders, first.line))
			}
		}
		i = j + 1
	}

	// The hand-off: from the last grant a release passed to the waiter
	// before its guard's (a waiter that woke late claims it with a new
	// token, which does not hide the delay here) to the return of its call.
	// A release made in another process can only wake the waiter through
	// the announcement; those are the ones whose median is checked, each
	// less the scheduling delay measured over it if the kind widens.
	var worst time.Duration
	var remote []time.Duration
	handOffs := 0
	for _, x := range r.waiters {
		if x.token == 0 {
			continue
		}
		token, from, ok := rec.lastPass(x)
		if !ok {
			continue // it acquired by its own call
		}
		g := time.UnixMicro(token)
		if r.faulted(x.proc.idx, g, x.returned, shadow) {
			continue
		}
		d := x.returned.Sub(g)
		late := r.late(g, x.returned)
		handOffs++
		worst = max(worst, d)
		if from != x.proc.idx {
			remote = append(remote, max(d-late, 0))
		}
		if bound := randomHandOff + late; d > bound {
			breaches = append(breaches, fmt.Sprintf("%s returned %v after %s was passed to it (token %d), bound %v, no fault near",
				x.name, d, r.kind.unit, token, bound))
		}
	}
	var median time.Duration
	if len(remote) > 0 {
		slices.Sort(remote)
		median = remote[len(remote)/2]
	}
	if len(remote) >= randomMedianOf && median > randomHandOffMedian {
		breaches = append(breaches, fmt.Sprintf("the median hand-off from another process, no fault near, took %v "+
			"(of %d)", median, len(remote)))
	}
	figure(t, scenario+"-W1", "idle_stretches", stretches, "handoffs_quiet", handOffs, "handoffs_remote_quiet", len(remote),
		"handoff_median_remote_quiet", median, "idle_max_quiet", worstQuiet, "idle_max_faulted", worstFaulted,
		"handoff_max_quiet", worst, "bound_quiet", randomIdleQuiet, "bound_faulted", randomIdleFaulted)
	assert.Empty(t, breaches, "W1: %s sat idle while a live waiter stood in line", r.kind.unit)
}

// checkLeftovers checks W5 once everyone has left: no keys of the lease
// but kept (a killed waiter's place is gone at the latest a claim window
// after its last refresh, when the queue keys expire; void keys after
// their TTL; an ended lease of a semaphore stays in its set until a script
// drops it, and the set expires when its last lease has ended: a TTL at
// most), and no wake subscriptions once the rooms' linger has passed; with
// rooms, no waiting rooms either.
func (r *round) checkLeftovers(keys lease.Keys, rooms bool, kept ...string) {
	t, srv := r.t, r.w.srv
	left := func() []string {
		all, err := srv.MustDo("KEYS", keys.Lease+"*").AsStrSlice()
		require.NoError(t, err)
		return slices.DeleteFunc(all, func(k string) bool { return slices.Contains(kept, k) })
	}
	// Either kind, where the server has both (Redis 6.2 has plain
	// channels alone).
	subscriptions := func() []string {
		plain, err := srv.MustDo("PUBSUB", "CHANNELS", keys.Wake+":*").AsStrSlice()
		require.NoError(t, err)
		if !srv.Has(redistest.ShardedPubSub) {
			return plain
		}
		sharded, err := srv.MustDo("PUBSUB", "SHARDCHANNELS", keys.Wake+":*").AsStrSlice()
		require.NoError(t, err)
		return append(sharded, plain...)
	}
	roomsLeft := func() int {
		if !rooms {
			return 0
		}
		return distlock.RoomsOf(keys.Lease)
	}
	// Bounds of promptness: widened by the scheduling delay meanwhile
	// (world.poll), as a loaded machine runs the expiry's observer late.
	start := time.Now()
	if !r.w.poll(safetyTTL+slack, func() bool { return len(left()) == 0 }) {
		t.Errorf("W5: the keys of %s did not go within %v (and %v for the scheduling delay); left: %v",
			keys.Lease, safetyTTL+slack, r.w.delayed(start, time.Now()), left())
	}
	start = time.Now()
	if !r.w.poll(eventually, func() bool { return len(subscriptions()) == 0 && roomsLeft() == 0 }) {
		t.Errorf("W5: wake subscriptions or waiting rooms did not end within %v (and %v for the scheduling delay); "+
			"left: subscriptions %v, rooms %d", eventually, r.w.delayed(start, time.Now()), subscriptions(), roomsLeft())
	}
}
