package distlock_test

// The harness of the fault-injection suite (safety_test.go; see SAFETY.md).
//
// A scenario is a world: one private redis-server, one lock name, a history
// recorder and a fenced counter. Each client of the world reaches Redis
// through its own fault proxy and a wire recorder (a rueidis client wrapper
// that records every lease write Redis confirmed), so one client can be cut
// off alone and the history knows, independently of the library's own
// bookkeeping, when each confirmed write was sent. Each acquisition is
// watched: State is sampled every few milliseconds and every event is
// recorded. At the end, history.Check checks the whole record.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/history"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/internal/suite"
	"github.com/distkit-go/distlock/lease"
)

// Timing of the suite. The TTL is short so that the suite is quick, and long
// enough that the margin (TTL/100 + 30ms) and the renewal period dwarf the
// scheduling delays of a busy 2-core machine.
const (
	safetyTTL   = time.Second
	sampleEvery = 2 * time.Millisecond  // State samples per watched guard
	waitEvery   = 10 * time.Millisecond // retry interval of waiting clients
	// slack is how much later than the contract's bound an event may be
	// seen by the test, for assertions of the form "soon after X".
	slack = 250 * time.Millisecond
)

// soakVar names the environment variable that sets how many times each
// case of the suite runs (by default once, or a few times for the cases
// whose figures are worst cases).
const soakVar = "DISTLOCK_SOAK"

// runs returns how many runs a scenario makes: def by default, or the
// number in DISTLOCK_SOAK.
func runs(t *testing.T, def int) int {
	t.Helper()
	v := os.Getenv(soakVar)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "%s=%q", soakVar, v)
	require.Positive(t, n, "%s=%q", soakVar, v)
	return n
}

// repeat runs f as n parallel subtests named run0, run1, ...
func repeat(t *testing.T, n int, f func(t *testing.T)) {
	for i := range n {
		t.Run(fmt.Sprintf("run%d", i), func(t *testing.T) {
			t.Parallel()
			f(t)
		})
	}
}

// subtest runs f as a parallel subtest called name, n times by default (see
// runs).
func subtest(t *testing.T, name string, n int, f func(t *testing.T)) {
	t.Run(name, func(t *testing.T) {
		t.Parallel()
		repeat(t, runs(t, n), f)
	})
}

// figure logs one line of measured figures, "SAFETY scenario=<s> k=v ...",
// which scripts/safety-figures collects into the table of SAFETY.md; s is a
// scenario number or a label. Durations are logged in milliseconds.
func figure(t *testing.T, scenario string, kv ...any) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "SAFETY scenario=%s", scenario)
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		if d, ok := v.(time.Duration); ok {
			v = strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64)
		}
		fmt.Fprintf(&b, " %v=%v", kv[i], v)
	}
	t.Log(b.String())
}

// label names a case of a scenario in figure lines: "3 case=replies-dropped".
func label(scenario, caseName string) string { return scenario + " case=" + caseName }

// slug turns a subtest name into a case name for figure lines.
func slug(name string) string { return strings.ReplaceAll(name, " ", "-") }

// world is one scenario's Redis, lock and history.
type world struct {
	t       *testing.T
	srv     *redistest.Server
	ttl     time.Duration
	lock    string // the lock name
	key     string // its lease key
	rec     *history.Recorder
	counter *history.Counter
	tokens  *tokenBook
	probe   *probe // the scheduling delay while the scenario runs
}

// newWorld starts a redis-server with args for a scenario whose lock has the
// given TTL.
func newWorld(t *testing.T, ttl time.Duration, args ...string) *world {
	t.Helper()
	return newWorldOn(t, redistest.Start(t, args...), ttl)
}

func newWorldOn(t *testing.T, srv *redistest.Server, ttl time.Duration) *world {
	rec := &history.Recorder{}
	return &world{
		t: t, srv: srv, ttl: ttl,
		lock: "safety", key: "distlock:{safety}",
		rec: rec, counter: history.NewCounter(rec, "counter"), tokens: newTokenBook(),
		probe: startProbe(t, nil),
	}
}

// stepHops is how many scheduling waits one step of the protocol makes: a
// timer or a reply wakes a goroutine, which hands over to another (a
// renewal: the guard's timer, its renewal goroutine, the fault proxy's copy
// loops, the client's reader, the guard again; not all of them wait the
// worst).
const stepHops = 3

// delayed returns how much later than promised a step due in [from, to]
// may come on this machine now: stepHops times the worst scheduling delay
// the world's probe saw then. A test widens a bound of promptness by it,
// never a bound of safety.
func (w *world) delayed(from, to time.Time) time.Duration {
	return stepHops * w.probe.delay(from, to)
}

// check checks the world's history, logs its summary as a figure line and
// returns the report.
func (w *world) check(scenario string) history.Report {
	w.t.Helper()
	r := history.Check(w.rec.Ops())
	w.t.Logf("SAFETY scenario=%s %s worst_sched_delay_ms=%.1f", scenario, r.Summary(),
		float64(w.probe.worst())/float64(time.Millisecond))
	return r
}

// requireClean checks the history and fails the test on any breach.
func (w *world) requireClean(scenario string) history.Report {
	w.t.Helper()
	r := w.check(scenario)
	require.NoError(w.t, r.Err())
	return r
}

// leaseValue returns the value stored in the lease key, if any.
func (w *world) leaseValue() (string, bool) {
	w.t.Helper()
	return get(w.t, w.srv, w.key)
}

// lineLength returns how many waiters stand in the lock's line.
func (w *world) lineLength() int {
	w.t.Helper()
	n, err := w.srv.MustDo("ZCARD", w.key+":queue").AsInt64()
	require.NoError(w.t, err)
	return int(n)
}

