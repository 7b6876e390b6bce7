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
	runRandomRounds(t, semRandomOps, runSemRound)
}

// semRound is one randomized run on a semaphore.
type semRound struct {
	*round
	keys  lease.Keys
	wires []*semWire // by process
}

// semSampleScript reads, in one step, the last token, the live holders with
// what is left of each lease (ms), the line, and the server's clock (ms).
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
return {redis.call('GET', KEYS[2]) or '', h, redis.call('ZRANGE', KEYS[3], 0, -1), now}
`

func runSemRound(t *testing.T, seed uint64, ops int) {
	w, keys := randomWorld(t, semRandomName)
	r := &semRound{keys: keys}
	script := rueidis.NewLuaScript(semSampleScript)
	r.round = newRound(t, w, seed, roundKind{
		call: "Acquire", unit: "a permit", figure: "random-sem", widen: true, maxHold: semRandomMaxHold,
		// A kill is likelier than in the lock's rounds (40 in a thousand
		// rather than 15), for the sake of leases that end without a
		// release (checkEndedLeases).
		killOdds: 40,
		newCall: func(p *rproc, name string) func(context.Context) (*distlock.Guard, error) {
			s, err := distlock.NewSemaphore(r.wires[p.idx], w.lock, r.permits, distlock.WithTTL(w.ttl), distlock.WithOwner(name))
			require.NoError(t, err)
			return s.Acquire
		},
		read: func(ctx context.Context, admin rueidis.Client) (lineSample, error) {
			var s lineSample
			arr, err := script.Exec(ctx, admin, []string{keys.Lease, keys.Fence, keys.Queue}, nil).ToArray()
			if err != nil || len(arr) != 4 {
				return s, fmt.Errorf("sample: %v (%d values)", err, len(arr))
			}
			if ms, err := arr[3].AsInt64(); err == nil {
				s.now = time.UnixMilli(ms)
			}
			if f, _ := arr[0].ToString(); f != "" {
				s.fence, _ = strconv.ParseInt(f, 10, 64)
			}
			hs, _ := arr[1].AsStrSlice()
			for i := 0; i+1 < len(hs); i += 2 {
				ms, _ := strconv.ParseInt(hs[i+1], 10, 64)
				s.holders = append(s.holders, lease.Holding{Value: hs[i], TTL: time.Duration(ms) * time.Millisecond})
			}
			s.line, _ = arr[2].AsStrSlice()
			return s, nil
		},
	})
	r.permits = semRandomMinPermits + r.rng.IntN(semRandomMaxPermits-semRandomMinPermits+1)
	t.Logf("%d permits", r.permits)
	r.addProcs()
	moved, drainedIn := r.run(ops)

	calls := r.calls()
	report := r.checkL1(calls)
	r.checkAtMostN()
	r.checkTokens(calls)
	r.checkGiveUps()
	r.checkOrder(calls)
	r.checkPasses(calls)
	r.checkIdle(calls)
	r.checkEndedLeases(calls)
	// The fencing key and the record of the permits are kept on purpose
	// (lease.FenceRetention).
	r.checkLeftovers(keys, true, keys.Fence, keys.Limit)

	acquired, cancelled, killed, failed := r.tally()
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

// randomWorld returns the world of a randomized round on the lease name,
// and its keys.
func randomWorld(t *testing.T, name string) (*world, lease.Keys) {
	w := newWorld(t, safetyTTL)
	w.lock = name
	keys, err := lease.NewKeys(distlock.DefaultNamespace, w.lock)
	require.NoError(t, err)
	w.key = keys.Lease
	return w, keys
}

// addProcs adds the round's processes, each with its client behind its own
// proxy and its semWire.
func (r *semRound) addProcs() {
	t, w := r.t, r.w
	for i := range randomProcs {
		p := faultproxy.New(t, w.srv.Addr())
		rc := redistest.NewClient(t, rueidis.ClientOption{InitAddress: []string{p.Addr()}, DisableCache: true})
		openConnections(t, rc)
		r.wires = append(r.wires, &semWire{Client: rc})
		r.addProc(fmt.Sprintf("p%d", i), p)
	}
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
	return w.do(ctx, cmd, w.Client.Do)
}

// Dedicated runs fn on a dedicated connection whose calls are recorded as
// the wire's own (lease.Client.Cancel borrows one).
func (w *semWire) Dedicated(fn func(rueidis.DedicatedClient) error) error {
	return dedicatedVia(w.Client, fn, w.do)
}

// do runs cmd through send and records it if it is a lease script.
func (w *semWire) do(ctx context.Context, cmd rueidis.Completed, send sendFunc) rueidis.RedisResult {
	if calls, ok := batchCalls(cmd.Commands()); ok {
		// A batch of renewals (the client's batcher): one renewal call per
		// lease, each confirmed when the batch's reply says so for it.
		start := time.Now()
		res := send(ctx, cmd)
		finishBatch(calls, start, res)
		w.mu.Lock()
		for _, c := range calls {
			w.calls = append(w.calls, semCall{wireCall: c, rank: -1})
		}
		w.mu.Unlock()
		return res
	}
	wc, ok := classify(cmd.Commands())
	if !ok {
		return send(ctx, cmd)
	}
	c := semCall{wireCall: wc, rank: -1}
	c.start = time.Now()
	res := send(ctx, cmd)
	c.end, c.done = time.Now(), true
	if c.err = res.Error(); c.err == nil {
		var arr []rueidis.RedisMessage
		c.ok, c.token, arr = leaseReply(res, c.kind)
		if len(arr) > 0 {
			switch {
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
	s    lineSample
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
		owner := lease.Owner(g.value)
		if old, ok := cs.grants[g.token]; ok {
			if old.value == g.value {
				// A read-write lock's holder that claims what was passed
				// to it keeps the token: one grant, seen twice. If a
				// release passed it, that is where it began, whichever
				// call was sent first (an acquire call in flight at the
				// pass lands after it and claims it): the pass stands.
				if g.pass && !old.pass {
					cs.grants[g.token] = g
					i := slices.IndexFunc(cs.byOwnerGrants[owner], func(o semGrant) bool { return o.token == g.token })
					cs.byOwnerGrants[owner][i] = g
				}
				return
			}
			dup = append(dup, fmt.Sprintf("token %d granted to %s and to %s", g.token, old.value, g.value))
		}
		cs.grants[g.token] = g
		cs.byOwnerGrants[owner] = append(cs.byOwnerGrants[owner], g)
	}
	for idx, w := range r.wires {
		w.mu.Lock()
		for _, c := range w.calls {
			c.proc = idx
			cs.all = append(cs.all, c)
		}
		w.mu.Unlock()
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

// sent returns a time before grant g was made. A grant made by an acquire
// call may be a claim of a grant passed to the caller earlier (a
// read-write lock's holder keeps its token): the token was issued no
// earlier than the caller's last call that left it in line with a smaller
// last token.
func (cs semCalls) sent(g semGrant) time.Time {
	if q, ok := cs.lastInLineBefore(lease.Owner(g.value), g.token); ok && !g.pass && q.Before(g.call.start) {
		return q
	}
	return g.call.start
}

// passedFrom returns the send time that a permit passed by grant g
// counts from: the release's, or the waiter's last call that found it in
// line before the pass, if that came later.
func (cs semCalls) passedFrom(g semGrant) time.Time {
	from := g.call.start
	if q, ok := cs.lastInLineBefore(lease.Owner(g.value), g.token); ok {
		from = later(from, q)
	}
	return from
}

// semHold is one hold of a value: its grants in token order, the tokens
// they carried, and every other write Redis confirmed for it (an acquire
// call that claimed a grant, a renewal sent while it was the value's
// latest hold).
type semHold struct {
	value  string
	tokens []int64
	grants []semGrant
	writes []semCall
}

// holds groups what Redis confirmed of each value into holds. A grant
// starts a hold of its own, unless continued is set and the grant came
// (by its token, the server's clock) before what the value's hold so far
// is known to last, by the confirmations whose replies came before it
// (passUntil dates a pass's, fullUntil an acquire's or a renewal's): a
// semaphore's holder that asks again while it holds is granted a new
// token for the same lease. A grant after that is a value granted anew
// (a late call of an acquisition that is over), whose writes must not
// count for the grant before it. A write goes to the latest hold known
// when it was sent.
//
// extra are grants that no reply showed (a permit passed by someone's
// acquire call), by owner, dated as passes.
func (cs semCalls) holds(continued bool, passUntil func(time.Time) time.Time, fullUntil func(semCall) time.Time,
	extra map[string][]semGrant) []*semHold {
	var out []*semHold
	owners := map[string]bool{}
	for owner := range cs.byOwnerGrants {
		owners[owner] = true
	}
	for owner := range extra {
		owners[owner] = true
	}
	for owner := range owners {
		grants := slices.Concat(cs.byOwnerGrants[owner], extra[owner])
		slices.SortFunc(grants, func(a, b semGrant) int { return cmp.Compare(a.token, b.token) })
		var writes []semCall
		for _, c := range cs.byOwner[owner] {
			if c.ok && c.done && c.err == nil && (c.kind == renewCall || !slices.ContainsFunc(grants, func(g semGrant) bool {
				return !g.pass && g.call.start.Equal(c.start) && g.call.value == c.value
			})) {
				writes = append(writes, c)
			}
		}
		var hs []*semHold
		var begun []time.Time // when each hold's first grant was known
		for _, g := range grants {
			at := time.UnixMicro(g.token)
			if n := len(hs); continued && n > 0 {
				h := hs[n-1]
				var until time.Time
				for _, o := range h.grants {
					if o.pass {
						until = later(until, passUntil(cs.passedFrom(o)))
					} else {
						until = later(until, fullUntil(o.call))
					}
				}
				for _, c := range writes {
					if !c.start.Before(begun[n-1]) && c.end.Before(at) {
						until = later(until, fullUntil(c))
					}
				}
				if at.Before(until) {
					h.grants, h.tokens = append(h.grants, g), append(h.tokens, g.token)
					continue
				}
			}
			known := g.call.end
			if g.pass {
				known = g.call.start
			}
			hs = append(hs, &semHold{value: g.value, tokens: []int64{g.token}, grants: []semGrant{g}})
			begun = append(begun, known)
		}
		for _, c := range writes {
			// An acquire call that claimed a grant names its token; a
			// renewal goes to the latest hold known when it was sent (none:
			// the value had no grant the record shows, and it is dropped).
			i := -1
			for j := range hs {
				if c.kind == acquireCall && slices.Contains(hs[j].tokens, c.token) ||
					c.kind == renewCall && !begun[j].After(c.start) {
					i = j
				}
			}
			if i >= 0 {
				hs[i].writes = append(hs[i].writes, c)
			}
		}
		out = append(out, hs...)
	}
	return out
}

// The checks.

// checkL1 adds to the history what Redis confirmed of each value (acquire
// grants and renewals for the TTL from their send time; a permit passed to
// it for the claim window from the latest send time known to precede the
// pass), filed under the hold it was sent for (see semCalls.holds), and
// checks L1 on it: no guard reported Acquired past the deadline those
// writes allow. The history's overlap and token-order checks are the
// lock's (one holder); checkAtMostN and checkTokens stand in for them.
func (r *semRound) checkL1(cs semCalls) history.Report {
	r.recordWrites(cs)
	// Not world.check: its summary counts the lock's overlaps.
	report := history.Check(r.w.rec.Ops())
	r.t.Logf("SAFETY scenario=random-sem acquisitions=%d samples=%d held_samples=%d l1_unchecked=%d l1_violations=%d "+
		"regrants=%d unfiled=%d", report.Acquisitions, report.Samples, report.HeldSamples, report.Unchecked, len(report.L1),
		len(report.Regrants), report.Unfiled)
	for _, g := range report.Regrants {
		r.t.Logf("regrant: %s", g)
	}
	if !assert.Empty(r.t, report.L1, "L1: guards reported Acquired past the deadline Redis's writes allow") {
		for _, x := range r.waiters {
			if slices.ContainsFunc(report.L1, func(l string) bool { return strings.Contains(l, "/"+x.name+" token ") }) {
				r.t.Log(r.trace(cs, x))
			}
		}
	}
	assert.Empty(r.t, report.Malformed, "the history contradicts itself")
	return report
}

// recordWrites adds to the history what Redis confirmed of each value, for
// checkL1.
func (r *semRound) recordWrites(cs semCalls) {
	claim := func(from time.Time) time.Time { return from.Add(randomClaim - distlock.Margin(randomClaim)) }
	full := func(c semCall) time.Time { return c.start.Add(c.ttl - distlock.Margin(c.ttl)) }
	// A permit passed by someone's acquire call, whose reply does not say
	// to whom: it was granted after the waiter's last call that found it
	// in line, and lasted the claim window from then. (A read-write lock's
	// waiter keeps that token when its own call claims the grant, or when a
	// refresh in flight at the pass finds it: the reply of that call is not
	// where the grant began.)
	extra := map[string][]semGrant{}
	for _, x := range r.waiters {
		g, seen := cs.grants[x.token]
		q, ok := cs.lastInLineBefore(x.name, x.token)
		switch {
		case x.token == 0 || seen && g.pass || !ok:
		case !seen && len(cs.byOwner[x.name]) > 0:
			c := semCall{wireCall: wireCall{kind: acquireCall, value: cs.byOwner[x.name][0].value, start: q, end: q}}
			extra[x.name] = append(extra[x.name], semGrant{value: c.value, token: x.token, call: c, pass: true})
		case seen:
			r.w.rec.Add(history.Op{Kind: history.Confirmed, Sent: history.At(q), At: history.At(time.UnixMicro(x.token)),
				Until: history.At(claim(q)), Key: r.w.key, Client: x.name, Token: x.token})
		}
	}
	// A read-write lock's holder that asks again keeps its token; a
	// semaphore's gets a new one for the same lease (lease/doc.go).
	for _, h := range cs.holds(r.kind.modeOf == nil, claim, full, extra) {
		add := func(sent, at, until time.Time) {
			for i, token := range h.tokens {
				op := history.Op{Kind: history.Confirmed, At: history.At(at), Until: history.At(until),
					Key: r.w.key, Client: lease.Owner(h.value), Token: token}
				if i == 0 {
					// The hold's first grant names the value: the history
					// lists a value held more than once (Regrants).
					op.Lease = h.value
				}
				if !sent.IsZero() {
					op.Sent = history.At(sent)
				}
				r.w.rec.Add(op)
			}
		}
		for _, g := range h.grants {
			// Its Sent is a time before the grant (checkTokens's sent), for
			// the history's check of token order.
			if g.pass {
				add(g.call.start, g.call.start, claim(cs.passedFrom(g)))
			} else {
				add(cs.sent(g), g.call.end, full(g.call))
			}
		}
		for _, c := range h.writes {
			add(time.Time{}, c.end, full(c))
		}
	}
}

// trace describes, for a failure message, what the record shows of x: its
// call's outcome, every lease script call of its value, every grant to it,
// its guard's history (grant, first and last held sample, events) and the
// faults near, each time as seconds.micros of the wall clock.
func (r *semRound) trace(cs semCalls, x *rwaiter) string {
	var b strings.Builder
	at := func(t time.Time) string { return t.Format("05.000000") }
	fmt.Fprintf(&b, "trace of %s (token %d, server time %s): %s\n", x.name, x.token, at(time.UnixMicro(x.token)), r.describe(x.name))
	for _, c := range cs.all {
		if lease.Owner(c.value) != x.name {
			continue
		}
		fmt.Fprintf(&b, "  p%d %v [%s..%s] ttl=%v claim=%v ok=%v err=%v token=%d rank=%d fence=%d\n", c.proc, c.kind,
			at(c.start), at(c.end), c.ttl, c.claim, c.ok, c.err, c.token, c.rank, c.fence)
	}
	for _, c := range cs.all {
		for _, p := range c.passes {
			if lease.Owner(p.value) == x.name {
				fmt.Fprintf(&b, "  passed token %d (%s) by p%d %v [%s..%s] of %s\n", p.token, at(time.UnixMicro(p.token)),
					c.proc, c.kind, at(c.start), at(c.end), lease.Owner(c.value))
			}
		}
	}
	for _, g := range cs.grantsTo(x.name) {
		fmt.Fprintf(&b, "  grant token %d (%s) pass=%v by p%d %v [%s..%s] of %s\n", g.token, at(time.UnixMicro(g.token)), g.pass,
			g.call.proc, g.call.kind, at(g.call.start), at(g.call.end), lease.Owner(g.call.value))
	}
	var first, last history.Mono
	for _, op := range r.w.rec.Ops() {
		if op.Client != x.name {
			continue
		}
		switch {
		case op.Kind == history.Sample && op.Held:
			if first == 0 {
				first = op.At
			}
			last = max(last, op.At)
		case op.Kind != history.Sample:
			fmt.Fprintf(&b, "  op %v at %s until %s sent %s token %d\n", op.Kind, at(monoTime(op.At)), at(monoTime(op.Until)),
				at(monoTime(op.Sent)), op.Token)
		}
	}
	fmt.Fprintf(&b, "  held samples from %s to %s\n", at(monoTime(first)), at(monoTime(last)))
	for _, f := range r.faults {
		if f.start.Before(x.returned.Add(2*safetyTTL)) && (f.end.IsZero() || f.end.After(x.start.Add(-safetyTTL))) {
			fmt.Fprintf(&b, "  fault %s of %d %s..%s\n", f.kind, f.proc, at(f.start), at(f.end))
		}
	}
	return b.String()
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
	sent := cs.sent
	checked := 0
	for token, g := range cs.grants {
		// The last sample that ended before the call was sent, and the
		// first that started after its reply.
		i := sort.Search(len(r.samples), func(i int) bool { return !r.samples[i].end.Before(sent(g)) }) - 1
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
	slices.SortFunc(byStart, func(a, b semGrant) int { return sent(a).Compare(sent(b)) })
	slices.SortFunc(byEnd, func(a, b semGrant) int { return a.call.end.Compare(b.call.end) })
	var highest semGrant
	k := 0
	for _, b := range byStart {
		for ; k < len(byEnd) && byEnd[k].call.end.Before(sent(b)); k++ {
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

// grantedBy returns the latest time by which owner's value was first
// granted a permit, as far as the record shows: the tokens of the grants
// seen in replies and of its guard are the server's clock at the grant, and
// a sample that lists it as a holder shows a lease that ends at least a
// claim window after that grant.
func (cs semCalls) grantedBy(x *rwaiter) (time.Time, bool) {
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
// TTL, which is longer). The end of the lease is the server's clock when
// the sample ran plus what was left of it; a script sets it to its own
// clock rounded up to the millisecond plus the lease, so the bound is
// never before the grant. (A sampler that does not read the server's clock
// has the sample's start instead, which is early by the time the sample
// took to reach Redis: a slow sample makes that bound too early.)
func (h heldSeen) grantedBy() time.Time {
	if !h.s.now.IsZero() {
		return earlier(h.s.end, h.s.now.Add(h.left-randomClaim))
	}
	return earlier(h.s.end, h.s.at.Add(h.left-randomClaim+clockSlop))
}

// grantedWithin reports whether the record shows a grant to x's value that
// may have been made within [from, to]: a token of that time, or a lease
// that a sample saw and that may have been granted then.
func (cs semCalls) grantedWithin(x *rwaiter, from, to time.Time) bool {
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

// What the checks of the line (lineRecord) read of the semaphore's record.

func (cs semCalls) inLine(name string) []wireCall { return cs.inLineCalls(name) }

// firstGrant is the first grant to x's values: x may have been passed a
// permit before the one its guard holds.
func (cs semCalls) firstGrant(x *rwaiter) (token int64, passed, ok bool) {
	var first *semGrant
	for _, g := range cs.grantsTo(x.name) {
		if first == nil || g.token < first.token {
			first = &g
		}
	}
	if first == nil {
		return 0, false, false
	}
	return first.token, first.pass, true
}

// grantedFirst: a got a permit before g, or in the same step.
func (cs semCalls) grantedFirst(a *rwaiter, g time.Time, _ int64) bool {
	at, ok := cs.grantedBy(a)
	return ok && !at.After(g.Add(clockSlop))
}

func (cs semCalls) describe(name string) string {
	var b strings.Builder
	at := func(t time.Time) string { return t.Format("05.000000") }
	fmt.Fprintf(&b, "%s:", name)
	for _, c := range cs.all {
		if lease.Owner(c.value) == name {
			fmt.Fprintf(&b, " [p%d %v %s..%s ok=%v err=%v token=%d rank=%d fence=%d]", c.proc, c.kind, at(c.start), at(c.end),
				c.ok, c.err, c.token, c.rank, c.fence)
		}
	}
	for _, g := range cs.grantsTo(name) {
		fmt.Fprintf(&b, " [grant %d at %s pass=%v by %s]", g.token, at(time.UnixMicro(g.token)), g.pass, lease.Owner(g.call.value))
	}
	// The first samples that listed it as a holder: a lease left of about
	// a claim window is a pass that no reply named (another caller's
	// acquire made it).
	for i, h := range cs.held[name] {
		if i == 3 {
			break
		}
		fmt.Fprintf(&b, " [held in sample %s..%s, %v left]", at(h.s.at), at(h.s.end), h.left)
	}
	return b.String()
}

func (cs semCalls) releases() []releaseCallOf {
	var out []releaseCallOf
	for _, c := range cs.all {
		if c.kind == releaseCall && c.done && c.err == nil && c.ok {
			out = append(out, releaseCallOf{value: c.value, start: c.start, end: c.end, passed: len(c.passes) > 0})
		}
	}
	return out
}

func (cs semCalls) lastPass(x *rwaiter) (token int64, from int, ok bool) {
	var last *semGrant
	for _, g := range cs.grantsTo(x.name) {
		if g.pass && g.token <= x.token && (last == nil || g.token > last.token) {
			last = &g
		}
	}
	if last == nil {
		return 0, 0, false
	}
	return last.token, last.call.proc, true
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
			if x == nil || !x.start.Before(end) || !pendingThrough(x, end) ||
				r.cutOffNear(x.proc.idx, end.Add(-randomShadow), end.Add(bound)) ||
				!placeHeld(cs.inLineCalls(x.name), randomClaim, end.Add(-clockSlop), end.Add(clockSlop)) {
				continue
			}
			bound += r.pausedWithin(end.Add(-randomPauseMax), end.Add(bound+randomPauseMax))
			checked++
			done := x.returned
			if at, ok := cs.grantedBy(x); ok && at.After(end.Add(-clockSlop)) && (done.IsZero() || at.Before(done)) {
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

// recordRound is a round with no Redis, for tests of how the record of the
// semaphore's and read-write lock's rounds is read: calls and samples are
// made up at times ms(n) milliseconds after a base a minute ago.
type recordRound struct {
	*semRound
	base time.Time
}

func newRecordRound(t *testing.T, rw bool) *recordRound {
	w := &world{t: t, rec: &history.Recorder{}, key: "distlock:{rwrandom}"}
	r := &semRound{round: &round{t: t, w: w, byName: map[string]*rwaiter{}}}
	if rw {
		r.kind.modeOf = func(string) string { return "read" }
	}
	r.wires = []*semWire{{}}
	return &recordRound{semRound: r, base: time.Now().Add(-time.Minute)}
}

func (r *recordRound) ms(n int) time.Time { return r.base.Add(time.Duration(n) * time.Millisecond) }

// call records a call of kind with value, from ms(from) to ms(to).
func (r *recordRound) call(kind callKind, value string, from, to int, edit func(c *semCall)) {
	c := semCall{wireCall: wireCall{kind: kind, key: r.w.key, value: value, ttl: safetyTTL, claim: randomClaim,
		start: r.ms(from), end: r.ms(to), done: true}, rank: -1}
	if edit != nil {
		edit(&c)
	}
	r.wires[0].calls = append(r.wires[0].calls, c)
}

// guard records the waiter named name, whose Lock returned a guard with
// token at ms(at), and samples of it that said Acquired at ms(from),
// ms(from+2), ... before ms(to).
func (r *recordRound) guard(name string, token int64, at, from, to int) {
	x := &rwaiter{name: name, proc: &rproc{}, token: token, start: r.base, returned: r.ms(at)}
	r.waiters, r.byName[name] = append(r.waiters, x), x
	r.w.rec.Add(history.Op{Kind: history.Granted, At: history.At(r.ms(at)), Key: r.w.key, Client: name, Token: token,
		Mode: "read"})
	for n := from; n < to; n += 2 {
		r.w.rec.Add(history.Op{Kind: history.Sample, At: history.At(r.ms(n)), End: history.At(r.ms(n).Add(100 * time.Microsecond)),
			Key: r.w.key, Client: name, Token: token, Held: true})
	}
}

// TestSemRecordPassClaimedInFlight replays, on the record alone, the false
// L1 reports of TestRandomRWMutex (seeds 1796500000000002004 and
// 1796500000000002031 of one soak, 6 ms and 113 ms "past the deadline"):
// a waiter's refresh is in flight (sent long before, its first try lost
// with its connection) when a release passes it the lock; the waiter hears
// of the pass from the release's reply, in its own process, and counts its
// lease from the release's send time, so Lock returns before the refresh's
// reply, which claims the grant under the same token. The record must file
// the grant under the pass, although the refresh was sent first: dated
// from the waiter's last call that stood in line instead, the grant seemed
// to have lapsed before the guard's first samples.
func TestSemRecordPassClaimedInFlight(t *testing.T) {
	r := newRecordRound(t, true)
	value := lease.NewValue("p0.w1")
	token := r.ms(481).UnixMicro() // the pass, at the server's clock
	r.call(acquireCall, value, 0, 1, func(c *semCall) { c.rank, c.fence = 3, r.ms(-100).UnixMicro() })
	r.call(acquireCall, value, 250, 492, func(c *semCall) { c.ok, c.token = true, token }) // the claim
	r.call(releaseCall, lease.NewValue("p0.w0"), 480, 482, func(c *semCall) {
		c.ok, c.passes = true, []semPass{{value: value, token: token}}
	})
	r.call(renewCall, value, 493, 495, func(c *semCall) { c.ok = true })
	// Lock returned at 483, before the refresh's reply; the guard said
	// Acquired from then on.
	r.guard("p0.w1", token, 483, 484, 520)

	cs := r.calls()
	g := cs.grants[token]
	assert.True(t, g.pass, "the grant is the release's pass")
	assert.Equal(t, []semGrant{g}, cs.grantsTo("p0.w1"))
	report := r.checkL1(cs)
	assert.Empty(t, report.L1)
	assert.Zero(t, report.Unchecked)
	assert.Empty(t, report.Regrants)
}

// TestSemRecordHolds: a semaphore's waiter whose refresh lands just after
// a release passed it a permit is granted a new token for the same lease,
// while its guard holds the pass's token (TestRandomSemaphore seed
// 1796800000000002050 reported that guard's samples after the pass's claim
// window, which the renewals that followed covered); a value granted again
// after its lease had ended is a new hold, whose renewals do not count for
// the guard of the first.
func TestSemRecordHolds(t *testing.T) {
	build := func(t *testing.T, second int) *recordRound {
		r := newRecordRound(t, false)
		value := lease.NewValue("p1.w11")
		pass, again := r.ms(102).UnixMicro(), r.ms(second).UnixMicro()
		r.call(acquireCall, value, 0, 1, func(c *semCall) { c.rank, c.fence = 3, r.ms(-100).UnixMicro() })
		r.call(releaseCall, lease.NewValue("p1.w8"), 100, 103, func(c *semCall) {
			c.ok, c.passes = true, []semPass{{value: value, token: pass}}
		})
		r.call(acquireCall, value, second-90, second+1, func(c *semCall) { c.ok, c.token = true, again })
		r.call(renewCall, value, second+60, second+61, func(c *semCall) { c.ok = true })
		r.guard("p1.w11", pass, 104, 105, second+600)
		return r
	}
	t.Run("asked again while held", func(t *testing.T) {
		r := build(t, 103)
		report := r.checkL1(r.calls())
		assert.Empty(t, report.L1)
		assert.Empty(t, report.Regrants)
	})
	t.Run("granted again after the lease ended", func(t *testing.T) {
		// The pass lasted the claim window from 100; the new grant comes
		// at 700. The guard's samples past 565 are reported, each with
		// the later grant whose writes would cover it.
		r := build(t, 700)
		r.recordWrites(r.calls())
		report := history.Check(r.w.rec.Ops())
		require.NotEmpty(t, report.L1)
		assert.Contains(t, report.L1[0], "0s after its deadline")
		assert.True(t, slices.ContainsFunc(report.L1, func(l string) bool {
			return strings.Contains(l, "a later grant of the same value")
		}), "L1: %v", report.L1)
		assert.Len(t, report.Regrants, 1)
	})
}

// TestSemRecordUnnamedPass replays, on the record alone, the false W2
// report of TestRandomRWMutex seed 1798000000000000022 (the W2 reports of
// TestRandomSemaphore seeds 1797100000000002074 and 1797500000000001036
// had the same shape): B's acquire call, finding the lock free, passed it
// to A, first in line, and granted B beside it in the same script; the
// reply names B's grant alone. A was cut off and never claimed the pass,
// so only the sampler saw A's grant, in a sample that took 2.6 ms on a
// loaded machine. Dated by the end of that sample, A's grant seemed to
// come after B's, and B to have overtaken A. The sample's server clock
// and what was left of A's lease date the grant within a millisecond:
// a lease passed in line lasts the claim window from the pass.
func TestSemRecordUnnamedPass(t *testing.T) {
	r := newRecordRound(t, true)
	us := func(ms, us int) time.Time { return r.ms(ms).Add(time.Duration(us) * time.Microsecond) }
	va, vb := lease.NewValue("p1.w14"), lease.NewValue("p2.w15")
	tokenB := us(400, 726).UnixMicro()
	a := &rwaiter{name: "p1.w14", proc: &rproc{idx: 1}, start: r.ms(0), seq: 0, returned: r.ms(600), gaveUp: r.ms(600),
		cancelled: true}
	b := &rwaiter{name: "p2.w15", proc: &rproc{idx: 2}, start: r.ms(300), seq: 1, returned: r.ms(402), token: tokenB}
	r.waiters, r.joined = []*rwaiter{a, b}, []*rwaiter{a, b}
	r.byName[a.name], r.byName[b.name] = a, b
	r.kind.unit = "the lock"
	r.call(acquireCall, va, 0, 1, func(c *semCall) { c.rank, c.fence = 2, r.ms(-100).UnixMicro() })
	r.call(acquireCall, va, 250, 251, func(c *semCall) { c.rank, c.fence = 0, r.ms(-100).UnixMicro() })
	r.call(acquireCall, vb, 400, 401, func(c *semCall) { c.ok, c.token = true, tokenB })
	// The lease passed to A ends at the pass's millisecond, rounded up,
	// plus the claim window; the sample ran at 401 ms of the server's clock.
	r.samples = []lineSample{{at: us(401, 205), end: us(403, 838), now: r.ms(401), holders: []lease.Holding{
		{Value: va, TTL: randomClaim}, {Value: vb, TTL: safetyTTL},
	}}}
	r.checkOrder(r.calls())
}
