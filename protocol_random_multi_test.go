package distlock_test

// The randomized protocol test of the MultiMutex (issue 31), on the
// machinery of TestRandomProtocol (protocol_random_common_test.go): the
// same round, moves and faults (delayed delivery among them), over a few
// names at once.
//
// Each call is a MultiMutex's Lock on a random set of two or three of the
// round's names (half the calls) or a Mutex's Lock on one of them, so the
// sets overlap each other and the single locks of the same names. A call
// that gets its names holds them a random moment, increments each name's
// fenced counter with that name's token, and releases them. Each process's
// wire records every lease script call per name (a set's scripts, which
// serve several names in one call, are split into one call per name), and
// a sampler reads every name's lease and line in one step.
//
// Afterwards it checks, for each name on its own:
//   - Safety (history.Check, per key): no guard reported Acquired past the
//     deadline Redis's confirmed writes of that name allow (L1); no two
//     guards held the name at once (L2); its tokens rose in grant order
//     (L3); no guard regained it after another was granted it (L4); its
//     fenced counter took no stale token and lost no update.
//   - W1 (checkPassesOf, checkIdleOf): a release that freed the name while a
//     live waiter stood in its line passed it on in the same script; the
//     name was never free while a live waiter of an unfaulted process stood
//     in its line for longer than the bounds of TestRandomProtocol; a
//     waiter the name was passed to returned soon after, where that name
//     was the last it waited for.
//   - W5 (checkLeaseLeft, checkLeftovers): once everyone had left, nothing
//     of the name was left but its fencing key (a lease passed to a waiter
//     that gave up lasts its claim window), and no wake subscription or
//     waiting room.
//
// And W3 for every call (checkGiveUps). W2 is not checked: a set may take
// a free name that a request ahead of it has not reached yet, by design.
// DISTLOCK_RANDOM_SEED, DISTLOCK_RANDOM_OPS and DISTLOCK_SOAK work as for
// TestRandomProtocol.

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	"github.com/distkit-go/distlock/internal/history"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// The shape of a round of TestRandomMultiMutex.
const (
	multiRandomOps   = 200 // moves per round by default
	multiRandomNames = 4   // the names the calls share
	multiRandomSetOf = 3   // a set holds 2 to this many names
	// multiRandomSets is how many calls in ten are a MultiMutex's; the rest
	// are a Mutex's.
	multiRandomSets = 5
	// multiRandomMaxHold is the longest hold: shorter than a semaphore's,
	// as a set waits for several holders.
	multiRandomMaxHold = 80 * time.Millisecond
)

// multiSampleScript reads, in one step, each name's lease value (” when
// free) and line: KEYS are each name's lease and queue keys, in turn.
const multiSampleScript = `
local out = {}
for i = 1, #KEYS, 2 do
  out[#out + 1] = redis.call('GET', KEYS[i]) or ''
  out[#out + 1] = redis.call('ZRANGE', KEYS[i + 1], 0, -1)
end
return out
`

// TestRandomMultiMutex runs randomized rounds of MultiMutex and Mutex Lock
// calls over overlapping names, releases, cancellations, kills,
// partitions, delayed delivery, subscription drops and Redis pauses, and
// checks L1-L4 and the fenced counters per name, W1, W3 and W5. See the
// top of this file.
func TestRandomMultiMutex(t *testing.T) {
	t.Parallel()
	runRandomRounds(t, multiRandomOps, runMultiRound)
}

// multiRound is one randomized run over several names.
type multiRound struct {
	*round
	names    []string
	keys     map[string]lease.Keys       // by name
	wires    []*multiWire                // by process
	counters map[string]*history.Counter // by name
	perName  map[string][]lineSample     // samples by name, each sample's own reading
	wants    map[string][]string         // by waiter: the lease keys it asked for, in the set's order
	tokens   map[string]map[string]int64 // by waiter and lease key: its guard's token
	calls    map[string]int              // calls by face, for the figure
	recMu    sync.Mutex                  // guards perName, wants, tokens and calls (round.mu is the round's)
	books    map[string]*tokenBook       // by lease key, shared by the processes
}