// client is one participant: its own proxy, wire recorder and Mutex.
type client struct {
	w     *world
	name  string
	proxy *faultproxy.Proxy
	wire  *wire
	m     *distlock.Mutex
	mode  string // a read-write lock's contender: the mode of its grants, for the history
}

// newClient returns a client of the world's server.
func (w *world) newClient(name string, opts ...distlock.Option) *client {
	w.t.Helper()
	return w.newClientOf(w.srv.Addr(), name, opts...)
}

// newClientOf returns a client of the server at addr, recording into the
// world's history.
func (w *world) newClientOf(addr, name string, opts ...distlock.Option) *client {
	w.t.Helper()
	p := faultproxy.New(w.t, addr)
	rc := redistest.NewClient(w.t, rueidis.ClientOption{InitAddress: []string{p.Addr()}, DisableCache: true})
	openConnections(w.t, rc)
	wr := newWire(rc, w.rec, w.tokens)
	opts = append([]distlock.Option{distlock.WithTTL(w.ttl), distlock.WithOwner(name)}, opts...)
	m, err := distlock.NewMutex(wr, w.lock, opts...)
	require.NoError(w.t, err)
	return &client{w: w, name: name, proxy: p, wire: wr, m: m}
}

// openConnections makes rc open every connection of its pool, as a client
// that has been running for a while has. rueidis opens its connections to a
// node (two, or four with four or more CPUs) lazily and sends each keyed
// command on one chosen at random; a connection first opened during a fault
// could not even finish its handshake, which would make the scenario about
// that instead.
func openConnections(t *testing.T, rc rueidis.Client) {
	t.Helper()
	for i := range 64 {
		err := rc.Do(t.Context(), rc.B().Exists().Key(fmt.Sprint("warm-up:", i)).Build()).Error()
		require.NoError(t, err)
	}
}

// holding is one watched acquisition.
type holding struct {
	c       *client
	g       *distlock.Guard
	token   int64
	granted time.Time // read right after Lock returned

	cancel   context.CancelFunc // stops the watcher
	watching chan struct{}      // closed when the watcher has returned
	lostCh   chan loss          // every Lost event, for tests to wait on

	mu            sync.Mutex
	losses        []loss
	regains       int
	renewFailures []time.Time // when renewals were reported failed while the lease held
	released      bool
}

// loss is one Lost event as the watcher saw it.
type loss struct {
	at       time.Time // the event's time: when the guard became Lost
	seen     time.Time // when the watcher received it
	deadline time.Time // the guard's lease deadline D, read on receipt
	reason   distlock.LostReason
	err      error
}

// expiry returns t_s + T for the lease the loss ended: the earliest moment
// Redis could expire the key.
func (h *holding) expiry(l loss) time.Time { return l.deadline.Add(distlock.Margin(h.c.w.ttl)) }

// lead returns how long before t_s + T the guard reported the loss.
func (h *holding) lead(l loss) time.Duration { return h.expiry(l).Sub(l.at) }

// lock acquires the lock with Lock and starts watching the guard.
func (c *client) lock(ctx context.Context) (*holding, error) {
	g, err := c.m.Lock(ctx)
	if err != nil {
		return nil, err
	}
	return c.watch(g), nil
}

// lockRetrying calls Lock until it succeeds or ctx ends, as an application
// would after an error (a Redis failure ends Lock's wait), and reports how
// many calls failed.
func (c *client) lockRetrying(ctx context.Context) (*holding, int) {
	failed := 0
	for {
		h, err := c.lock(ctx)
		if err == nil {
			return h, failed
		}
		if ctx.Err() != nil {
			return nil, failed
		}
		failed++
		select {
		case <-time.After(waitEvery):
		case <-ctx.Done():
			return nil, failed
		}
	}
}

// waiter is a client waiting for the lock in the background.
type waiter struct {
	got    chan *holding // receives the holding, or nil if it was stopped first
	failed int           // Lock calls that failed; read after got
	cancel context.CancelFunc
}

// lockInBackground starts lockRetrying in a goroutine, until it acquires,
// ctx ends or stop is called. The caller must receive from got, or call
// stop, before the test ends.
func (c *client) lockInBackground(ctx context.Context) *waiter {
	ctx, cancel := context.WithCancel(ctx)
	c.w.t.Cleanup(cancel)
	wt := &waiter{got: make(chan *holding, 1), cancel: cancel}
	go func() {
		h, failed := c.lockRetrying(ctx)
		wt.failed = failed
		wt.got <- h
	}()
	return wt
}

// stop stops the waiter and returns what it acquired, if anything (a lock
// it acquired is being released then: its Lock context bounds the hold).
func (wt *waiter) stop() *holding {
	wt.cancel()
	return <-wt.got
}

// pair starts a world with two clients, a and b, a holding the lock.
func pair(t *testing.T, ttl time.Duration) (w *world, a, b *client, ha *holding) {
	t.Helper()
	w = newWorld(t, ttl)
	a, b = w.newClient("a"), w.newClient("b")
	ha, err := a.lock(t.Context())
	require.NoError(t, err)
	return w, a, b, ha
}

// watch records the grant of g and starts sampling it and recording its
// events until it is released.
func (c *client) watch(g *distlock.Guard) *holding {
	now := time.Now()
	w := c.w
	w.rec.Add(history.Op{Kind: history.Granted, At: history.At(now), Key: w.key, Client: c.name, Token: g.Token(), Mode: c.mode})
	ctx, cancel := context.WithCancel(context.Background())
	h := &holding{c: c, g: g, token: g.Token(), granted: now, cancel: cancel,
		watching: make(chan struct{}), lostCh: make(chan loss, 64)}
	h.sample()
	go h.watch(ctx)
	w.t.Cleanup(func() {
		if !h.isReleased() {
			_, _ = h.release()
		}
	})
	return h
}

