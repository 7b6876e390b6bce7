package distlock_test

// The randomized protocol test of the Semaphore (issue 11), after
// TestRandomProtocol (protocol_random_test.go), whose moves and faults it
// repeats.
//
// A round picks N, 2 or 3 permits, from its seed. Several processes (each
// its own rueidis client behind its own fault proxy) start Acquire calls,
// more of them at once than there are permits; the driver cancels waiting
// calls, kills a process (cuts its proxy both ways and gives up its calls),
// partitions a process for a while, drops every subscription (CLIENT KILL
// TYPE pubsub), resets a process's connections and pauses Redis (SIGSTOP)
// for less than the TTL. A call that gets a permit holds it a random moment
// and releases it, while its guard's State is sampled every few
// milliseconds. A sampler reads the holders (with what is left of each
// lease), the last fencing token and the line from Redis every few
// milliseconds; a wire recorder in each process records every lease script
// call and its reply, every pass of a release included.
//
// Afterwards it checks:
//   - Safety, strictly (load excuses nothing here): no guard reported
//     Acquired past the deadline that Redis's confirmed writes of its value
//     allow (L1, history.Check); at no moment did more than N guards hold,
//     counting for each guard the span from its grant to its last sample
//     that said Acquired, over which its permit was alive in Redis
//     (checkAtMostN); Redis never listed more than N live holders; every
//     grant carried a token never issued before, above every token granted
//     by a call answered before it was sent, above the last token Redis
//     showed before it was sent and no higher than the one Redis showed
//     after its reply (checkTokens).
//   - W2 order (checkOrder): no waiter got a permit while one that joined
//     the line before it still waited with a place its calls prove alive.
//   - W1 no idle permit: a release that freed a permit while a live waiter
//     stood in line passed it on in the same script (checkPasses); fewer
//     than N live leases never lasted while a live waiter of an unfaulted
//     process stood in line beyond a bound (a push and a round trip away
//     from faults, claim windows after one); a waiter a release passed a
//     permit to returned soon after (checkIdle); a lease that ended
//     (a dead holder's, or a lapsed pass) went to the live waiter first in
//     line within a refresh period, usually at once (checkEndedLeases).
//   - W3: a cancelled Acquire returned at once (checkGiveUps).
//   - W5: once everyone had left, no holders, queue keys, void keys, wake
//     subscriptions or waiting rooms remained (checkLeftovers; goroutines:
//     TestMain).
// Bounds of promptness are widened by what the scheduling probe measured
// over the span they bound (world.delayed); bounds of safety never are.
//
// DISTLOCK_RANDOM_SEED=s replays the random draws (as for
// TestRandomProtocol), DISTLOCK_RANDOM_OPS sets the number of moves and
// DISTLOCK_SOAK=n runs n rounds with the seeds s, s+1, ...

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/history"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// The shape of a round of TestRandomSemaphore; the timing bounds are those
// of TestRandomProtocol (randomIdleQuiet and the rest).
const (
	semRandomOps        = 250 // moves per round by default
	semRandomMinPermits = 2
	semRandomMaxPermits = 3
	semRandomName       = "semrandom" // the semaphore's name; its keys are this test's alone
	// semRandomMaxHold is longer than the lock test's holds, so that with
	// N holders at once a line still forms: a waiter joins every 15ms or
	// so, and a permit is held 90ms on average.
	semRandomMaxHold = 180 * time.Millisecond
)

// TestRandomSemaphore runs randomized rounds of Acquire calls, releases,
// cancellations, kills, partitions, subscription drops and Redis pauses on
// a Semaphore of 2 or 3 permits, and checks on what happened that at most N
// guards held at once, L1 and token order, W1, W2, W3 and W5. See the top
// of this file.
func TestRandomSemaphore(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(randomSeedVar); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "%s=%q", randomSeedVar, v)
		seed = n
	}
	ops := semRandomOps
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
			runSemRound(t, s, ops)
		})
	}
}

// semProc is a process of a round: one rueidis client behind one proxy.
type semProc struct {
	idx   int
	name  string
	proxy *faultproxy.Proxy
	wire  *semWire
	calls sync.WaitGroup // its Acquire calls and their holds
	// Guarded by semRound.mu:
	state   procState
	changed chan struct{} // closed and replaced at every change of state
}

// semWaiter is one Acquire call, with its own owner id (so that the
// holders and the line name it) and its own Semaphore.
type semWaiter struct {
	name   string
	proc   *semProc
	sem    *distlock.Semaphore
	cancel context.CancelFunc
	hold   time.Duration
	start  time.Time
	done   chan struct{} // closed when Acquire has returned

	// Guarded by semRound.mu:
	seq       int // order of joining the line; -1 until then
	returned  time.Time
	err       error
	token     int64
	gaveUp    time.Time
	cancelled bool
	killed    bool
}

// semSample is one read of the holders, the fence and the line.
type semSample struct {
	at, end time.Time
	fence   int64
	holders []lease.Holding // live leases only, with what is left of each
	line    []string
}

// has reports whether name stands in line.
func (s *semSample) has(name string) bool {
	return slices.ContainsFunc(s.line, func(v string) bool { return lease.Owner(v) == name })
}

// semRound is one randomized run.
type semRound struct {
	t       *testing.T
	w       *world
	keys    lease.Keys
	permits int
	rng     *rand.Rand // the driver's only
	ctx     context.Context
	procs   []*semProc
	admin   rueidis.Client

	wg      sync.WaitGroup // the waiters (and their holds) and the sampler
	faultWG sync.WaitGroup // the goroutines that end faults

	mu       sync.Mutex
	waiters  []*semWaiter
	joined   []*semWaiter
	byName   map[string]*semWaiter
	faults   []faultSpan
	paused   bool
	samples  []semSample
	newer    chan struct{}
	nextName int
	moves    map[string]int
}

// semSampleScript reads, in one step, the last token, the live holders with
// what is left of each lease (ms), and the line.
const semSampleScript = `
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local h = {}
if redis.call('TYPE', KEYS[1]).ok == 'zset' then
  local r = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
  for i = 1, #r, 2 do
    table.insert(h, r[i])
    table.insert(h, string.format('%.0f', tonumber(r[i + 1]) - now))
  end
end
return {redis.call('GET', KEYS[2]) or '', h, redis.call('ZRANGE', KEYS[3], 0, -1)}
`