func runMultiRound(t *testing.T, seed uint64, ops int) {
	w := newWorld(t, safetyTTL)
	r := &multiRound{keys: map[string]lease.Keys{}, counters: map[string]*history.Counter{},
		perName: map[string][]lineSample{}, wants: map[string][]string{}, tokens: map[string]map[string]int64{},
		calls: map[string]int{}, books: map[string]*tokenBook{}}
	var sampleKeys []string
	for i := range multiRandomNames {
		name := fmt.Sprintf("multi%d", i)
		keys, err := lease.NewKeys(distlock.DefaultNamespace, name)
		require.NoError(t, err)
		r.names = append(r.names, name)
		r.keys[name] = keys
		r.counters[name] = history.NewCounter(w.rec, "counter:"+name)
		r.books[keys.Lease] = newTokenBook()
		sampleKeys = append(sampleKeys, keys.Lease, keys.Queue)
	}
	script := rueidis.NewLuaScriptReadOnly(multiSampleScript)
	r.round = newRound(t, w, seed, roundKind{
		call: "MultiMutex.Lock or Mutex.Lock", unit: "the name", figure: "random-multi", killOdds: 40,
		maxHold: multiRandomMaxHold, widen: true,
		newCall: r.newCall,
		watch:   r.watch,
		read: func(ctx context.Context, admin rueidis.Client) (lineSample, error) {
			var all lineSample
			at := time.Now()
			arr, err := script.Exec(ctx, admin, sampleKeys, nil).ToArray()
			end := time.Now()
			if err != nil || len(arr) != 2*len(r.names) {
				return all, fmt.Errorf("sample: %v (%d values)", err, len(arr))
			}
			r.recMu.Lock()
			defer r.recMu.Unlock()
			for i, name := range r.names {
				s := lineSample{at: at, end: end}
				if v, _ := arr[2*i].ToString(); v != "" {
					s.holders = []lease.Holding{{Value: v}}
				}
				s.line, _ = arr[2*i+1].AsStrSlice()
				r.perName[name] = append(r.perName[name], s)
				all.holders = append(all.holders, s.holders...)
				all.line = append(all.line, s.line...)
			}
			return all, nil
		},
	})
	for i := range randomProcs {
		p := faultproxy.New(t, w.srv.Addr())
		rc := redistest.NewClient(t, rueidis.ClientOption{InitAddress: []string{p.Addr()}, DisableCache: true})
		openConnections(t, rc)
		mw := &multiWire{Client: rc, byKey: map[string]*wire{}}
		for _, keys := range r.keys {
			mw.byKey[keys.Lease] = newWire(rc, w.rec, r.books[keys.Lease])
		}
		r.wires = append(r.wires, mw)
		r.addProc(fmt.Sprintf("p%d", i), p)
	}
	moved, drainedIn := r.run(ops)

	report := history.Check(w.rec.Ops())
	t.Logf("SAFETY scenario=random-multi %s", report.Summary())
	for _, g := range report.Regrants {
		t.Logf("regrant: %s", g)
	}
	assert.NoError(t, report.Err(), "L1-L4 and the fenced counters, per name")
	r.checkGiveUps()
	for _, name := range r.names {
		keys := r.keys[name]
		wires := r.wiresOf(keys.Lease)
		rec := &multiLockRecord{lockRecord: newLockRecord(wires), r: r, key: keys.Lease, wires: wires}
		scenario := "random-multi-" + name
		r.checkPassesOf(rec, r.perName[name], scenario)
		r.checkIdleOf(rec, r.perName[name], scenario)
		r.checkLeaseLeft(keys, wires)
	}
	for _, name := range r.names {
		r.checkLeftovers(r.keys[name], true, r.keys[name].Fence)
	}

	acquired, cancelled, killed, failed := r.tally()
	longest := 0
	for _, name := range r.names {
		for _, s := range r.perName[name] {
			longest = max(longest, len(s.line))
		}
	}
	writes := 0
	for _, c := range r.counters {
		writes += int(c.Value())
	}
	figure(t, "random-multi", "seed", seed, "moves", ops, "moving", moved, "draining", drainedIn,
		"waiters", len(r.waiters), "acquired", acquired, "cancelled", cancelled, "killed", killed, "failed", failed,
		"set_calls", r.calls["set"], "mutex_calls", r.calls["mutex"], "line_max", longest, "counter_writes", writes,
		"l1_unchecked", report.Unchecked, "regrants", len(report.Regrants), "worst_sched_delay", w.probe.worst())
	t.Logf("moves: %v", r.moves)
}