func (h *holding) watch(ctx context.Context) {
	defer close(h.watching)
	events := h.g.Subscribe(ctx)
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	first := true
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			h.event(ev, first)
			first = false
		case <-tick.C:
			h.sample()
		}
	}
}

// sample records one State call.
func (h *holding) sample() distlock.State {
	w := h.c.w
	at := history.Now()
	s := h.g.State()
	end := history.Now()
	w.rec.Add(history.Op{Kind: history.Sample, At: at, End: end, Key: w.key, Client: h.c.name, Token: h.token,
		Held: s == distlock.Acquired})
	return s
}

func (h *holding) event(ev distlock.Event, first bool) {
	w := h.c.w
	op := history.Op{At: history.At(ev.Time), Key: w.key, Client: h.c.name, Token: h.token}
	switch ev.State {
	case distlock.Lost:
		l := loss{at: ev.Time, seen: time.Now(), deadline: distlock.LeaseDeadline(h.g), err: ev.Err}
		if le, ok := ev.Err.(*distlock.LostError); ok {
			l.reason = le.Reason
		}
		op.Kind = history.Lost
		w.rec.Add(op)
		h.mu.Lock()
		h.losses = append(h.losses, l)
		h.mu.Unlock()
		select {
		case h.lostCh <- l:
		default:
		}
	case distlock.Acquired:
		switch {
		case errors.Is(ev.Err, distlock.ErrRenewFailed):
			// A renewal failed while the lease held (L1b): reported, not
			// a change of state.
			h.mu.Lock()
			h.renewFailures = append(h.renewFailures, ev.Time)
			h.mu.Unlock()
		case !first:
			op.Kind = history.Regained
			w.rec.Add(op)
			h.mu.Lock()
			h.regains++
			h.mu.Unlock()
		}
	}
}

// waitLost waits for the next Lost event, for within plus what the
// scheduling delay meanwhile explains (see world.delayed).
func (h *holding) waitLost(t *testing.T, within time.Duration) loss {
	t.Helper()
	w := h.c.w
	start := time.Now()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case l := <-h.lostCh:
			return l
		case now := <-timer.C:
			extra := w.delayed(start, now)
			if left := time.Until(start.Add(within + extra)); left > 0 {
				timer.Reset(left)
				continue
			}
			t.Fatalf("%s (token %d) not Lost within %v (and %v for the scheduling delay); state %v",
				h.c.name, h.token, within, extra, h.g.State())
		}
	}
}

// lossCount and regainCount report what the watcher has seen so far.
func (h *holding) lossCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.losses)
}

func (h *holding) regainCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.regains
}

// renewFailuresSince returns when the renewals reported failed at or after
// from failed.
func (h *holding) renewFailuresSince(from time.Time) []time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []time.Time
	for _, at := range h.renewFailures {
		if !at.Before(from) {
			out = append(out, at)
		}
	}
	return out
}

func (h *holding) isReleased() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.released
}

// increment reads the counter and writes it back plus one under the
// holding's token, as a fenced client of storage would. It reports whether
// both calls were accepted.
func (h *holding) increment() bool {
	ctr := h.c.w.counter
	v, ok := ctr.Read(h.c.name, h.token)
	if !ok {
		return false
	}
	return ctr.Write(h.c.name, h.token, v+1)
}

// release releases the guard, records what Release returned and stops the
// watcher. The watcher keeps sampling during the release.
func (h *holding) release() (distlock.State, error) {
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()
	return h.releaseWith(ctx)
}

// releaseWith is release with the given context, such as the README's
// context.WithoutCancel(ctx).
func (h *holding) releaseWith(ctx context.Context) (distlock.State, error) {
	st, err := h.g.Release(ctx)
	w := h.c.w
	w.rec.Add(history.Op{Kind: history.Released, At: history.Now(), Key: w.key, Client: h.c.name, Token: h.token,
		Held: st == distlock.Released})
	h.mu.Lock()
	h.released = true
	h.mu.Unlock()
	h.cancel()
	<-h.watching
	return st, err
}

// mustRelease releases and fails the test if Release did not return want,
// or failed. Releasing a Lost guard is harmless and reports Lost; the
// delete it still tries (the lease may hold its value yet) is best effort,
// given a short time of its own when the lease has lapsed, so on a busy
// machine it may time out: that is not a failure.
func (h *holding) mustRelease(t *testing.T, want distlock.State) {
	t.Helper()
	left := time.Until(h.g.Deadline()) // what the lease had left as Release began
	start := time.Now()
	st, err := h.release()
	if want == distlock.Lost && st == distlock.Lost && err != nil && suite.LapsedDeleteTimedOut(err) {
		t.Logf("the best-effort delete of %s's lapsed lease timed out: %v", h.c.name, err)
		err = nil
	}
	if err != nil && want == distlock.Released && left > 0 {
		// The final delete gives up when the lease ends: a process kept
		// from running for longer than the lease had left cannot send it,
		// or read its answer, in time, and the lease expires on its own.
		what := fmt.Sprintf("release of %s (token %d) failed: %v, with %v of its lease left when Release began",
			h.c.name, h.token, err, left.Round(time.Millisecond))
		h.c.w.skipIfStarved(t, start, left, what)
		require.NoError(t, err, "%s; the scheduling delay reached %v meanwhile (%d times the probe's worst)",
			what, h.c.w.delayed(start, time.Now()), stepHops)
	}
	require.NoError(t, err, "release of %s", h.c.name)
	require.Equal(t, want, st, "Release of %s (token %d)", h.c.name, h.token)
}

// opSink takes recorded ops: a history.Recorder, or in a helper process the
// link to the test.
type opSink interface{ Add(history.Op) }