func runSemRound(t *testing.T, seed uint64, ops int) {
	w := newWorld(t, safetyTTL)
	w.lock = semRandomName
	keys, err := lease.NewKeys(distlock.DefaultNamespace, w.lock)
	require.NoError(t, err)
	w.key = keys.Lease
	ctx, cancel := context.WithCancel(context.Background())
	r := &semRound{
		t: t, w: w, keys: keys, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), ctx: ctx,
		admin:  redistest.NewClient(t, rueidis.ClientOption{InitAddress: []string{w.srv.Addr()}, DisableCache: true}),
		byName: make(map[string]*semWaiter), newer: make(chan struct{}), moves: make(map[string]int),
	}
	r.permits = semRandomMinPermits + r.rng.IntN(semRandomMaxPermits-semRandomMinPermits+1)
	t.Logf("%d permits", r.permits)
	for i := range randomProcs {
		name := fmt.Sprintf("p%d", i)
		p := faultproxy.New(t, w.srv.Addr())
		rc := redistest.NewClient(t, rueidis.ClientOption{InitAddress: []string{p.Addr()}, DisableCache: true})
		openConnections(t, rc)
		r.procs = append(r.procs, &semProc{idx: i, name: name, proxy: p, wire: &semWire{Client: rc}, changed: make(chan struct{})})
	}
	t.Cleanup(func() {
		cancel()
		r.faultWG.Wait()
		r.wg.Wait()
	})
	sampling, stopSampling := context.WithCancel(ctx)
	r.wg.Go(func() { r.sample(sampling) })

	began := time.Now()
	calm := false
	for i := range ops {
		if i%randomPhase == 0 {
			calm = r.rng.IntN(2) == 0
		}
		r.move(calm)
	}
	moved := time.Since(began)

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
	drainedIn := time.Since(began) - moved
	stopSampling()
	r.wg.Wait()

	calls := r.calls()
	report := r.checkL1(calls)
	r.checkAtMostN()
	r.checkTokens(calls)
	r.checkGiveUps()
	r.checkOrder(calls)
	r.checkPasses(calls)
	r.checkIdle(calls)
	r.checkEndedLeases(calls)
	r.checkLeftovers()

	var acquired, cancelled, killed, failed int
	for _, wt := range r.waiters {
		if wt.err != nil && !wt.cancelled && !wt.killed {
			t.Logf("Acquire of %s failed after %v: %v (faults near: %v)", wt.name, wt.returned.Sub(wt.start), wt.err,
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
	longest, most := 0, 0
	for _, s := range r.samples {
		longest, most = max(longest, len(s.line)), max(most, len(s.holders))
	}
	figure(t, "random-sem", "seed", seed, "permits", r.permits, "moves", ops, "moving", moved, "draining", drainedIn,
		"waiters", len(r.waiters), "acquired", acquired, "cancelled", cancelled, "killed", killed, "failed", failed,
		"line_max", longest, "holders_max", most, "samples", len(r.samples), "l1_unchecked", report.Unchecked,
		"worst_sched_delay", w.probe.worst())
	t.Logf("moves: %v", r.moves)
}

func (r *semRound) allWaiters() []*semWaiter {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.waiters)
}

func (r *semRound) pending() []string {
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

// move makes one random move, with the odds of round.move except that a
// kill is likelier (40 in a thousand rather than 15), for the sake of
// leases that end without a release (checkEndedLeases).
func (r *semRound) move(calm bool) {
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
	case n < 740:
		if p := r.pickProc(procUp); p != nil && r.killable() {
			r.kill(p)
		}
	default:
		gap *= 4
	}
	select {
	case <-time.After(gap):
	case <-t.Context().Done():
	}
}

// fault is round.fault for this round.
func (r *semRound) fault(kind string, proc int, begin func(), d time.Duration, end func()) {
	r.moves[kind]++
	r.mu.Lock()
	i := len(r.faults)
	r.faults = append(r.faults, faultSpan{kind: kind, proc: proc, start: time.Now()})
	r.mu.Unlock()
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

func (r *semRound) endFault(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults[i].end = time.Now()
}

// kill is round.kill for this round: the process's proxy drops everything,
// its waiting calls are given up, its holders release into the void, and
// after randomKilledFor it comes back as a new process.
func (r *semRound) kill(p *semProc) {
	r.moves["kill"]++
	r.mu.Lock()
	i := len(r.faults)
	r.faults = append(r.faults, faultSpan{kind: "kill", proc: p.idx, start: time.Now()})
	r.mu.Unlock()
	p.proxy.SetBoth(faultproxy.Blackhole)
	var victims []*semWaiter
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

func (r *semRound) killable() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.procs {
		if p.state == procKilled {
			return false
		}
	}
	return true
}

func (r *semRound) setState(p *semProc, s procState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.setStateLocked(p, s)
}

func (r *semRound) setStateLocked(p *semProc, s procState) {
	p.state = s
	close(p.changed)
	p.changed = make(chan struct{})
}

func (r *semRound) pickProc(s procState) *semProc {
	r.mu.Lock()
	var in []*semProc
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

func (r *semRound) pickWaiting() *semWaiter {
	r.mu.Lock()
	var in []*semWaiter
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

// join starts an Acquire call in process p and waits until it stands in
// line or has returned, so that the order of joining is the order of the
// places in line.
func (r *semRound) join(p *semProc) {
	t := r.t
	r.mu.Lock()
	r.nextName++
	name := fmt.Sprintf("%s.w%d", p.name, r.nextName)
	r.mu.Unlock()
	s, err := distlock.NewSemaphore(p.wire, r.w.lock, r.permits, distlock.WithTTL(r.w.ttl), distlock.WithOwner(name))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(r.ctx)
	wt := &semWaiter{
		name: name, proc: p, sem: s, cancel: cancel, hold: time.Duration(r.rng.Int64N(int64(semRandomMaxHold))),
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

func (r *semRound) cancel(wt *semWaiter) {
	r.mu.Lock()
	wt.gaveUp, wt.cancelled = time.Now(), true
	r.mu.Unlock()
	wt.cancel()
	select {
	case <-wt.done:
	case <-time.After(eventually):
		r.t.Fatalf("Acquire of %s still running %v after its ctx was cancelled", wt.name, eventually)
	}
}

// runWaiter runs wt's Acquire call and, if it gets a permit, watches the
// guard (State samples and events go to the world's history), holds the
// permit and releases it.
func (r *semRound) runWaiter(ctx context.Context, wt *semWaiter) {
	defer wt.proc.calls.Done()
	g, err := wt.sem.Acquire(ctx)
	now := time.Now()
	r.mu.Lock()
	wt.returned, wt.err = now, err
	if g != nil {
		wt.token = g.Token()
	} else if wt.gaveUp.IsZero() {
		wt.gaveUp = now
	}
	r.mu.Unlock()
	var h *holding
	if g != nil {
		h = (&client{w: r.w, name: wt.name}).watch(g)
	}
	close(wt.done)
	if h != nil {
		r.hold(wt, h)
	}
}

// hold is round.hold for this round.
func (r *semRound) hold(wt *semWaiter, h *holding) {
	until := time.Now().Add(wt.hold)
	timer := time.NewTimer(wt.hold)
	defer timer.Stop()
	for {
		r.mu.Lock()
		s, changed := wt.proc.state, wt.proc.changed
		r.mu.Unlock()
		if s == procKilled || (s == procUp && !time.Now().Before(until)) {
			break
		}
		var timerC <-chan time.Time
		if s == procUp {
			timerC = timer.C
		}
		select {
		case <-timerC:
		case <-changed:
		case <-r.ctx.Done():
			_, _ = h.release()
			return
		}
	}
	_, _ = h.release()
}

// sample reads the holders, the fence and the line every randomSample
// until ctx ends.
func (r *semRound) sample(ctx context.Context) {
	script := rueidis.NewLuaScript(semSampleScript)
	tick := time.NewTicker(randomSample)
	defer tick.Stop()
	for {
		at := time.Now()
		cctx, cancel := context.WithTimeout(ctx, eventually)
		arr, err := script.Exec(cctx, r.admin, []string{r.keys.Lease, r.keys.Fence, r.keys.Queue}, nil).ToArray()
		cancel()
		end := time.Now()
		if ctx.Err() != nil {
			return
		}
		if err == nil && len(arr) == 3 {
			s := semSample{at: at, end: end}
			if f, _ := arr[0].ToString(); f != "" {
				s.fence, _ = strconv.ParseInt(f, 10, 64)
			}
			hs, _ := arr[1].AsStrSlice()
			for i := 0; i+1 < len(hs); i += 2 {
				ms, _ := strconv.ParseInt(hs[i+1], 10, 64)
				s.holders = append(s.holders, lease.Holding{Value: hs[i], TTL: time.Duration(ms) * time.Millisecond})
			}
			s.line, _ = arr[2].AsStrSlice()
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

// faulted is round.faulted for this round.
func (r *semRound) faulted(p int, from, to time.Time, aftermath func(kind string) time.Duration) bool {
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

func (r *semRound) pausedWithin(from, to time.Time) time.Duration {
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

func (r *semRound) faultsNear(from, to time.Time) []string {
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

// The wire.

// semPass is a permit that a script passed to a waiter in line.
type semPass struct {
	value string
	token int64
}

// semCall is one lease script call of a semaphore, with its reply.
type semCall struct {
	wireCall           // kind, value, ttl, claim, times, ok (granted, renewed, deleted), err, token (acquire)
	proc     int       // the process that made it
	fence    int64     // an acquire not granted: the last token issued when it ran
	rank     int64     // an acquire not granted: the caller's place in line, -1 if none
	passes   []semPass // a release: every permit it passed, in order
}

// inLine reports whether c is an acquire call that left its caller standing
// in line (it ran before any grant to that value that it did not see, and
// before the place lapsed).
func (c semCall) inLine() bool {
	return c.kind == acquireCall && c.claim > 0 && c.done && c.err == nil && !c.ok && c.rank >= 0
}

// semWire wraps a rueidis client and records every lease script call that
// goes through it, with its reply as the semaphore's scripts shape it.
// (The lock's wire, in safety_harness_test.go, reads the lock's replies.)
type semWire struct {
	rueidis.Client

	mu    sync.Mutex
	calls []semCall
}

// Do runs cmd and records it if it is a lease script.
func (w *semWire) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	wc, ok := classify(cmd.Commands())
	if !ok {
		return w.Client.Do(ctx, cmd)
	}
	c := semCall{wireCall: wc, rank: -1}
	c.start = time.Now()
	res := w.Client.Do(ctx, cmd)
	c.end, c.done = time.Now(), true
	if c.err = res.Error(); c.err == nil {
		if arr, err := res.ToArray(); err == nil && len(arr) > 0 {
			n, _ := arr[0].AsInt64()
			c.ok = n == 1
			switch {
			case c.kind == acquireCall && c.ok && len(arr) > 1:
				c.token, _ = arr[1].AsInt64()
			case c.kind == acquireCall && !c.ok && len(arr) >= 6:
				c.rank, _ = arr[3].AsInt64()
				c.fence, _ = arr[5].AsInt64()
			case c.kind == releaseCall:
				for i := 1; i+2 < len(arr); i += 3 {
					var p semPass
					p.token, _ = arr[i].AsInt64()
					p.value, _ = arr[i+1].ToString()
					c.passes = append(c.passes, p)
				}
			}
		}
	}
	w.mu.Lock()
	w.calls = append(w.calls, c)
	w.mu.Unlock()
	return res
}

// semCalls are the recorded calls of a round, by owner (waiter name), each
// owner's in the order they started, and every grant by token.
type semCalls struct {
	all     []semCall            // every call, in the order they started
	byOwner map[string][]semCall // acquire and renew calls, by the owner of their value
	grants  map[int64]semGrant   // every grant seen in a reply, by token
	// byOwnerGrants are the grants by the owner of their value.
	byOwnerGrants map[string][]semGrant
	// held is, by owner, every sample that listed its value as a holder,
	// with what was left of the lease then.
	held map[string][]heldSeen
}

// heldSeen is a sample's view of one holder.
type heldSeen struct {
	s    semSample
	left time.Duration
}

// semGrant is a grant seen in a reply: to an acquire call's own value, or a
// pass made by a release.
type semGrant struct {
	value string
	token int64
	call  semCall // the call that made it
	pass  bool    // passed by a release
}

// calls gathers the calls of every process.
func (r *semRound) calls() semCalls {
	cs := semCalls{byOwner: make(map[string][]semCall), grants: make(map[int64]semGrant),
		byOwnerGrants: make(map[string][]semGrant), held: make(map[string][]heldSeen)}
	var dup []string
	add := func(g semGrant) {
		if old, ok := cs.grants[g.token]; ok {
			dup = append(dup, fmt.Sprintf("token %d granted to %s and to %s", g.token, old.value, g.value))
		}
		cs.grants[g.token] = g
		cs.byOwnerGrants[lease.Owner(g.value)] = append(cs.byOwnerGrants[lease.Owner(g.value)], g)
	}
	for _, p := range r.procs {
		p.wire.mu.Lock()
		for _, c := range p.wire.calls {
			c.proc = p.idx
			cs.all = append(cs.all, c)
		}
		p.wire.mu.Unlock()
	}
	slices.SortStableFunc(cs.all, func(a, b semCall) int { return a.start.Compare(b.start) })
	for _, c := range cs.all {
		switch c.kind {
		case acquireCall, renewCall:
			cs.byOwner[lease.Owner(c.value)] = append(cs.byOwner[lease.Owner(c.value)], c)
		}
		if c.kind == acquireCall && c.ok {
			add(semGrant{value: c.value, token: c.token, call: c})
		}
		for _, p := range c.passes {
			add(semGrant{value: p.value, token: p.token, call: c, pass: true})
		}
	}
	for _, s := range r.samples {
		for _, h := range s.holders {
			o := lease.Owner(h.Value)
			cs.held[o] = append(cs.held[o], heldSeen{s: s, left: h.TTL})
		}
	}
	assert.Empty(r.t, dup, "L3: a token granted twice")
	return cs
}

// inLineCalls returns the acquire calls of owner that left it in line, as
// the lock's wire calls that placeHeld reads.
func (cs semCalls) inLineCalls(owner string) []wireCall {
	var out []wireCall
	for _, c := range cs.byOwner[owner] {
		if c.inLine() {
			out = append(out, c.wireCall)
		}
	}
	return out
}

// lastInLineBefore returns the send time of owner's last call that left it
// in line before the grant of token (the reply's last token is below it),
// if there is one.
func (cs semCalls) lastInLineBefore(owner string, token int64) (time.Time, bool) {
	var last time.Time
	for _, c := range cs.byOwner[owner] {
		if c.inLine() && c.fence < token && c.start.After(last) {
			last = c.start
		}
	}
	return last, !last.IsZero()
}

// The checks.

// checkL1 adds to the history what Redis confirmed of each guard's value
// (acquire grants and renewals for the TTL from their send time; a permit
// passed to it for the claim window from the latest send time known to
// precede the pass) and checks L1 on it: no guard reported Acquired past
// the deadline those writes allow. The history's overlap and token-order
// checks are the lock's (one holder); checkAtMostN and checkTokens stand
// in for them.
func (r *semRound) checkL1(cs semCalls) history.Report {
	for _, x := range r.waiters {
		if x.token == 0 {
			continue
		}
		confirm := func(at, until time.Time) {
			r.w.rec.Add(history.Op{Kind: history.Confirmed, At: history.At(at), Until: history.At(until),
				Key: r.w.key, Client: x.name, Token: x.token})
		}
		for _, c := range cs.byOwner[x.name] {
			if c.ok && c.done && c.err == nil {
				confirm(c.end, c.start.Add(c.ttl-distlock.Margin(c.ttl)))
			}
		}
		passedOwn := false
		for _, g := range cs.grantsTo(x.name) {
			if !g.pass {
				continue
			}
			passedOwn = passedOwn || g.token == x.token
			from := g.call.start
			if q, ok := cs.lastInLineBefore(x.name, g.token); ok {
				from = later(from, q)
			}
			confirm(g.call.start, from.Add(randomClaim-distlock.Margin(randomClaim)))
		}
		if _, seen := cs.grants[x.token]; !seen && !passedOwn {
			// A permit passed by someone's acquire call, whose reply does
			// not say to whom: it was granted after the waiter's last call
			// that found it in line, and lasted the claim window from then.
			if q, ok := cs.lastInLineBefore(x.name, x.token); ok {
				confirm(time.UnixMicro(x.token), q.Add(randomClaim-distlock.Margin(randomClaim)))
			}
		}
	}
	// Not world.check: its summary counts the lock's overlaps.
	report := history.Check(r.w.rec.Ops())
	r.t.Logf("SAFETY scenario=random-sem acquisitions=%d samples=%d held_samples=%d l1_unchecked=%d l1_violations=%d",
		report.Acquisitions, report.Samples, report.HeldSamples, report.Unchecked, len(report.L1))
	assert.Empty(r.t, report.L1, "L1: guards reported Acquired past the deadline Redis's writes allow")
	assert.Empty(r.t, report.Malformed, "the history contradicts itself")
	return report
}

// grantsTo returns the grants made to owner's values.
func (cs semCalls) grantsTo(owner string) []semGrant { return cs.byOwnerGrants[owner] }

// checkAtMostN checks that no more than N guards held at once. A guard
// held from its grant (its permit was alive in Redis from before Acquire
// returned) to its last State sample that said Acquired: L1 (checked on
// the same history) ties every such sample to a lease Redis still kept,
// and a lease is never revived once it has ended (L4), so the permit was
// alive in Redis throughout. At any instant, then, at most N of these spans
// may overlap; the most overlap at the start of one of them.
func (r *semRound) checkAtMostN() {
	type span struct {
		name     string
		token    int64
		from, to history.Mono
	}
	byAcq := map[string]*span{}
	for _, op := range r.w.rec.Ops() {
		if op.Key != r.w.key {
			continue
		}
		id := fmt.Sprintf("%s/%d", op.Client, op.Token)
		s := byAcq[id]
		if s == nil {
			s = &span{name: op.Client, token: op.Token}
			byAcq[id] = s
		}
		switch {
		case op.Kind == history.Granted:
			s.from = op.At
		case op.Kind == history.Sample && op.Held:
			s.to = max(s.to, op.At)
		}
	}
	var spans []*span
	for _, s := range byAcq {
		if s.from != 0 && s.to >= s.from {
			spans = append(spans, s)
		}
	}
	slices.SortFunc(spans, func(a, b *span) int { return cmp.Compare(a.from, b.from) })
	var breaches []string
	most := 0
	for i, s := range spans {
		var holding []string
		for _, o := range spans[:i+1] {
			if o == s || o.to > s.from {
				holding = append(holding, fmt.Sprintf("%s (token %d, held %v after)", o.name, o.token, o.to.Sub(s.from)))
			}
		}
		most = max(most, len(holding))
		if len(holding) > r.permits {
			breaches = append(breaches, fmt.Sprintf("when %s was granted, %d guards held: %v", s.name, len(holding), holding))
		}
	}
	overfull := 0
	for _, s := range r.samples {
		if len(s.holders) > r.permits {
			overfull++
			if overfull <= 3 {
				breaches = append(breaches, fmt.Sprintf("Redis listed %d live holders at %s: %v",
					len(s.holders), s.at.Format("15:04:05.000"), s.holders))
			}
		}
	}
	figure(r.t, "random-sem-N", "permits", r.permits, "guards", len(spans), "most_at_once", most,
		"overfull_samples", overfull, "breaches", len(breaches))
	assert.Empty(r.t, breaches, "more than %d permits held at once", r.permits)
}

// checkTokens checks L3 in Redis's order of grants: tokens are never
// issued twice (calls), the permits a release passes carry increasing
// tokens, a call sent after another's reply was granted higher tokens than
// that one, a grant's token is above the last token any sample read before
// the call was sent and at most the last token any sample read after its
// reply, the fence never goes back between samples, and every guard's
// token was issued to its own value.
func (r *semRound) checkTokens(cs semCalls) {
	var breaches []string
	for i := 1; i < len(r.samples); i++ {
		if a, b := r.samples[i-1], r.samples[i]; b.fence < a.fence {
			breaches = append(breaches, fmt.Sprintf("the last token went back from %d to %d at %s",
				a.fence, b.fence, b.at.Format("15:04:05.000")))
		}
	}
	for _, c := range cs.all {
		for i := 1; i < len(c.passes); i++ {
			if c.passes[i].token <= c.passes[i-1].token {
				breaches = append(breaches, fmt.Sprintf("a release passed token %d after %d", c.passes[i].token, c.passes[i-1].token))
			}
		}
	}
	checked := 0
	for token, g := range cs.grants {
		// The last sample that ended before the call was sent, and the
		// first that started after its reply.
		i := sort.Search(len(r.samples), func(i int) bool { return !r.samples[i].end.Before(g.call.start) }) - 1
		j := sort.Search(len(r.samples), func(i int) bool { return r.samples[i].at.After(g.call.end) })
		if i >= 0 && r.samples[i].fence >= token {
			breaches = append(breaches, fmt.Sprintf("token %d granted to %s by a call sent at %s, when %d had been issued already",
				token, lease.Owner(g.value), g.call.start.Format("15:04:05.000000"), r.samples[i].fence))
		}
		if j < len(r.samples) && r.samples[j].fence < token {
			breaches = append(breaches, fmt.Sprintf("token %d granted to %s by a call answered at %s, but the last token read after was %d",
				token, lease.Owner(g.value), g.call.end.Format("15:04:05.000000"), r.samples[j].fence))
		}
		checked++
	}
	// Between calls: a grant made by a call sent after another call's
	// reply came ran later in Redis, so its token is above every token that
	// other call was granted.
	var byStart, byEnd []semGrant
	for _, g := range cs.grants {
		byStart, byEnd = append(byStart, g), append(byEnd, g)
	}
	slices.SortFunc(byStart, func(a, b semGrant) int { return a.call.start.Compare(b.call.start) })
	slices.SortFunc(byEnd, func(a, b semGrant) int { return a.call.end.Compare(b.call.end) })
	var highest semGrant
	k := 0
	for _, b := range byStart {
		for ; k < len(byEnd) && byEnd[k].call.end.Before(b.call.start); k++ {
			if byEnd[k].token > highest.token {
				highest = byEnd[k]
			}
		}
		if highest.token >= b.token {
			breaches = append(breaches, fmt.Sprintf("token %d granted to %s by a call sent at %s, after token %d granted to %s "+
				"by a call answered at %s", b.token, lease.Owner(b.value), b.call.start.Format("15:04:05.000000"),
				highest.token, lease.Owner(highest.value), highest.call.end.Format("15:04:05.000000")))
		}
	}
	guards := map[int64]string{}
	for _, x := range r.waiters {
		if x.token == 0 {
			continue
		}
		if other, ok := guards[x.token]; ok {
			breaches = append(breaches, fmt.Sprintf("%s and %s have the same token %d", other, x.name, x.token))
		}
		guards[x.token] = x.name
		if g, ok := cs.grants[x.token]; ok && lease.Owner(g.value) != x.name {
			breaches = append(breaches, fmt.Sprintf("%s holds token %d, which was granted to %s", x.name, x.token, g.value))
		}
	}
	figure(r.t, "random-sem-L3", "grants_seen", len(cs.grants), "checked_against_fence", checked, "guards", len(guards),
		"breaches", len(breaches))
	assert.Empty(r.t, breaches, "L3: token order")
}

// checkGiveUps checks W3: a cancelled Acquire returned at once, within
// randomGiveUp and the scheduling delay measured meanwhile.
func (r *semRound) checkGiveUps() {
	var worst time.Duration
	var late []string
	for _, wt := range r.waiters {
		if !wt.cancelled || wt.token != 0 || wt.returned.Before(wt.gaveUp) {
			continue
		}
		d := wt.returned.Sub(wt.gaveUp)
		worst = max(worst, d)
		if bound := randomGiveUp + r.w.delayed(wt.gaveUp, wt.returned); d > bound {
			late = append(late, fmt.Sprintf("%s returned %v after its ctx was cancelled, bound %v (faults near: %v)",
				wt.name, d, bound, r.faultsNear(wt.gaveUp, wt.returned)))
		}
	}
	figure(r.t, "random-sem-W3", "give_up_max", worst, "bound", randomGiveUp)
	assert.Empty(r.t, late, "W3: cancelled Acquire calls returned late")
}

// grantedBy returns the latest time by which owner's value was first
// granted a permit, as far as the record shows: the tokens of the grants
// seen in replies and of its guard are the server's clock at the grant, and
// a sample that lists it as a holder shows a lease that ends at least a
// claim window after that grant.
func (r *semRound) grantedBy(cs semCalls, x *semWaiter) (time.Time, bool) {
	var at time.Time
	note := func(t time.Time) {
		if at.IsZero() || t.Before(at) {
			at = t
		}
	}
	for _, g := range cs.grantsTo(x.name) {
		note(time.UnixMicro(g.token))
	}
	if x.token != 0 {
		note(time.UnixMicro(x.token))
	}
	if hs := cs.held[x.name]; len(hs) > 0 {
		note(hs[0].grantedBy())
	}
	return at, !at.IsZero()
}

// grantedBy returns the latest time by which the lease that h saw was
// granted: by the end of the sample, and at least a claim window before
// the lease ends (a pass lasts the claim window, a grant or a renewal the
// TTL, which is longer).
func (h heldSeen) grantedBy() time.Time {
	return earlier(h.s.end, h.s.at.Add(h.left-randomClaim+clockSlop))
}

// grantedWithin reports whether the record shows a grant to x's value that
// may have been made within [from, to]: a token of that time, or a lease
// that a sample saw and that may have been granted then.
func (r *semRound) grantedWithin(cs semCalls, x *semWaiter, from, to time.Time) bool {
	in := func(t time.Time) bool { return !t.Before(from.Add(-clockSlop)) && !t.After(to.Add(clockSlop)) }
	for _, g := range cs.grantsTo(x.name) {
		if in(time.UnixMicro(g.token)) {
			return true
		}
	}
	if x.token != 0 && in(time.UnixMicro(x.token)) {
		return true
	}
	for _, h := range cs.held[x.name] {
		if h.s.end.After(from) && !h.grantedBy().After(to.Add(clockSlop)) {
			return true
		}
	}
	return false
}

// checkOrder checks W2, as round.checkOrder does for the lock: no waiter B
// was granted a permit while a waiter A that joined the line before it
// still waited with a place its calls prove alive and had not been granted
// one yet. B's first grant is known at its token's time G when a release
// passed it; otherwise (its own call, which may claim a permit that
// someone's acquire call passed to it unseen) it lies between B's last call
// that left it in line and G.
func (r *semRound) checkOrder(cs semCalls) {
	var breaches []string
	excused := map[string]int{}
	overtakes := 0
	for _, b := range r.joined {
		var first *semGrant
		for _, g := range cs.grantsTo(b.name) {
			if first == nil || g.token < first.token {
				first = &g
			}
		}
		if first == nil {
			continue
		}
		g := time.UnixMicro(first.token)
		lo := g
		if !first.pass {
			lo = b.start
			for _, c := range cs.byOwner[b.name] {
				if c.inLine() && c.end.Before(g) {
					lo = later(lo, c.start)
				}
			}
		}
		for _, a := range r.joined[:b.seq] {
			if at, ok := r.grantedBy(cs, a); ok && !at.After(g.Add(clockSlop)) {
				continue // a got one first (or in the same step)
			}
			if !a.gaveUp.IsZero() && a.gaveUp.Before(g.Add(clockSlop)) {
				continue // a had left, or was leaving
			}
			overtakes++
			if placeHeld(cs.inLineCalls(a.name), randomClaim, lo.Add(-clockSlop), g.Add(clockSlop)) {
				breaches = append(breaches, fmt.Sprintf("%s (token %d) got a permit at %s although %s, ahead of it in line, "+
					"was waiting with a live place", b.name, first.token, g.Format("15:04:05.000000"), a.name))
				continue
			}
			if r.faulted(a.proc.idx, lo.Add(-randomClaim), g, shadow) {
				excused["faulted"]++
			} else {
				excused["quiet"]++
				r.t.Logf("W2: %s overtook %s, whose place may have lapsed without a fault", b.name, a.name)
			}
		}
	}
	figure(r.t, "random-sem-W2", "overtakes", overtakes, "excused_faulted", excused["faulted"], "excused_quiet", excused["quiet"],
		"breaches", len(breaches))
	assert.Empty(r.t, breaches, "W2: waiters overtaken while waiting with a live place")
}

// pendingAt reports whether x's Acquire call was still waiting at t.
func (x *semWaiter) pendingAt(t time.Time) bool {
	return (x.returned.IsZero() || x.returned.After(t)) && (x.gaveUp.IsZero() || x.gaveUp.After(t))
}

// checkPasses checks the step W1 rests on, as round.checkPasses does: a
// release that freed a permit (it held one until the call) while a live
// waiter stood in line passed a permit on in the same script, since at
// most N-1 holders were left. The waiter counts if the last sample before
// the release was sent shows it in line, its process had no fault, it still
// waited when the release returned, no permit was passed to it meanwhile,
// and its calls prove its place alive when the release ran.
func (r *semRound) checkPasses(cs semCalls) {
	var breaches []string
	releases, passed, checked := 0, 0, 0
	for _, c := range cs.all {
		if c.kind != releaseCall || !c.done || c.err != nil || !c.ok {
			continue
		}
		releases++
		if len(c.passes) > 0 {
			passed++
			continue
		}
		i := sort.Search(len(r.samples), func(i int) bool { return !r.samples[i].end.Before(c.start) }) - 1
		if i < 0 {
			continue
		}
		s := r.samples[i]
		releaser := lease.Owner(c.value)
		for _, v := range s.line {
			x := r.byName[lease.Owner(v)]
			if x == nil || x.name == releaser || !x.pendingAt(c.end) || r.faulted(x.proc.idx, s.at, c.end, shadow) {
				continue
			}
			if r.grantedWithin(cs, x, s.at.Add(-randomClaim), c.end) {
				continue // a permit was passed to it meanwhile, which took it out of line
			}
			checked++
			if placeHeld(cs.inLineCalls(x.name), randomClaim, c.start.Add(-clockSlop), c.end.Add(clockSlop)) {
				breaches = append(breaches, fmt.Sprintf("%s's release at %s freed a permit and passed none, "+
					"while %s waited in line with a live place", releaser, c.start.Format("15:04:05.000000"), x.name))
				break
			}
		}
	}
	figure(r.t, "random-sem-passes", "releases", releases, "passed", passed, "unpassed_with_waiters_checked", checked,
		"breaches", len(breaches))
	assert.Empty(r.t, breaches, "W1: releases that freed a permit and left a live waiter in line")
}

// checkIdle checks W1. An idle stretch is a run of samples in which fewer
// than N live leases were held (a lease passed to a waiter that had given
// up or died does not count; one that has ended is not listed) while a live
// waiter of an unfaulted process stood in line. Its length is counted from
// the end of its first sample to the start of its last. Away from faults it
// may last randomIdleQuiet (a release passes in its own script; an ended
// lease is taken by the first in line, who wakes at its end; a waiter that
// gives up passes on what it was granted in a round trip), after a fault
// randomIdleFaulted (a pass to a dead waiter lapses after the claim
// window) plus any Redis pause; both widened by the scheduling delay
// measured over the stretch. It also checks that, away from faults, a
// waiter that a release passed a permit to returned soon after.
func (r *semRound) checkIdle(cs semCalls) {
	t := r.t
	dead := func(v string, at time.Time) bool {
		x := r.byName[lease.Owner(v)]
		return x != nil && x.token == 0 && !x.gaveUp.IsZero() && x.gaveUp.Before(at)
	}
	idle := func(s semSample) bool {
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
	for i := 0; i < len(r.samples); {
		if !idle(r.samples[i]) {
			i++
			continue
		}
		j := i
		for j+1 < len(r.samples) && idle(r.samples[j+1]) {
			j++
		}
		first, last := r.samples[i], r.samples[j]
		d := last.at.Sub(first.end)
		stretches++
		late := r.w.delayed(first.at, last.end)
		if r.faulted(-1, first.at, last.end, consequences) {
			worstFaulted = max(worstFaulted, d)
			if bound := randomIdleFaulted + r.pausedWithin(first.at, last.end) + late; d > bound {
				breaches = append(breaches, fmt.Sprintf("a permit free for %v (bound %v after a fault) from %s, holders %v, line %v",
					d, bound, first.at.Format("15:04:05.000"), first.holders, first.line))
			}
		} else {
			worstQuiet = max(worstQuiet, d)
			if bound := randomIdleQuiet + late; d > bound {
				breaches = append(breaches, fmt.Sprintf("a permit free for %v (bound %v, no fault near) from %s, holders %v, line %v",
					d, bound, first.at.Format("15:04:05.000"), first.holders, first.line))
			}
		}
		i = j + 1
	}

	// The hand-off: from the last permit a release passed to the waiter
	// before its guard's grant to the return of its Acquire call. The median
	// is taken of the hand-offs from other processes (which only the
	// announcement can wake), each less the scheduling delay measured over
	// it.
	var worst time.Duration
	var remote []time.Duration
	handOffs := 0
	for _, x := range r.waiters {
		if x.token == 0 {
			continue
		}
		var last *semGrant
		for _, g := range cs.grantsTo(x.name) {
			if g.pass && g.token <= x.token && (last == nil || g.token > last.token) {
				last = &g
			}
		}
		if last == nil {
			continue
		}
		g := time.UnixMicro(last.token)
		if r.faulted(x.proc.idx, g, x.returned, shadow) {
			continue
		}
		d := x.returned.Sub(g)
		late := r.w.delayed(g, x.returned)
		handOffs++
		worst = max(worst, d)
		if last.call.proc != x.proc.idx {
			remote = append(remote, max(d-late, 0))
		}
		if bound := randomHandOff + late; d > bound {
			breaches = append(breaches, fmt.Sprintf("%s returned %v after a permit was passed to it (token %d), bound %v, no fault near",
				x.name, d, last.token, bound))
		}
	}
	var median time.Duration
	if len(remote) > 0 {
		slices.Sort(remote)
		median = remote[len(remote)/2]
	}
	if len(remote) >= randomMedianOf && median > randomHandOffMedian {
		breaches = append(breaches, fmt.Sprintf("the median hand-off from another process, no fault near, took %v "+
			"beyond the scheduling delay (of %d)", median, len(remote)))
	}
	figure(t, "random-sem-W1", "idle_stretches", stretches, "handoffs_quiet", handOffs, "handoffs_remote_quiet", len(remote),
		"handoff_median_remote_quiet", median, "idle_max_quiet", worstQuiet, "idle_max_faulted", worstFaulted,
		"handoff_max_quiet", worst, "bound_quiet", randomIdleQuiet, "bound_faulted", randomIdleFaulted)
	assert.Empty(t, breaches, "W1: a permit sat idle while a live waiter stood in line")
}

// checkEndedLeases checks the part of W1 that needs no release: a lease
// that ends (its holder died, or a permit passed to a waiter lapsed) frees
// its permit for the first in line as it ends. The first in line asks
// Redis at the end of the lease that ends first (as its last call told
// it), and in any case within a refresh period (half a claim window), so
// when the first in line at the end of a lease is a waiter with a live
// place whose process was not cut off near, it must be granted a permit
// (or have returned) within randomRefresh plus a hand-off, plus any Redis
// pause near, widened by the scheduling delay measured meanwhile. A lease counts as ended when the
// sampler listed it with little left and then no more, and no release of
// its value was sent.
func (r *semRound) checkEndedLeases(cs semCalls) {
	// Releases that may have reached Redis: all but those that failed
	// while their process was cut off (killed or partitioned) throughout.
	released := map[string]bool{}
	for _, c := range cs.all {
		if c.kind == releaseCall && (c.err == nil || !r.cutOff(c.proc, c.start, c.end)) {
			released[c.value] = true
		}
	}
	var breaches []string
	var waits []time.Duration
	ended, checked := 0, 0
	for i := 1; i < len(r.samples); i++ {
		prev, s := r.samples[i-1], r.samples[i]
		for _, h := range prev.holders {
			if released[h.Value] || slices.ContainsFunc(s.holders, func(o lease.Holding) bool { return o.Value == h.Value }) {
				continue
			}
			end := prev.at.Add(h.TTL)
			if end.After(s.end.Add(clockSlop)) {
				continue // gone before its end: dropped by a script on another ground
			}
			ended++
			// The line at the end: the last sample that started before it
			// (a waiter that takes the permit at once is out of line in the
			// next).
			j := sort.Search(len(r.samples), func(k int) bool { return !r.samples[k].at.Before(end) }) - 1
			if j < 0 || len(r.samples[j].line) == 0 {
				continue
			}
			x := r.byName[lease.Owner(r.samples[j].line[0])]
			bound := randomRefresh + randomHandOff
			// A fault elsewhere does not delay the waiter: it asks at the
			// end by its own timer, and a call that fails (a reset, a
			// dropped subscription) is sent again within a refresh period.
			// A fault of its own process's path does, and a Redis pause
			// delays everything by its length.
			if x == nil || !x.start.Before(end) || !x.pendingAt(end) ||
				r.cutOffNear(x.proc.idx, end.Add(-randomShadow), end.Add(bound)) ||
				!placeHeld(cs.inLineCalls(x.name), randomClaim, end.Add(-clockSlop), end.Add(clockSlop)) {
				continue
			}
			bound += r.pausedWithin(end.Add(-randomPauseMax), end.Add(bound+randomPauseMax))
			checked++
			done := x.returned
			if at, ok := r.grantedBy(cs, x); ok && at.After(end.Add(-clockSlop)) && (done.IsZero() || at.Before(done)) {
				done = at
			}
			if done.IsZero() {
				breaches = append(breaches, fmt.Sprintf("%s, first in line when %s's lease ended at %s, was never granted a permit",
					x.name, lease.Owner(h.Value), end.Format("15:04:05.000")))
				continue
			}
			wait := max(done.Sub(end), 0)
			waits = append(waits, wait)
			if bound += r.w.delayed(end, done); wait > bound {
				breaches = append(breaches, fmt.Sprintf("%s, first in line when %s's lease ended at %s, got a permit %v later "+
					"(bound %v)", x.name, lease.Owner(h.Value), end.Format("15:04:05.000"), wait, bound))
			}
		}
	}
	var median, worst time.Duration
	if len(waits) > 0 {
		slices.Sort(waits)
		median, worst = waits[len(waits)/2], waits[len(waits)-1]
	}
	figure(r.t, "random-sem-ended", "ended", ended, "checked", checked, "wait_median", median, "wait_max", worst,
		"bound", randomRefresh+randomHandOff, "breaches", len(breaches))
	assert.Empty(r.t, breaches, "W1: ended leases not taken by the live waiter first in line")
}

// cutOff reports whether process p was killed or partitioned throughout
// [from, to]: nothing it sent then reached Redis.
func (r *semRound) cutOff(p int, from, to time.Time) bool {
	for _, f := range r.faults {
		if f.proc == p && (f.kind == "kill" || f.kind == "partition") && !f.start.After(from) && (f.end.IsZero() || !f.end.Before(to)) {
			return true
		}
	}
	return false
}

// cutOffNear reports whether process p was killed or partitioned at any
// time in [from, to].
func (r *semRound) cutOffNear(p int, from, to time.Time) bool {
	for _, f := range r.faults {
		if f.proc == p && (f.kind == "kill" || f.kind == "partition") && !f.start.After(to) && (f.end.IsZero() || !f.end.Before(from)) {
			return true
		}
	}
	return false
}

// checkLeftovers checks W5 once everyone has left: no holders, no queue
// keys (a dead waiter's place goes within a claim window), no void keys
// after their TTL, no wake subscriptions and no waiting rooms of the
// semaphore once the rooms' linger has passed. The fencing key and the
// record of the permits are kept on purpose (lease.FenceRetention).
func (r *semRound) checkLeftovers() {
	t, srv, keys := r.t, r.w.srv, r.keys
	left := func() []string {
		all, err := srv.MustDo("KEYS", keys.Lease+"*").AsStrSlice()
		require.NoError(t, err)
		return slices.DeleteFunc(all, func(k string) bool { return k == keys.Fence || k == keys.Limit })
	}
	// An ended lease stays in the set until a script drops it, and the set
	// expires when its last lease has ended: a TTL at most.
	subscriptions := func() []string {
		sharded, err := srv.MustDo("PUBSUB", "SHARDCHANNELS", keys.Wake+":*").AsStrSlice()
		require.NoError(t, err)
		plain, err := srv.MustDo("PUBSUB", "CHANNELS", keys.Wake+":*").AsStrSlice()
		require.NoError(t, err)
		return append(sharded, plain...)
	}
	if !assert.Eventually(t, func() bool { return len(left()) == 0 }, safetyTTL+slack, pollEvery,
		"W5: the semaphore's keys did not go") {
		t.Logf("left: %v", left())
	}
	if !assert.Eventually(t, func() bool { return len(subscriptions()) == 0 && distlock.RoomsOf(keys.Lease) == 0 },
		eventually, pollEvery, "W5: wake subscriptions or waiting rooms did not end") {
		t.Logf("left: subscriptions %v, rooms %d", subscriptions(), distlock.RoomsOf(keys.Lease))
	}
}