// newCall returns the Lock of a new waiter named name in process p: a
// MultiMutex's on a random set of the names, or a Mutex's on one.
func (r *multiRound) newCall(p *rproc, name string) func(context.Context) (*distlock.Guard, error) {
	t, w := r.t, r.w
	client := r.wires[p.idx]
	var names []string
	face := "mutex"
	if r.rng.IntN(10) < multiRandomSets {
		face = "set"
		n := 2 + r.rng.IntN(multiRandomSetOf-1)
		for _, i := range r.rng.Perm(len(r.names))[:n] {
			names = append(names, r.names[i])
		}
	} else {
		names = []string{r.names[r.rng.IntN(len(r.names))]}
	}
	var call func(context.Context) (*distlock.Guard, error)
	var order []string
	if face == "set" {
		m, err := distlock.NewMultiMutex(client, names, distlock.WithTTL(w.ttl), distlock.WithOwner(name))
		require.NoError(t, err)
		call, order = m.Lock, m.Keys()
	} else {
		m, err := distlock.NewMutex(client, names[0], distlock.WithTTL(w.ttl), distlock.WithOwner(name))
		require.NoError(t, err)
		call, order = m.Lock, []string{r.keys[names[0]].Lease}
	}
	r.recMu.Lock()
	r.wants[name] = order
	r.calls[face]++
	r.recMu.Unlock()
	return call
}

// nameOf returns the name whose lease key is key.
func (r *multiRound) nameOf(key string) string {
	for name, keys := range r.keys {
		if keys.Lease == key {
			return name
		}
	}
	return ""
}

// wiresOf returns every process's wire of the name whose lease key is key,
// by process.
func (r *multiRound) wiresOf(key string) []*wire {
	out := make([]*wire, len(r.wires))
	for i, mw := range r.wires {
		out[i] = mw.byKey[key]
	}
	return out
}