// wire wraps a rueidis client and records, for the lease scripts that go
// through it, when each call was made, how it ended, and which writes Redis
// confirmed. The call time is read before the command is handed to rueidis,
// which is after the library read its own send time: a deadline computed
// from it is never earlier than the one the library must use.
//
// A confirmed write is recorded for the value it wrote, under the owner id
// in that value (the harness makes each client's owner id its name): a
// grant under its token, a renewal under its value and send time, which
// history.Check files under the grant of that value it was sent for (one
// value may be granted more than once). A release that passes the lease to
// a waiter in line confirms that waiter's grant, for its claim window, and
// a grant the book learns of late (its reply was lost) is dated by its
// token (see wire.learn).
type wire struct {
	rueidis.Client
	rec    opSink
	tokens *tokenBook

	mu    sync.Mutex
	calls []wireCall
}

// tokenBook records, for all the wires of a world (a release grants a value
// through another client's wire than the one that renews it), every grant
// of each lease value: a value may be granted more than once, each time
// under a token of its own (a delayed acquire call of an acquisition that
// is over can grant its value anew, SAFETY.md L4). It also remembers when
// each waiting value last asked Redis, and its claim window. The wire
// files no confirmation under a token itself: it records a renewal under
// its value and send time (history.Op.Lease and Sent), and history.Check
// files it under the grant of that value known by then.
type tokenBook struct {
	mu     sync.Mutex
	grants map[string][]bookGrant // by value, in the order learnt
	queued map[string]queuedCall
}

// bookGrant is one grant of a value: its token, and when the book first
// knew of it (the server time of the grant, read from the token, for a
// grant learnt late; else the send time of the call that made it, or its
// reply).
type bookGrant struct {
	token int64
	known time.Time
}

// queuedCall is the last acquire call of a value that may stand in line.
type queuedCall struct {
	start time.Time
	claim time.Duration
}

func newTokenBook() *tokenBook {
	return &tokenBook{grants: make(map[string][]bookGrant), queued: make(map[string]queuedCall)}
}

// add records a grant of token to value, known at known, and reports
// whether it was new to the book. A holder that asks again keeps its
// grant's token: that is the same grant, not a new one.
func (b *tokenBook) add(value string, token int64, known time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	list := b.grants[value]
	if i := slices.IndexFunc(list, func(g bookGrant) bool { return g.token == token }); i >= 0 {
		if known.Before(list[i].known) {
			list[i].known = known
		}
		return false
	}
	b.grants[value] = append(list, bookGrant{token, known})
	return true
}

// tokenAt returns the token of the grant of value that a call sent at sent
// was made for: the latest one known by then, or, for a call sent before
// any (an acquire call that stood in line), the first.
func (b *tokenBook) tokenAt(value string, sent time.Time) (int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var best, first bookGrant
	for _, g := range b.grants[value] {
		if first.token == 0 || g.known.Before(first.known) {
			first = g
		}
		if !g.known.After(sent) && (best.token == 0 || g.known.After(best.known)) {
			best = g
		}
	}
	if best.token == 0 {
		best = first
	}
	return best.token, best.token != 0
}

// issued reports whether token is known to belong to some value.
func (b *tokenBook) issued(token int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, list := range b.grants {
		if slices.ContainsFunc(list, func(g bookGrant) bool { return g.token == token }) {
			return true
		}
	}
	return false
}

func (b *tokenBook) setQueued(value string, q queuedCall) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queued[value] = q
}

func (b *tokenBook) getQueued(value string) (queuedCall, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q, ok := b.queued[value]
	return q, ok
}

type callKind int

const (
	acquireCall callKind = iota + 1
	renewCall
	releaseCall
)

func (k callKind) String() string {
	return map[callKind]string{acquireCall: "acquire", renewCall: "renew", releaseCall: "release"}[k]
}

// wireCall is one lease script call.
type wireCall struct {
	kind       callKind
	key, value string
	ttl        time.Duration // acquire and renew
	claim      time.Duration // acquire: the claim window when the caller may stand in line
	start, end time.Time
	done       bool
	ok         bool  // acquire granted, renew extended, release deleted
	err        error // a Redis or transport error
	token      int64 // acquire: the token of value
	passed     string
	passToken  int64 // release or acquire: the waiter the lease was passed to, and the grant's token
	passHeard  bool  // acquire: the pass is known from the holder its reply named, not from the call
	outOfLine  bool  // acquire: refused with rank -1, so not in line (a late call refused, or a voided value)
}

func newWire(c rueidis.Client, rec opSink, tokens *tokenBook) *wire {
	return &wire{Client: c, rec: rec, tokens: tokens}
}

// sendFunc sends a command, as rueidis.Client.Do does.
type sendFunc func(context.Context, rueidis.Completed) rueidis.RedisResult

// dedicatedVia runs fn on a dedicated connection of c whose Do goes through
// do, which records the call and sends it on that connection.
func dedicatedVia(c rueidis.Client, fn func(rueidis.DedicatedClient) error,
	do func(context.Context, rueidis.Completed, sendFunc) rueidis.RedisResult) error {
	return c.Dedicated(func(d rueidis.DedicatedClient) error {
		return fn(recordingDedicated{DedicatedClient: d, do: func(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			return do(ctx, cmd, d.Do)
		}})
	})
}

// recordingDedicated is a dedicated connection whose Do is recorded.
type recordingDedicated struct {
	rueidis.DedicatedClient
	do sendFunc
}

func (d recordingDedicated) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	return d.do(ctx, cmd)
}