// watch records the grant of g to wt on each of its names, increments
// each name's fenced counter while the guard holds, and watches the guard:
// every State sample and event is recorded on each name, under that
// name's token.
func (r *multiRound) watch(wt *rwaiter, g *distlock.Guard) heldGuard {
	r.recMu.Lock()
	keys := r.wants[wt.name]
	r.recMu.Unlock()
	h := &setHolding{r: r, name: wt.name, g: g, watching: make(chan struct{})}
	now := time.Now()
	for _, key := range keys {
		token := g.Token()
		if len(keys) > 1 {
			token = g.TokenOf(r.nameOf(key))
		}
		h.keys, h.tokens = append(h.keys, key), append(h.tokens, token)
		r.w.rec.Add(history.Op{Kind: history.Granted, At: history.At(now), Key: key, Client: wt.name, Token: token})
	}
	r.recMu.Lock()
	r.tokens[wt.name] = map[string]int64{}
	for i, key := range h.keys {
		r.tokens[wt.name][key] = h.tokens[i]
	}
	r.recMu.Unlock()
	if h.sample() {
		for i, key := range h.keys {
			c := r.counters[r.nameOf(key)]
			if v, ok := c.Read(wt.name, h.tokens[i]); ok {
				c.Write(wt.name, h.tokens[i], v+1)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go h.watch(ctx)
	return h
}

// setHolding is a guard watched on each of its names (one, for a Mutex's).
type setHolding struct {
	r        *multiRound
	name     string
	g        *distlock.Guard
	keys     []string // its names' lease keys
	tokens   []int64  // by key
	cancel   context.CancelFunc
	watching chan struct{} // closed when the watcher has returned
}

// record adds an op of kind at at for each name.
func (h *setHolding) record(op history.Op) {
	for i, key := range h.keys {
		op.Key, op.Client, op.Token = key, h.name, h.tokens[i]
		h.r.w.rec.Add(op)
	}
}

// sample records one State call on every name, and reports whether it
// said Acquired.
func (h *setHolding) sample() bool {
	at := history.Now()
	held := h.g.State() == distlock.Acquired
	h.record(history.Op{Kind: history.Sample, At: at, End: history.Now(), Held: held})
	return held
}

func (h *setHolding) watch(ctx context.Context) {
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
			switch {
			case ev.State == distlock.Lost:
				h.record(history.Op{Kind: history.Lost, At: history.At(ev.Time)})
			case ev.State == distlock.Acquired && !first && !errors.Is(ev.Err, distlock.ErrRenewFailed):
				// As holding.event: a failed renewal while the lease holds
				// is a report, not a change of state.
				h.record(history.Op{Kind: history.Regained, At: history.At(ev.Time)})
			}
			first = false
		case <-tick.C:
			h.sample()
		}
	}
}

// release releases the guard, records what Release returned on every name
// and stops the watcher, which samples until then.
func (h *setHolding) release() (distlock.State, error) {
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()
	st, err := h.g.Release(ctx)
	h.record(history.Op{Kind: history.Released, At: history.Now(), Held: st == distlock.Released})
	h.cancel()
	<-h.watching
	return st, err
}

// multiLockRecord is the wire record of one name of a MultiMutex's round,
// as the checks of the line read it: the lock's, but a pass counts as the
// hand-off of a waiter's call only where the name is the last its call
// waited for (a set that was passed an earlier name still waits for the
// rest), and under the token its guard holds for the name.
type multiLockRecord struct {
	*lockRecord
	r     *multiRound
	key   string
	wires []*wire // the name's, by process
}

// describe lists every call of the waiter named name on this name, what
// its call asked for and its guard's tokens, for failure messages.
func (rec *multiLockRecord) describe(name string) string {
	var b strings.Builder
	rec.r.recMu.Lock()
	fmt.Fprintf(&b, "%s asked for %v, holds %v:", name, rec.r.wants[name], rec.r.tokens[name])
	rec.r.recMu.Unlock()
	for idx, wr := range rec.wires {
		for _, c := range wr.find(func(c wireCall) bool { return lease.Owner(c.value) == name }) {
			fmt.Fprintf(&b, " [p%d %v %s..%s ttl=%v claim=%v ok=%v err=%v token=%d passed=%s/%d heard=%v outOfLine=%v]", idx, c.kind,
				c.start.Format("05.000000"), c.end.Format("05.000000"), c.ttl, c.claim, c.ok, c.err, c.token,
				lease.Owner(c.passed), c.passToken, c.passHeard, c.outOfLine)
		}
	}
	for _, p := range rec.passes[name] {
		fmt.Fprintf(&b, " [passed %d at %s by p%d]", p.token, time.UnixMicro(p.token).Format("05.000000"), p.from)
	}
	return b.String()
}

func (rec *multiLockRecord) lastPass(x *rwaiter) (token int64, from int, ok bool) {
	rec.r.recMu.Lock()
	wants, held := rec.r.wants[x.name], rec.r.tokens[x.name][rec.key]
	rec.r.recMu.Unlock()
	if len(wants) == 0 || wants[len(wants)-1] != rec.key || held == 0 {
		return 0, 0, false
	}
	var last pass
	for _, p := range rec.passes[x.name] {
		if p.token <= held && p.token > last.token {
			last = p
		}
	}
	return last.token, last.from, last.token != 0
}

// The wire of a MultiMutex's round.

// multiWire is one process's client: it records each name's lease script
// calls in that name's wire (each wire's tokenBook is the name's, shared
// by the processes), and splits a set's scripts, which serve several names
// in one call, into one call per name.
type multiWire struct {
	rueidis.Client
	byKey map[string]*wire // by lease key
}

// Do runs cmd and records it if it is a lease script.
func (mw *multiWire) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	return mw.do(ctx, cmd, mw.Client.Do)
}

// Dedicated runs fn on a dedicated connection whose calls are recorded as
// the wire's own.
func (mw *multiWire) Dedicated(fn func(rueidis.DedicatedClient) error) error {
	return dedicatedVia(mw.Client, fn, mw.do)
}

func (mw *multiWire) do(ctx context.Context, cmd rueidis.Completed, send sendFunc) rueidis.RedisResult {
	args := cmd.Commands()
	if calls, ok := batchCalls(args); ok {
		start := time.Now()
		res := send(ctx, cmd)
		finishBatch(calls, start, res)
		for _, c := range calls {
			if w := mw.byKey[c.key]; w != nil {
				w.mu.Lock()
				w.calls = append(w.calls, c)
				w.mu.Unlock()
				if c.ok {
					w.confirm(c)
				}
			}
		}
		return res
	}
	if set, ok := classifySet(args); ok {
		return mw.doSet(ctx, cmd, send, set)
	}
	if c, ok := classify(args); ok {
		if w := mw.byKey[c.key]; w != nil {
			return w.do(ctx, cmd, send)
		}
	}
	return send(ctx, cmd)
}