// leaseReply reads the reply of a lease script of kind as the wire
// recorders need it: whether the script did what it was asked (a grant, a
// delete, a renewal), a grant's token, and the reply's array when it is
// one (the common cases reply with a number alone: a grant's token, or 1 or
// 0; an array's first element is 1 or 0).
func leaseReply(res rueidis.RedisResult, kind callKind) (ok bool, token int64, arr []rueidis.RedisMessage) {
	if n, err := res.AsInt64(); err == nil {
		if kind == acquireCall {
			return n > 0, n, nil
		}
		return n == 1, 0, nil
	}
	arr, err := res.ToArray()
	if err != nil || len(arr) == 0 {
		return false, 0, nil
	}
	n, _ := arr[0].AsInt64()
	return n == 1, 0, arr
}

// classify recognises the lease scripts by their arguments: acquire and
// release are given the fencing key, renewals the lease key alone. An
// acquire's first argument is its TTL (the value is the end of its void key,
// the last key, and the claim window its third argument, if it stands in
// line); a release's is the value.
func classify(args []string) (c wireCall, ok bool) {
	if len(args) < 4 || (args[0] != "EVALSHA" && args[0] != "EVAL") {
		return c, false
	}
	n, err := strconv.Atoi(args[2])
	if err != nil || n < 1 || len(args) < 3+n+1 {
		return c, false
	}
	keys, argv := args[3:3+n], args[3+n:]
	c.key, c.value = keys[0], argv[0]
	ttlArg := ""
	_, err = strconv.ParseInt(argv[0], 10, 64)
	switch {
	case n >= 2 && strings.HasSuffix(keys[1], ":fence") && err == nil:
		c.kind, ttlArg = acquireCall, argv[0]
		c.value = strings.TrimPrefix(keys[n-1], keys[0]+":void:")
		if len(argv) > 2 {
			if ms, err := strconv.ParseInt(argv[2], 10, 64); err == nil {
				c.claim = time.Duration(ms) * time.Millisecond
			}
		}
	case n == 1 && len(argv) == 2:
		c.kind, ttlArg = renewCall, argv[1]
	default:
		c.kind = releaseCall
	}
	if ms, err := strconv.ParseInt(ttlArg, 10, 64); err == nil {
		c.ttl = time.Duration(ms) * time.Millisecond
	}
	return c, true
}

// Do runs cmd and records it if it is a lease script.
func (w *wire) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	return w.do(ctx, cmd, w.Client.Do)
}

// Dedicated runs fn on a dedicated connection whose calls are recorded as
// the wire's own (lease.Client.Cancel borrows one).
func (w *wire) Dedicated(fn func(rueidis.DedicatedClient) error) error {
	return dedicatedVia(w.Client, fn, w.do)
}

// batchCalls recognises a batch of renewals (lease.Client.RenewBatch) by
// its arguments: the first lists runs of "<kind> <ttl ms> <count>", and
// one value follows for each key. It returns one renewal call per lease,
// in the script's order.
func batchCalls(args []string) ([]wireCall, bool) {
	if len(args) < 4 || (args[0] != "EVALSHA" && args[0] != "EVAL") {
		return nil, false
	}
	n, err := strconv.Atoi(args[2])
	if err != nil || n < 1 || len(args) != 3+n+1+n {
		return nil, false
	}
	keys, argv := args[3:3+n], args[3+n:]
	f := strings.Fields(argv[0])
	if len(f)%3 != 0 {
		return nil, false
	}
	calls := make([]wireCall, 0, n)
	for r := 0; r < len(f); r += 3 {
		ttl, err1 := strconv.ParseInt(f[r+1], 10, 64)
		count, err2 := strconv.Atoi(f[r+2])
		if len(f[r]) != 1 || !strings.Contains("lrs", f[r]) || err1 != nil || err2 != nil || len(calls)+count > n {
			return nil, false
		}
		for range count {
			i := len(calls)
			calls = append(calls, wireCall{kind: renewCall, key: keys[i], value: argv[i+1], ttl: time.Duration(ttl) * time.Millisecond})
		}
	}
	return calls, len(calls) == n
}

// finishBatch records the reply of a batch of renewals sent at start in
// each of its calls: an error of the whole batch in every one, or whether
// Redis extended each lease.
func finishBatch(calls []wireCall, start time.Time, res rueidis.RedisResult) {
	end := time.Now()
	err := res.Error()
	arr, aerr := res.ToArray()
	if err == nil && (aerr != nil || len(arr) != len(calls)) {
		err = fmt.Errorf("a batch reply of %d outcomes for %d leases (%v)", len(arr), len(calls), aerr)
	}
	for i := range calls {
		c := &calls[i]
		c.start, c.end, c.done, c.err = start, end, true, err
		if err == nil {
			n, nerr := arr[i].AsInt64()
			c.ok = nerr == nil && n == 1
		}
	}
}

// doBatch runs a batch of renewals through send and records one renewal
// call per lease, each confirmed when the batch's reply says so for it.
func (w *wire) doBatch(ctx context.Context, cmd rueidis.Completed, send sendFunc, calls []wireCall) rueidis.RedisResult {
	start := time.Now()
	w.mu.Lock()
	first := len(w.calls)
	for i := range calls {
		calls[i].start = start
		w.calls = append(w.calls, calls[i])
	}
	w.mu.Unlock()
	res := send(ctx, cmd)
	finishBatch(calls, start, res)
	w.mu.Lock()
	copy(w.calls[first:], calls)
	w.mu.Unlock()
	for _, c := range calls {
		if c.ok {
			w.confirm(c)
		}
	}
	return res
}

// confirm records the write of c, which Redis confirmed, under c's value:
// history.Check files it under the grant of the value it was sent for (a
// renewal) or the grant it made or claimed (an acquire, which names it by
// its token).
func (w *wire) confirm(c wireCall) {
	op := history.Op{Kind: history.Confirmed, Sent: history.At(c.start), At: history.At(c.end),
		Until: history.At(c.start.Add(c.ttl - distlock.Margin(c.ttl))),
		Key:   c.key, Client: lease.Owner(c.value), Lease: c.value}
	if c.kind == acquireCall {
		op.Token = c.token
	}
	w.rec.Add(op)
}

// do runs cmd through send and records it if it is a lease script.
func (w *wire) do(ctx context.Context, cmd rueidis.Completed, send sendFunc) rueidis.RedisResult {
	if calls, ok := batchCalls(cmd.Commands()); ok {
		return w.doBatch(ctx, cmd, send, calls)
	}
	c, ok := classify(cmd.Commands())
	if !ok {
		return send(ctx, cmd)
	}
	c.start = time.Now()
	if c.claim > 0 {
		w.tokens.setQueued(c.value, queuedCall{start: c.start, claim: c.claim})
	}
	w.mu.Lock()
	i := len(w.calls)
	w.calls = append(w.calls, c)
	w.mu.Unlock()

	res := send(ctx, cmd)
	c.end, c.done = time.Now(), true
	if c.err = res.Error(); c.err == nil {
		var arr []rueidis.RedisMessage
		c.ok, c.token, arr = leaseReply(res, c.kind)
		if len(arr) > 0 {
			switch {
			case c.kind == releaseCall && len(arr) == 4:
				c.passToken, _ = arr[1].AsInt64()
				c.passed, _ = arr[2].ToString()
			case c.kind == acquireCall && !c.ok && len(arr) >= 6:
				// A refused acquire names the holder and the last token. A
				// token unknown to the book is a grant (to a value the book
				// may know under an older grant: a late call granted it
				// anew) made by a script whose reply did not say so: this acquire, finding
				// the lease free and a live waiter first in line, or an
				// earlier release or acquire whose reply was lost (or a
				// client of another process: then the bound below is
				// shorter than its real lease, never longer, since a claim
				// window is at most the TTL). The token must be new too: a
				// value an operator wrote holds the lease with the last
				// token of someone else.
				if rank, err := arr[3].AsInt64(); err == nil && rank < 0 {
					c.outOfLine = true
				}
				holder, _ := arr[2].ToString()
				token, _ := arr[5].AsInt64()
				if holder != "" && holder != c.value && token > 0 && !w.tokens.issued(token) {
					c.passed, c.passToken, c.passHeard = holder, token, true
				}
			}
		}
	}
	if c.kind == acquireCall && c.ok {
		w.learn(c.key, c.value, c.token, 0, c.end)
	}
	w.mu.Lock()
	w.calls[i] = c
	w.mu.Unlock()
	if c.ok && c.kind != releaseCall {
		w.confirm(c)
	}
	if c.passed != "" {
		w.recordPass(c)
	}
	return res
}

// recordPass records the grant of c.passToken to the waiter c.passed, which
// lasts the waiter's claim window from the grant.
//
// When c made the pass (a release's reply says so), the grant came after c
// was sent and after every call of the waiter that found it still in line;
// the library counts from the later of those two send times, and so does
// this bound. (A call of the waiter that started before the release ended
// but reached Redis after the grant makes the bound lenient, never strict.)
// The announcement can reach the waiter before the reply reaches the
// releaser, so the write is known from the release's send time.
//
// When the pass was only heard of (a refused acquire named the holder), the
// call that made it may be an earlier one whose reply was lost, so c's send
// time says nothing: learn dates it by its token.
func (w *wire) recordPass(c wireCall) {
	if c.passHeard {
		w.learn(c.key, c.passed, c.passToken, distlock.DefaultClaimWindow, time.UnixMicro(c.passToken))
		return
	}
	from, claim := c.start, distlock.DefaultClaimWindow
	if q, ok := w.tokens.getQueued(c.passed); ok {
		claim = q.claim
		if q.start.After(from) && q.start.Before(c.end) {
			from = q.start
		}
	}
	w.rec.Add(history.Op{Kind: history.Confirmed, At: history.At(c.start),
		Until: history.At(from.Add(claim - distlock.Margin(claim))),
		Key:   c.key, Client: lease.Owner(c.passed), Token: c.passToken, Lease: c.passed})
	w.tokens.add(c.passed, c.passToken, c.start)
}

// learn records that Redis granted token to value, learnt at known from a
// reply that may have come long after the grant: the reply of the call that
// made the grant may have been lost (a partition, a reset), while the
// waiter heard of it at once through its room and used it. So when the book
// learns a grant it did not know, it records the grant itself, dated by the
// token:
// a token is the server's clock at the grant, in µs (the clock of this
// machine), or the last token plus one when the clock has not moved past
// it, which for a lock, whose grants each take a script of several µs, does
// not happen while the clock runs forward. Any grant of a lock to a value
// that stood in line lasts at least its claim window from then (a pass
// exactly that, a grant to the caller's own call the TTL, which is no
// shorter), so the record is never more lenient than Redis. claim is the
// claim window to assume when the book has no call of the value that stood
// in line (a value of another process); zero records nothing then.
func (w *wire) learn(key, value string, token int64, claim time.Duration, known time.Time) {
	if !w.tokens.add(value, token, known) {
		return
	}
	if q, ok := w.tokens.getQueued(value); ok && q.claim > 0 {
		claim = q.claim
	}
	if claim <= 0 {
		return
	}
	at := time.UnixMicro(token)
	w.rec.Add(history.Op{Kind: history.Confirmed, At: history.At(at),
		Until: history.At(at.Add(claim - distlock.Margin(claim))),
		Key:   key, Client: lease.Owner(value), Token: token, Lease: value})
}

// find returns the recorded calls that match f, each with the token of the
// grant it was made for (tokenBook.tokenAt).
func (w *wire) find(f func(c wireCall) bool) []wireCall {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []wireCall
	for _, c := range w.calls {
		if c.token == 0 {
			c.token, _ = w.tokens.tokenAt(c.value, c.start)
		}
		if f(c) {
			out = append(out, c)
		}
	}
	return out
}