// setCall is a set's script call, before its reply: kind, the value, the
// lease keys in the set's order, and for an acquire its TTL and claim
// window.
type setCall struct {
	kind       callKind
	value      string
	keys       []string
	ttl, claim time.Duration
}

// classifySet recognises a set's scripts (lease.Client.AcquireAll,
// ReleaseAll, CancelAll) by their keys: setKeysPerLock per lock, a fencing
// key second in each group and the value's void key last. An acquire's
// first argument is its TTL, a release's the value. A set of one lock is
// sent as many keys as a Mutex's acquire and Cancel are, and told apart by
// its arguments: a Mutex's acquire that stands in line sends its kind (""
// or "1") second where a set's sends its claim window, and a Mutex's
// Cancel sends three arguments where a set's sends two (a set's Release
// one; a Mutex's Release sends one key fewer). A set that gives back the
// names it reached sends only those: one, when it gives up in the line of
// its first name. (A single attempt at a set of one lock, its TTL alone,
// looks like a Mutex's; the round makes none.)
// setKeysPerLock is how many keys a set's scripts take per lock (lease,
// fence, queue, waiters, the value's void key: lease's setKeys).
const setKeysPerLock = 5

func classifySet(args []string) (setCall, bool) {
	var c setCall
	if len(args) < 4 || (args[0] != "EVALSHA" && args[0] != "EVAL") {
		return c, false
	}
	n, err := strconv.Atoi(args[2])
	if err != nil || n < setKeysPerLock || n%setKeysPerLock != 0 || len(args) < 3+n+1 {
		return c, false
	}
	keys, argv := args[3:3+n], args[3+n:]
	if n == setKeysPerLock {
		_, ttlErr := strconv.ParseInt(argv[0], 10, 64)
		claim, claimErr := int64(0), error(nil)
		if len(argv) > 1 {
			claim, claimErr = strconv.ParseInt(argv[1], 10, 64)
		}
		acquire := ttlErr == nil && len(argv) > 1 && claimErr == nil && claim > 1
		release := ttlErr != nil && len(argv) <= 2
		if !acquire && !release {
			return c, false
		}
	}
	for i := 0; i < n; i += setKeysPerLock {
		if !strings.HasSuffix(keys[i+1], ":fence") {
			return c, false
		}
		c.keys = append(c.keys, keys[i])
	}
	c.value = strings.TrimPrefix(keys[setKeysPerLock-1], keys[0]+":void:")
	if ms, err := strconv.ParseInt(argv[0], 10, 64); err == nil {
		c.kind, c.ttl = acquireCall, time.Duration(ms)*time.Millisecond
		if len(argv) > 1 {
			if ms, err := strconv.ParseInt(argv[1], 10, 64); err == nil {
				c.claim = time.Duration(ms) * time.Millisecond
			}
		}
	} else {
		c.kind = releaseCall
	}
	return c, true
}