// renewals returns the finished renewal calls of token.
func (w *wire) renewals(token int64) []wireCall {
	return w.find(func(c wireCall) bool { return c.kind == renewCall && c.token == token && c.done })
}

// confirmedRenewals counts the renewals of token that Redis confirmed.
func (w *wire) confirmedRenewals(token int64) int { return confirmed(w.renewals(token)) }

// confirmed counts the calls that Redis confirmed.
func confirmed(calls []wireCall) int {
	n := 0
	for _, c := range calls {
		if c.ok {
			n++
		}
	}
	return n
}

// lastConfirmBefore returns the start of the last call for token that
// Redis confirmed before t (the acquire or a renewal).
func (w *wire) lastConfirmBefore(token int64, t time.Time) (time.Time, bool) {
	var last time.Time
	for _, c := range w.find(func(c wireCall) bool {
		return c.token == token && c.done && c.ok && c.kind != releaseCall && c.end.Before(t)
	}) {
		if c.start.After(last) {
			last = c.start
		}
	}
	return last, !last.IsZero()
}

// renewalInFlight reports whether a renewal has been sent and not answered.
func (w *wire) renewalInFlight() bool {
	return len(w.find(func(c wireCall) bool { return c.kind == renewCall && !c.done })) > 0
}

// callsSince returns the calls for token made at or after t.
func (w *wire) callsSince(token int64, t time.Time) []wireCall {
	return w.find(func(c wireCall) bool { return c.token == token && !c.start.Before(t) })
}

// waitFor polls cond until it holds, failing the test after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, within, pollEvery, "waiting for %s", what)
}

// waitRenewal waits until Redis has confirmed n renewals of h's lease, and
// returns when the last of them was answered.
func (h *holding) waitRenewals(t *testing.T, n int) {
	t.Helper()
	start := time.Now()
	ok := h.c.w.poll(time.Duration(n+1)*h.c.w.ttl+eventually, func() bool { return h.c.wire.confirmedRenewals(h.token) >= n })
	if ok {
		return
	}
	var calls []string
	for _, c := range h.c.wire.callsSince(h.token, start.Add(-h.c.w.ttl)) {
		calls = append(calls, fmt.Sprintf("%v at %v took %v ok=%v err=%v", c.kind, c.start.Sub(start), c.end.Sub(c.start), c.ok, c.err))
	}
	t.Fatalf("%s: %d renewals not confirmed within %v (scheduling delay meanwhile: %v); state %v, losses %d; "+
		"its calls since a TTL before the wait: %q", h.c.name, n, time.Since(start), h.c.w.probe.delay(start, time.Now()),
		h.g.State(), h.lossCount(), calls)
}

// waitFor polls cond until it holds, failing the test after within plus
// what the scheduling delay meanwhile explains (see delayed).
func (w *world) waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	if !w.poll(within, cond) {
		t.Fatalf("waiting for %s: not done within %v (and %v for the scheduling delay)", what, within,
			w.delayed(start, time.Now()))
	}
}

// poll polls cond until it holds, for within plus what the scheduling delay
// meanwhile explains, and reports whether it held.
func (w *world) poll(within time.Duration, cond func() bool) bool {
	start := time.Now()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for !cond() {
		now := <-tick.C
		if now.Sub(start) >= within && time.Since(start) > within+w.delayed(start, now) {
			return cond()
		}
	}
	return true
}

// renewalBudget is how long a renewal of a lease of ttl has from when it is
// due (a third of the TTL after the last confirmed send) to the deadline.
func renewalBudget(ttl time.Duration) time.Duration { return ttl - ttl/3 - distlock.Margin(ttl) }

// skipIfStarved is for a scenario whose holder should have kept its lease:
// a renewal had spare time (its budget, less what the scenario's fault
// took) for scheduling. If the scheduling delay seen since from used that
// up, the machine, not the library, may have taken the lease, and the test
// skips, saying so, once the history so far has passed its check (safety
// is never excused); otherwise it returns, and the test goes on to fail.
func (w *world) skipIfStarved(t *testing.T, from time.Time, spare time.Duration, what string) {
	t.Helper()
	if late := w.delayed(from, time.Now()); late >= spare {
		require.NoError(t, history.Check(w.rec.Ops()).Err())
		t.Skipf("%s; but a renewal had %v to spare for scheduling, and the scheduling delay reached %v "+
			"(%d times the probe's worst): the machine may have taken the lease", what, spare, late, stepHops)
	}
}

// monoTime converts a reading of the monotonic clock to a time.Time of
// this process.
func monoTime(m history.Mono) time.Time {
	now := time.Now()
	return now.Add(m.Sub(history.At(now)))
}

// Scheduling delay. On a busy machine a goroutine may run long after it was
// due: tens of milliseconds on two cores shared with other work, more when
// the process starves itself. The contract (SAFETY.md) has bounds of two
// kinds. Some do not depend on scheduling at all: State is computed from
// the clock, so it never reports Acquired past the deadline however late
// the actor runs; a new holder never gets the lock before the old lease
// can expire. Those the tests check strictly. Others are promises of
// promptness, "by D plus scheduling slack", "at the next renewal": a test
// that checks one of those measures the scheduling delay of its own run
// with a probe, and widens the bound by what the probe saw, and only by
// that. A bound that fails although the probe saw no delay is a bug.

// probeEvery is how often a probe wakes up to measure.
const probeEvery = 5 * time.Millisecond

// probe measures the scheduling delay this process suffers, in two ways.
// Its goroutine sleeps probeEvery at a time and records how late it woke
// (and, for a probe with a round trip, how late the round trip it then
// makes came back): that shows a process that gets no CPU at all, and
// timers that fire late. And at every wake-up it reads the Go runtime's
// histogram of how long runnable goroutines waited for a CPU
// (/sched/latencies:seconds), which shows a queue of goroutines woken at
// once, such as a thousand guards renewing together: the one at the end
// waits for all the others, while the probe's own goroutine may not.
type probe struct {
	roundTrip func(context.Context) error // nil for no round trip
	ctx       context.Context             // ends when the probe is closed
	cancel    context.CancelFunc
	done      chan struct{} // closed when the goroutine has returned

	mu      sync.Mutex
	wakes   []probeWake
	pending time.Time     // when the wake-up in progress is due; zero once stopped
	woke    chan struct{} // closed and replaced at every wake-up
}

// probeWake is one wake-up of a probe: due when it was due, end when it
// (and its round trip) ended, and wait the longest time a goroutine of the
// process waited for a CPU between the previous wake-up's end (from) and
// this one's.
type probeWake struct {
	from, due, end time.Time
	wait           time.Duration
}

// late returns how late the wake-up (and its round trip) ended.
func (w probeWake) late() time.Duration { return w.end.Sub(w.due) }

// startProbe starts a probe that runs until the test ends. roundTrip, if not
// nil, is called at every wake-up and counts in its delay; its error is
// ignored (a failed round trip took as long as it took).
func startProbe(t testing.TB, roundTrip func(context.Context) error) *probe {
	ctx, cancel := context.WithCancel(context.Background())
	p := &probe{roundTrip: roundTrip, ctx: ctx, cancel: cancel, done: make(chan struct{}), woke: make(chan struct{})}
	now := time.Now()
	p.pending = now.Add(probeEvery)
	waits := newSchedWaits()
	go p.run(waits, now)
	t.Cleanup(p.close)
	return p
}

func (p *probe) run(waits *schedWaits, from time.Time) {
	defer close(p.done)
	due := from.Add(probeEvery)
	timer := time.NewTimer(probeEvery)
	defer timer.Stop()
	for {
		select {
		case <-p.ctx.Done():
			p.mu.Lock()
			p.pending = time.Time{}
			p.mu.Unlock()
			return
		case <-timer.C:
		}
		if p.roundTrip != nil {
			_ = p.roundTrip(p.ctx)
		}
		end := time.Now()
		wait := waits.worstSinceLast()
		next := end.Add(probeEvery)
		p.mu.Lock()
		p.wakes = append(p.wakes, probeWake{from: from, due: due, end: end, wait: wait})
		p.pending = next
		close(p.woke)
		p.woke = make(chan struct{})
		p.mu.Unlock()
		from, due = end, next
		timer.Reset(probeEvery)
	}
}

// close stops the probe and waits for its goroutine.
func (p *probe) close() {
	p.cancel()
	<-p.done
}

// delay returns the worst delay the probe saw in [from, to]: the worst
// lateness of its wake-ups and the longest wait of a goroutine for a CPU.
// A goroutine's wait is read at the probe's next wake-up after it ended, so
// delay first waits (a little) for a wake-up after to. A wake-up due by to
// that has not happened yet counts as late by the time since it was due.
func (p *probe) delay(from, to time.Time) time.Duration {
	p.settle(to)
	late, wait := p.parts(from, to)
	return max(late, wait)
}

// settleWait bounds how long settle waits for the probe.
const settleWait = 2 * time.Second

// settle waits until the probe has woken after t, or has stopped, or for
// settleWait at most (by then delay counts the wake-up as that late).
func (p *probe) settle(t time.Time) {
	timeout := time.NewTimer(settleWait)
	defer timeout.Stop()
	for {
		p.mu.Lock()
		woke, caughtUp := p.woke, p.pending.IsZero() || len(p.wakes) > 0 && p.wakes[len(p.wakes)-1].end.After(t)
		p.mu.Unlock()
		if caughtUp {
			return
		}
		select {
		case <-woke:
		case <-p.done:
			return
		case <-timeout.C:
			return
		}
	}
}

// parts returns the two measures of delay separately.
func (p *probe) parts(from, to time.Time) (late, wait time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.wakes {
		if w.end.Before(from) || w.from.After(to) {
			continue
		}
		wait = max(wait, w.wait)
		if !w.due.After(to) {
			late = max(late, w.late())
		}
	}
	if !p.pending.IsZero() && !p.pending.After(to) {
		late = max(late, time.Since(p.pending))
	}
	return late, wait
}

// worst returns the worst delay the probe has seen so far.
func (p *probe) worst() time.Duration { return p.delay(time.Time{}, time.Now()) }

// schedWaits reads the runtime's histogram of scheduling latencies.
type schedWaits struct {
	sample []metrics.Sample
	last   []uint64 // bucket counts at the previous read
}

const schedLatencies = "/sched/latencies:seconds"

func newSchedWaits() *schedWaits {
	s := &schedWaits{sample: []metrics.Sample{{Name: schedLatencies}}}
	s.worstSinceLast()
	return s
}

// worstSinceLast returns the upper bound of the highest bucket that gained
// a count since the previous call: the longest a goroutine waited for a
// CPU meanwhile, rounded up to the histogram's resolution.
func (s *schedWaits) worstSinceLast() time.Duration {
	metrics.Read(s.sample)
	if s.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0 // not supported by this runtime
	}
	h := s.sample[0].Value.Float64Histogram()
	var worst time.Duration
	for i, n := range h.Counts {
		if i < len(s.last) && n == s.last[i] || n == 0 {
			continue
		}
		bound := h.Buckets[i+1]
		if math.IsInf(bound, 1) {
			bound = h.Buckets[i]
		}
		worst = max(worst, time.Duration(bound*float64(time.Second)))
	}
	s.last = append(s.last[:0], h.Counts...)
	return worst
}