// doSet runs a set's script call and records it, one call per name, as
// the lock's wire records a Mutex's: an acquire granted the names it held
// (for the TTL when it took them all, else for the claim window while it
// waits), and left its caller in line at the name it stopped at, or not;
// a release deleted each name or not, and passed it on or not.
func (mw *multiWire) doSet(ctx context.Context, cmd rueidis.Completed, send sendFunc, s setCall) rueidis.RedisResult {
	start := time.Now()
	if s.claim > 0 {
		for _, key := range s.keys {
			if w := mw.byKey[key]; w != nil {
				w.tokens.setQueued(s.value, queuedCall{start: start, claim: s.claim})
			}
		}
	}
	res := send(ctx, cmd)
	end := time.Now()
	base := wireCall{kind: s.kind, value: s.value, ttl: s.ttl, claim: s.claim, start: start, end: end, done: true}
	add := func(c wireCall) *wire {
		w := mw.byKey[c.key]
		if w != nil {
			w.mu.Lock()
			w.calls = append(w.calls, c)
			w.mu.Unlock()
		}
		return w
	}
	arr, err := res.ToArray()
	if err != nil {
		for _, key := range s.keys {
			c := base
			c.key, c.err = key, err
			add(c)
		}
		return res
	}
	if s.kind == releaseCall {
		i := 0
		for _, key := range s.keys {
			c := base
			c.key = key
			if i+2 > len(arr) {
				c.err = fmt.Errorf("a set's release reply of %d elements", len(arr))
				add(c)
				continue
			}
			deleted, _ := arr[i].AsInt64()
			passes, _ := arr[i+1].AsInt64()
			c.ok = deleted == 1
			if passes > 0 && i+4 < len(arr) {
				c.passToken, _ = arr[i+2].AsInt64()
				c.passed, _ = arr[i+3].ToString()
			}
			i += 2 + 3*int(passes)
			if w := add(c); w != nil && c.passed != "" {
				w.recordPass(c)
			}
		}
		return res
	}
	held, _ := arr[0].AsInt64()
	stopped, _ := arr[1].AsInt64()
	for i, key := range s.keys {
		c := base
		c.key = key
		switch {
		case int64(i) < held && 2+i < len(arr):
			c.ok = true
			c.token, _ = arr[2+i].AsInt64()
			if stopped < int64(len(s.keys)) {
				c.ttl = s.claim // held while the caller waits for a later name
			}
			w := add(c)
			if w != nil {
				w.learn(key, c.value, c.token, 0, c.end)
				w.confirm(c)
			}
		case int64(i) == stopped:
			rest := arr[held+2:]
			if len(rest) >= 6 {
				if rank, err := rest[3].AsInt64(); err == nil && rank < 0 {
					c.outOfLine = true
				}
				w := mw.byKey[key]
				holder, _ := rest[2].ToString()
				token, _ := rest[5].AsInt64()
				if w != nil && holder != "" && holder != c.value && token > 0 && !w.tokens.issued(token) {
					c.passed, c.passToken, c.passHeard = holder, token, true
				}
			}
			if w := add(c); w != nil && c.passed != "" {
				w.recordPass(c)
			}
		}
	}
	return res
}

// TestClassifySet: the wire of TestRandomMultiMutex tells a set's scripts
// from a Mutex's, a set of one lock included. Seeds 1798100000000000010
// and 1798100000000000039 reported a release that passed nothing on
// although a waiter stood in line: a set cancelled in the line of its
// first name gives back that name alone, and its CancelAll of one lock,
// read as a Mutex's Cancel, had its pass missed (the set's reply puts a
// count of passes before them).
func TestClassifySet(t *testing.T) {
	keys := func(names ...string) []string {
		var out []string
		for _, name := range names {
			k, err := lease.NewKeys(distlock.DefaultNamespace, name)
			require.NoError(t, err)
			out = append(out, k.Lease, k.Fence, k.Queue, k.Waiters, k.Void("v#1"))
		}
		return out
	}
	eval := func(keys []string, argv ...string) []string {
		return slices.Concat([]string{"EVALSHA", "sha", strconv.Itoa(len(keys))}, keys, argv)
	}
	four := keys("a")[:4] // a Mutex's Release: no void key
	for _, c := range []struct {
		name string
		args []string
		set  bool
		kind callKind
	}{
		{"set acquire", eval(keys("a", "b"), "1000", "500", "room", "0"), true, acquireCall},
		{"set acquire of one lock", eval(keys("a"), "1000", "500", "room", "0", "0"), true, acquireCall},
		{"set release", eval(keys("a", "b"), "v#1"), true, releaseCall},
		{"set cancel of one lock", eval(keys("a"), "v#1", "1000"), true, releaseCall},
		{"set release of one lock", eval(keys("a"), "v#1"), true, releaseCall},
		{"mutex acquire in line", eval(keys("a"), "1000", "", "500", "room", "0"), false, 0},
		{"election acquire in line", eval(keys("a"), "1000", "1", "500", "room", "0"), false, 0},
		{"mutex cancel", eval(keys("a"), "v#1", "", "1000"), false, 0},
		{"mutex release", eval(four, "v#1"), false, 0},
	} {
		got, ok := classifySet(c.args)
		assert.Equal(t, c.set, ok, c.name)
		if ok {
			assert.Equal(t, c.kind, got.kind, c.name)
			assert.Equal(t, "v#1", got.value, c.name)
		}
	}
}
