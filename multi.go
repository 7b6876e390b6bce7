package distlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/lease"
)

// A MultiMutex is a distributed lock over several names at once: Lock
// returns holding every name, or holds none. Each name is the same lock as
// a [Mutex] of that name (and as the exclusive side of an [RWMutex] of
// it): a MultiMutex on {a, b} excludes NewMutex(client, "a"), and waits
// behind it in a's line like any other waiter.
//
// # Order, deadlock and fairness
//
// Whatever order the names are given in, a request takes them in one
// order that every process agrees on: by Redis Cluster slot, then by key
// (see [lease.SortSet]). It holds the names it has taken while it waits
// for the next one, standing in that name's line, and it stands in every
// line with one ticket, taken the first time it stood in line. So:
//
//   - It cannot deadlock, with other MultiMutexes or with single locks. A
//     request holds only names that come before the one it waits for, and
//     the holder of a single lock waits for nothing; every wait therefore
//     points at the holder of a later name, or at a request ahead in the
//     same line that waits for the same holder, and no chain of waits can
//     close into a circle. Two requests on {a, b} and {b, a}, or a chain
//     {a, b}, {b, c}, {c, a}, take their shared names in the same order.
//     (This assumes what it says: a holder waits for nothing. A program
//     that holds a lock and then waits for another, a Mutex inside a
//     Mutex or a MultiMutex inside a guard, steps outside the order and
//     can deadlock as nested locks always can. Take such names in one
//     MultiMutex, or nest them in the order that [MultiMutex.Keys] gives.)
//   - Every line orders the requests in it by their ticket, the moment each
//     first stood in line, so a request that waits for a name is served
//     before every request that began to wait after it, in every line it
//     meets them in; within a line, a MultiMutex and the Mutexes of the
//     name are served first come, first served.
//   - What a waiting request costs the others: the names before the one it
//     waits for stay held while it waits (that is the price of deadlock
//     freedom without giving them back), but each with a lease of only the
//     claim window ([WithClaimWindow]), renewed while the request waits.
//     A waiter that dies frees them within its claim window. A later
//     request may take a free name that an earlier request has not reached
//     yet; it never takes one that the earlier request waits for.
//
// Once every name is held, Lock returns one [Guard] for the set: one actor
// renews every name (one script per slot, as batched renewals are), and
// the guard is Lost when any name's lease is in doubt past its deadline or
// refused; Release and Leave end every name. [Guard.Token] is the token of
// the first name given, [Guard.TokenOf] each name's.
//
// # Costs
//
// On one Redis server, or when the names share a Cluster slot (a shared
// hash tag is not possible: each name is its own tag), an acquisition
// costs one script and a release one script, whatever the number of names.
// Names over several slots cost one script per slot: one after the other,
// in the set's order, to acquire; all at once to renew and to release, so
// that a slow or unreachable node holds up no other (lease/COSTS.md).
//
// A MultiMutex is safe for concurrent use; the zero MultiMutex cannot be
// used: make one with [NewMultiMutex].
type MultiMutex struct {
	names []string
	set   *lockSet
}

// lockSet is what a MultiMutex's guard shares with it: the engines of its
// names, in the order the set takes them, and where each group (the names
// one script may serve) begins.
type lockSet struct {
	engines []engine     // a Mutex's engine for each name, in the order given
	order   []int        // order[i]: the index in engines of the set's i-th name
	keys    []lease.Keys // the names' keys, in the set's order
	groups  []int        // the first index of each group, and len(keys)
	store   setStore
}

// setStore is the lease protocol of a set, as *lease.Client serves it.
type setStore interface {
	AcquireAll(ctx context.Context, ks []lease.Keys, value string, ttl time.Duration, p *lease.Place) (lease.SetGrant, error)
	ReleaseAll(ctx context.Context, ks []lease.Keys, value string) ([]lease.Release, error)
	CancelAll(ctx context.Context, ks []lease.Keys, value string, ttl time.Duration) ([]lease.Release, error)
	CancelAllDedicated(ctx context.Context, ks []lease.Keys, value string, ttl time.Duration) ([]lease.Release, error)
	RenewBatch(ctx context.Context, items []lease.RenewItem, out []lease.Renewal) error
	BatchGroup(k lease.Keys) string
}

// kindMultiMutex names a MultiMutex in the Observer's infos.
const kindMultiMutex = "multimutex"

// NewMultiMutex returns a MultiMutex over names, reached through client.
// Each name follows the rules of [NewMutex]'s key; there must be 1 to 64
// ([lease.MaxSet]) of them, none twice. The options are a Mutex's, and
// apply to every name. Like NewMutex it sends nothing to Redis, and
// returns an error matching [ErrInvalidOption] for a bad name or option.
func NewMultiMutex(client rueidis.Client, names []string, opts ...Option) (*MultiMutex, error) {
	return NewMultiMutexOn(lease.FromRueidis(client), names, opts...)
}

// NewMultiMutexOn is [NewMultiMutex] on any client that implements the
// seam [lease.Redis]; the module github.com/distkit-go/distlock/goredis
// calls it for a go-redis client.
func NewMultiMutexOn(client lease.Redis, names []string, opts ...Option) (*MultiMutex, error) {
	switch {
	case len(names) == 0:
		return nil, invalid("names", "is empty")
	case len(names) > lease.MaxSet:
		return nil, invalid("names", "has %d names, more than %d", len(names), lease.MaxSet)
	}
	s := &lockSet{engines: make([]engine, len(names)), order: make([]int, len(names)), keys: make([]lease.Keys, len(names))}
	for i, name := range names {
		for _, other := range names[:i] {
			if other == name {
				return nil, invalid("names", "has %q twice", name)
			}
		}
		e := &s.engines[i]
		if err := e.init(client, name, kindMutex, 0, opts); err != nil {
			return nil, err
		}
		e.kind = kindMultiMutex
		s.keys[i] = e.keys
	}
	st, ok := s.engines[0].store.(setStore)
	if !ok {
		return nil, invalid("client", "cannot serve a set of locks")
	}
	s.store = st
	// The set's order: the keys sorted, and where each name was given.
	if err := lease.SortSet(s.keys); err != nil {
		return nil, invalid("names", "%v", err)
	}
	for i, k := range s.keys {
		for j := range s.engines {
			if s.engines[j].keys.Lease == k.Lease {
				s.order[i] = j
			}
		}
		if i == 0 || st.BatchGroup(k) != st.BatchGroup(s.keys[i-1]) {
			s.groups = append(s.groups, i)
		}
	}
	s.groups = append(s.groups, len(s.keys))
	return &MultiMutex{names: append([]string(nil), names...), set: s}, nil
}

// Names returns the names, in the order they were given.
func (m *MultiMutex) Names() []string { return append([]string(nil), m.names...) }

// Keys returns the Redis keys that hold the names' leases, in the order
// the set takes them.
func (m *MultiMutex) Keys() []string {
	keys := make([]string, len(m.set.keys))
	for i, k := range m.set.keys {
		keys[i] = k.Lease
	}
	return keys
}

// Lock acquires every name, waiting while any is held, as [Mutex.Lock]
// waits for one: in the names' lines in Redis, without polling, one name
// after the other in the set's order (see "Order, deadlock and fairness"
// above). It returns a [Guard] that holds them all, or an error and holds
// none.
//
// ctx bounds the wait and the hold, as for Mutex.Lock. When ctx ends, or
// the max wait ([WithMaxWait]) runs out, Lock returns at once with an
// error matching ctx.Err() (or [ErrTimeout]); in the background it gives
// back every name it held and leaves every line it stood in (the names
// that a release was passing to it at that moment are passed on within
// their claim window at worst). On each name that a call of it reached
// it leaves the void marker of its value, the key
// "<lease key>:void:<value>", for one TTL, so that a call still on its
// way cannot take the name or stand in its line after Lock gave up (see
// [Mutex.Lock]); the names after the one it waited for, which no call
// reached, it does not touch. It is safe for concurrent use.
func (m *MultiMutex) Lock(ctx context.Context) (*Guard, error) {
	if m.set == nil {
		return nil, zeroValue("MultiMutex")
	}
	e := m.set.first()
	return m.acquire(ctx, e.lockMode(), e.maxWait, e.retryInterval)
}

// TryLock makes a single attempt to take every name: it takes all of them,
// or none and leaves every name as it found it. Within a group (one
// server, or one Cluster slot) it grants no name before it knows that
// none is held, so a refused attempt issues no fencing token for the
// free names; over several groups, the groups before the one with a held
// name are taken and given back again, and their tokens have moved on.
// When a name is held it returns an
// error matching [ErrNotAcquired], a [*NotAcquiredError] that names that
// name's key and its holder. Like [MultiMutex.Lock], ctx bounds the
// attempt and the hold.
func (m *MultiMutex) TryLock(ctx context.Context) (*Guard, error) {
	if m.set == nil {
		return nil, zeroValue("MultiMutex")
	}
	return m.acquire(ctx, once, 0, 0)
}

// TryLockFor tries to take every name for up to timeout, polling as
// [Mutex.TryLockFor] does: each try is a [MultiMutex.TryLock], all or
// nothing, and retryInterval apart (0: at once). It never stands in line.
func (m *MultiMutex) TryLockFor(ctx context.Context, timeout, retryInterval time.Duration) (*Guard, error) {
	if m.set == nil {
		return nil, zeroValue("MultiMutex")
	}
	switch {
	case timeout < 0:
		return nil, invalid("timeout", "%v is negative", timeout)
	case retryInterval < 0:
		return nil, invalid("retry interval", "%v is negative", retryInterval)
	case timeout == 0:
		return m.acquire(ctx, once, 0, 0)
	}
	return m.acquire(ctx, polling, timeout, retryInterval)
}

// first returns the engine of the first name given: the guard's, whose
// key and token it reports.
func (s *lockSet) first() *engine { return &s.engines[0] }

// engine returns the engine of the set's i-th name.
func (s *lockSet) engine(i int) *engine { return &s.engines[s.order[i]] }

// posOf returns where in the set's order the j-th name given is.
func (s *lockSet) posOf(j int) int {
	for i, o := range s.order {
		if o == j {
			return i
		}
	}
	return -1
}

// group returns the keys of group gi.
func (s *lockSet) group(gi int) []lease.Keys { return s.keys[s.groups[gi]:s.groups[gi+1]] }

// reachedOf returns the keys of group gi that a request's calls reached:
// the first reached[gi].
func (s *lockSet) reachedOf(gi int, reached []int) []lease.Keys {
	return s.keys[s.groups[gi] : s.groups[gi]+reached[gi]]
}

// ngroups returns the number of groups.
func (s *lockSet) ngroups() int { return len(s.groups) - 1 }

// setAcquirer is the state of one acquire call of a MultiMutex. Its
// embedded acquirer keeps the call's context, value, limit and timer, and
// its e is the engine of the name the call waits for (for its room and
// its errors).
type setAcquirer struct {
	acquirer
	s      *lockSet
	tokens []int64     // the token of each name held, in the set's order
	sent   []time.Time // for each group held, the send time of the last write of its leases
	ttl    []time.Duration
	// reached counts, for each group, the names (from its first) that a
	// call of the request may have written to: all of them after a call
	// without a reply, otherwise up to the name the furthest call stopped
	// at. A request that gives up cancels these names alone.
	reached []int
	// ticket is the request's place in every line, once it stood in one.
	ticket int64
	// seen is, for each name, the largest token the request learnt of (a
	// reply's fence, its own grant, a grant announced to it): what a
	// Mutex's call brings as lease.Place.Seen (see setSeen).
	seen []int64
}

func (m *MultiMutex) acquire(ctx context.Context, mode acquireMode, wait, interval time.Duration) (*Guard, error) {
	s := m.set
	first := s.first()
	if ctx == nil {
		return nil, invalid("ctx", "is nil")
	}
	if err := ctx.Err(); err != nil {
		return nil, first.ctxError(ctx)
	}
	a := &setAcquirer{
		acquirer: acquirer{e: first, ctx: ctx, start: time.Now(), value: lease.NewValue(first.owner)},
		s:        s,
		tokens:   make([]int64, len(s.keys)),
		seen:     make([]int64, len(s.keys)),
		sent:     make([]time.Time, s.ngroups()),
		ttl:      make([]time.Duration, s.ngroups()),
		reached:  make([]int, s.ngroups()),
	}
	if wait > 0 {
		a.limit = a.start.Add(wait)
	}
	var g *Guard
	var err error
	switch mode {
	case once:
		g, err = a.once()
	case polling:
		g, err = a.poll(interval)
	default:
		g, err = a.queue()
	}
	if a.timer != nil {
		a.timer.Stop()
	}
	if a.stopCalls != nil {
		a.stopCalls()
	}
	if g == nil && a.dirty {
		// Give back whatever of the value may be in Redis, on every name
		// a call reached, in the background: the caller does not wait on
		// it.
		value, reached := a.value, a.reached
		proc.goWork(func() {
			defer proc.work.done()
			s.cleanup(value, reached)
		})
	}
	info := AcquireInfo{Key: first.keys.Lease, Kind: kindMultiMutex, Owner: first.owner, Wait: time.Since(a.start), Attempts: a.attempts, Err: err}
	if g != nil {
		info.Token = g.token
	}
	first.obs.ObserveAcquire(info)
	return g, err
}

// cleanup cancels value on the names that a call of it reached, the
// first reached[gi] of each group gi (see engine.cleanup): it voids it,
// takes it out of every line and gives back every name it holds, passing
// each to its line. A name that no call reached is not touched. It may
// take up to a TTL, on connections of its own.
func (s *lockSet) cleanup(value string, reached []int) {
	e := &s.engines[0]
	ctx, cancel := context.WithTimeout(context.Background(), e.ttl)
	defer cancel()
	s.eachGroup(func(gi int) {
		ks := s.reachedOf(gi, reached)
		if len(ks) == 0 {
			return
		}
		sent := time.Now()
		rs, err := s.store.CancelAllDedicated(ctx, ks, value, e.ttl)
		if err != nil {
			e.logger().Warn("distlock: could not clean up after giving up on a set; it expires on its own", "err", err)
			return
		}
		s.deliver(s.groups[gi], rs, sent)
	})
}

// deliver tells the waiters of this process of the passes that the
// releases rs of the names from index at on made.
func (s *lockSet) deliver(at int, rs []lease.Release, sent time.Time) {
	for i, r := range rs {
		deliverPasses(s.engine(at+i).roomKey(), r, sent)
	}
}

// call sends AcquireAll for group gi (p nil: a single attempt) with the
// reply deadline of its TTL (replyDeadline), as acquirer.call sends a lock's: on the
// caller's goroutine when nothing can end the call early, and otherwise
// in the background while the caller waits for it, ctx and the limit.
func (a *setAcquirer) call(gi int, p *lease.Place) (sg lease.SetGrant, err, stop error) {
	// Every group is granted the TTL: a waiting request shortens those it
	// holds to the claim window (see keep).
	s, ttl := a.s, a.e.ttl
	ks := s.group(gi)
	dl := replyDeadline(time.Now(), ttl)
	a.attempts++
	if a.ctx.Done() == nil && a.limit.IsZero() {
		ctx, cancel := context.WithDeadline(a.ctx, dl)
		defer cancel()
		sg, err = s.store.AcquireAll(ctx, ks, a.value, ttl, p)
		return sg, err, nil
	}
	var place *lease.Place
	if p != nil {
		cp := *p
		place = &cp
	}
	type result struct {
		sg  lease.SetGrant
		err error
	}
	done := make(chan result, 1)
	ctx, value := a.ctx, a.value
	if !a.limit.IsZero() {
		if a.stopCalls == nil {
			a.callCtx, a.stopCalls = context.WithCancel(a.ctx)
		}
		ctx = a.callCtx
	}
	proc.goWork(func() {
		defer proc.work.done()
		ctx, cancel := context.WithDeadline(ctx, dl)
		defer cancel()
		var r result
		r.sg, r.err = s.store.AcquireAll(ctx, ks, value, ttl, place)
		done <- r
	})
	var limit <-chan time.Time
	if !a.limit.IsZero() {
		t := time.NewTimer(time.Until(a.limit))
		defer t.Stop()
		limit = t.C
	}
	select {
	case r := <-done:
		return r.sg, r.err, nil
	case <-a.ctx.Done():
		return lease.SetGrant{}, nil, a.e.ctxError(a.ctx)
	case <-limit:
		return lease.SetGrant{}, nil, &TimeoutError{Key: a.e.keys.Lease, Waited: time.Since(a.start), Attempts: a.attempts}
	}
}

// take sends one call for group gi and sorts its outcome: held reports
// that the group is held whole (its tokens and send time are recorded);
// otherwise sg says where it stopped. retry reports an error that came
// without a reply from Redis, which a waiter rides out.
func (a *setAcquirer) take(gi int, p *lease.Place) (sg lease.SetGrant, held, retry bool, err error) {
	sent := time.Now()
	sg, err, stop := a.call(gi, p)
	n := len(a.s.group(gi))
	if stop != nil || err != nil {
		// It may have run, or stopped anywhere (an error reply).
		a.reached[gi] = n
	} else {
		a.reached[gi] = max(a.reached[gi], min(sg.Stopped+1, n))
	}
	if stop != nil {
		a.dirty, a.uncertain = true, true
		return sg, false, false, stop
	}
	if err != nil {
		replied := lease.IsReply(err)
		if !replied {
			a.dirty, a.uncertain = true, true
		}
		if a.ctx.Err() != nil {
			return sg, false, false, a.e.ctxError(a.ctx)
		}
		var ackErr *lease.AckError
		if timeout := lease.IsTimeout(err); (errors.Is(err, context.DeadlineExceeded) || timeout) && !replied {
			// The call's own deadline, or the client's own timeout: no
			// reply in time, as for a lock (acquirer.attempt).
			nr := &NoReplyError{Key: a.s.keys[a.s.groups[gi]].Lease, After: time.Since(sent)}
			if timeout {
				nr.Err = err
			}
			return sg, false, true, nr
		}
		// A TRYAGAIN that outlasted the call (a slot still migrating at
		// its deadline) did not run the script: a waiter asks again, as
		// after a call without a reply.
		retry := (!replied && !errors.As(err, &ackErr)) || lease.IsTryAgain(err)
		return sg, false, retry, fmt.Errorf("distlock: acquiring %s: %w", a.s.keys[a.s.groups[gi]].Lease, err)
	}
	at := a.s.groups[gi]
	copy(a.tokens[at:], sg.Tokens)
	for i, token := range sg.Tokens {
		a.seen[at+i] = max(a.seen[at+i], token)
	}
	if sg.Stopped < n {
		return sg, false, false, nil
	}
	if !time.Now().Before(leaseDeadline(sent, a.e.ttl)) {
		// The reply came too late to trust: ask again, which grants the
		// names anew with a fresh send time.
		a.dirty = true
		return sg, false, true, &NoReplyError{Key: a.s.keys[at].Lease, After: time.Since(sent)}
	}
	a.sent[gi], a.ttl[gi] = sent, a.e.ttl
	return sg, true, false, nil
}

// giveBack releases the groups before gi, which the call took before it
// met a held name (a single attempt: all or nothing) or lost one (a
// waiting call, which starts again): the names of each that a call
// reached. A release that fails leaves the call dirty: its clean-up
// cancels the value on every name reached when it gives up.
func (a *setAcquirer) giveBack(gi int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), min(cleanupTimeout, a.e.claim))
	defer cancel()
	for g := range gi {
		ks := a.s.reachedOf(g, a.reached)
		if len(ks) == 0 {
			continue
		}
		sent := time.Now()
		rs, err := a.s.store.ReleaseAll(ctx, ks, a.value)
		if err != nil {
			a.dirty = true
			continue
		}
		a.s.deliver(a.s.groups[g], rs, sent)
	}
}

// blocked returns the error of a single attempt that met a held name.
func (a *setAcquirer) blocked(gi int, sg lease.SetGrant) error {
	k := a.s.keys[a.s.groups[gi]+sg.Stopped]
	return &NotAcquiredError{Key: k.Lease, Holder: lease.Owner(sg.Blocked.Holder), Remaining: sg.Blocked.HolderTTL}
}

// once makes a single attempt at every group, in order, and gives back
// what it took when a name is held.
func (a *setAcquirer) once() (*Guard, error) {
	for gi := range a.s.ngroups() {
		sg, held, _, err := a.take(gi, nil)
		if held {
			continue
		}
		a.giveBack(gi)
		if err != nil {
			return nil, err
		}
		return nil, a.blocked(gi, sg)
	}
	return a.granted()
}

// poll makes single attempts, interval apart, until one takes every name,
// the limit passes or ctx ends.
func (a *setAcquirer) poll(interval time.Duration) (*Guard, error) {
	for {
		g, err := a.once()
		var na *NotAcquiredError
		if g != nil || (err != nil && !errors.As(err, &na) && !errors.Is(err, ErrNoReply)) {
			return g, err
		}
		if _, _, err := a.wait(interval, nil); err != nil {
			return nil, err
		}
	}
}

// queue takes the groups in order, standing in the line of the first name
// it cannot have and sleeping in that name's room until the name is
// passed to it, its place is due for a refresh, or the holder's lease
// would end (see acquirer.queue, whose rules it follows for one line at
// a time). Each group is granted the TTL; while the request waits for a
// later group, it shortens the groups it holds to the claim window and
// renews them every half window, after each call at which that renewal
// would fall due before the next call (see keep), so that a waiter that
// dies costs the others no more and a waiter whose nodes answer keeps
// what it holds. (A call to the group it waits for that gets no reply
// holds up those renewals until its deadline: the held names may then
// lapse, and the set starts again.) If one of them is lost, it gives back
// everything and starts again from the first group, with the same ticket.
//
// A name passed to it is taken with the rest of its group by the next
// call, except the set's last name: then every name is held, and the set
// is held at once, as a Mutex's waiter holds a lock passed to it (its
// guard renews every name to the TTL a third of the claim window in).
func (a *setAcquirer) queue() (*Guard, error) {
	s := a.s
	place := lease.Place{Claim: a.e.claim, Room: proc.roomID}
	last := len(s.keys) - 1
	var (
		r           *room
		roomFor     = -1 // the index of the name whose room r is
		pre         []preJoined
		queued      time.Time // send time of the last call that left it in line
		queuedFence int64     // the last token issued when that call ran
		pause       = backoff{first: DefaultRetryInterval, most: 16 * DefaultRetryInterval}
	)
	leave := func() {
		if r != nil {
			r.leave(a.waiter)
			r, a.waiter, roomFor = nil, nil, -1
		}
		for _, p := range pre {
			p.r.leave(p.w)
		}
		pre = pre[:0]
	}
	defer leave()
	restart := func(gi int) {
		leave()
		a.giveBack(gi)
	}
	gi, lastStop := 0, -1
	for {
		if gi == s.ngroups() {
			g, err := a.granted()
			if !errors.Is(err, ErrNoReply) {
				return g, err
			}
			// Held whole, but a group's leases were last written too long
			// ago to trust: renew them, or start again.
			a.dirty = true
			if !a.keep(gi, false, time.Now()) {
				restart(gi)
				gi, lastStop = 0, -1
			}
			continue
		}
		if lastStop < 0 && r == nil {
			// Before the first call for this group, join the rooms that
			// this process has open for its names already: a grant to the
			// request in one of them, right after the call, is not missed.
			pre = a.preJoin(gi, pre)
		}
		sent := time.Now()
		place.Ticket = a.ticket
		place.SetSeen = a.setSeen(gi, lastStop)
		sg, held, retry, err := a.take(gi, &place)
		switch {
		case held:
			pause.reset()
			leave()
			gi, lastStop = gi+1, -1
			continue
		case err != nil && !retry:
			return nil, err
		case err != nil:
			if e := a.e; e.debug() {
				e.logger().Debug("distlock: asking for a set of locks failed; trying again", "err", err)
			}
			// The next call comes after the pause: renew what falls due
			// before it.
			p := pause.next()
			if !a.keep(gi, true, time.Now().Add(p)) {
				restart(gi + 1)
				gi, lastStop = 0, -1
				continue
			}
			if _, _, err := a.wait(p, a.waiter); err != nil {
				return nil, err
			}
			continue
		}
		pause.reset()
		a.dirty = true
		stop := s.groups[gi] + sg.Stopped
		before := a.seen[stop]
		a.seen[stop] = max(before, sg.Blocked.Fence)
		if lastStop >= 0 && stop < lastStop {
			// A name of this group that it held is lost (its claim window
			// lapsed, or someone deleted it): it must not hold the names
			// after it while it waits, so it gives everything back and
			// starts again.
			restart(gi + 1)
			gi, lastStop = 0, -1
			continue
		}
		lastStop = stop
		if sg.Blocked.Rank < 0 && sg.Blocked.Fence > before {
			// Refused as stale (lease.Place.Seen): our place lapsed while
			// the name changed hands. Ask again at once with its token
			// (the names before it are held: this call granted them).
			continue
		}
		queued, queuedFence = sent, sg.Blocked.Fence
		if sg.Blocked.Ticket > 0 {
			a.ticket = sg.Blocked.Ticket
		}
		if roomFor != stop {
			if r != nil {
				r.leave(a.waiter)
				r, a.waiter = nil, nil
			}
			a.e = s.engine(stop)
			fresh, joined := false, false
			for _, p := range pre {
				if p.at == stop {
					r, a.waiter, joined = p.r, p.w, true
				} else {
					p.r.leave(p.w)
				}
			}
			pre = pre[:0]
			if !joined {
				r, fresh = proc.enterRoom(a.e, true)
				a.waiter = r.join(a.value)
			}
			roomFor = stop
			if !joined && !fresh {
				// A grant may have reached the room before we joined it.
				continue
			}
		}
		wait := refreshAfter(a.e.claim)
		if !r.listen() {
			wait = min(wait, DefaultRetryInterval)
		}
		if sg.Blocked.Rank == 0 && sg.Blocked.HolderTTL >= 0 {
			wait = min(wait, sg.Blocked.HolderTTL+expiryGrace)
		}
		until := sent.Add(wait)
		if !a.keep(gi, true, until) {
			// A name of an earlier group is lost, or may be: as above.
			restart(gi + 1)
			gi, lastStop = 0, -1
			continue
		}
		for {
			why, note, err := a.wait(max(time.Until(until), 0), a.waiter)
			if err != nil {
				return nil, err
			}
			if why == wokeByGrant {
				a.seen[stop] = max(a.seen[stop], note.token)
			}
			if why != wokeByGrant || stop != last || a.e.ack.Replicas > 0 {
				break // ask again
			}
			// The set's last name, passed to it: every name is held.
			from := note.sent
			if note.token > queuedFence && queued.After(from) {
				from = queued
			}
			if from.IsZero() {
				continue // an announcement older than our last call
			}
			if !usableGrant(leaseDeadline(from, a.e.claim), a.e.claim) {
				break // too late to hold at once: claim it by asking
			}
			a.tokens[stop] = note.token
			a.sent[gi], a.ttl[gi] = minTime(from, queued), a.e.claim
			gi = s.ngroups()
			break
		}
	}
}

// setSeen returns the seen tokens of group gi's call
// (lease.Place.SetSeen): for each name the largest token the request
// learnt of, but for the names the last call left held (those before
// lastStop, when it stopped in this group): their grant's token less one,
// so that this call, if it lands after the request has given them back
// or lost them, does not grant them anew. The slice is new for each call:
// a call abandoned to ctx may still read its own.
func (a *setAcquirer) setSeen(gi, lastStop int) []int64 {
	from, to := a.s.groups[gi], a.s.groups[gi+1]
	seen := slices.Clone(a.seen[from:to])
	for i := from; i < lastStop; i++ {
		if a.tokens[i] > 0 {
			seen[i-from] = a.tokens[i] - 1
		}
	}
	return seen
}

// preJoined is a room that the request joined before a call, in case the
// call leaves it in the line of that room's name.
type preJoined struct {
	at int // the name's index
	r  *room
	w  *waiter
}

// preJoin joins the rooms open in this process for the names of group gi,
// but for those it has joined already (pre): a call that got no reply
// asks again with the rooms it joined for the first, and a room is
// joined, and left, once per call.
func (a *setAcquirer) preJoin(gi int, pre []preJoined) []preJoined {
	s := a.s
	for i := s.groups[gi]; i < s.groups[gi+1]; i++ {
		if slices.ContainsFunc(pre, func(p preJoined) bool { return p.at == i }) {
			continue
		}
		if r, _ := proc.enterRoom(s.engine(i), false); r != nil {
			pre = append(pre, preJoined{at: i, r: r, w: r.join(a.value)})
		}
	}
	return pre
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// keep looks after the groups before gi, which the request holds while it
// waits for a later one, until its next call at next (which calls keep
// again): with short set, it shortens those still held for the TTL to the
// claim window (what a waiter that dies may cost the others), and it
// renews each one whose renewal, half of its lease after its last write,
// falls due before next. So a hold is renewed at the call before its
// renewal is due, however the calls fall against it: waiting for the call
// after the one it is due at would leave it, when calls come every half
// window, past its lease. It reports false when one of them is no longer
// held, or may not be (no renewal was confirmed before its lease would
// end).
func (a *setAcquirer) keep(gi int, short bool, next time.Time) bool {
	claim := a.e.claim
	for g := range gi {
		ttl := a.ttl[g]
		if short {
			ttl = claim
		}
		if a.ttl[g] == ttl && a.sent[g].Add(refreshAfter(ttl)).After(next) {
			continue
		}
		dl := leaseDeadline(a.sent[g], a.ttl[g])
		ctx, cancel := context.WithDeadline(a.ctx, dl)
		sent := time.Now()
		refused, err := a.s.renew(ctx, g, a.value, ttl)
		cancel()
		switch {
		case err == nil && refused != nil:
			return false
		case err == nil:
			a.sent[g], a.ttl[g] = sent, ttl
		case !time.Now().Before(dl):
			return false
		}
	}
	return true
}

// granted makes the guard of a set held whole. Its lease deadline is the
// earliest of the groups': a group that the request held while it waited
// runs for the claim window until the guard's first renewal extends every
// name to the TTL.
func (a *setAcquirer) granted() (*Guard, error) {
	if a.ctx.Err() != nil {
		a.dirty = true
		return nil, a.e.ctxError(a.ctx)
	}
	sent, ttl := a.sent[0], a.ttl[0]
	for g := 1; g < len(a.sent); g++ {
		if a.sent[g].Add(a.ttl[g]).Before(sent.Add(ttl)) {
			sent, ttl = a.sent[g], a.ttl[g]
		}
	}
	if !time.Now().Before(leaseDeadline(sent, ttl)) {
		a.dirty = true
		return nil, &NoReplyError{Key: a.s.first().keys.Lease, After: time.Since(sent)}
	}
	first := a.s.first()
	hold := &setHold{set: a.s, tokens: a.tokens}
	return first.newGuardOf(a.ctx, a.value, a.tokens[a.s.posOf(0)], a.attempts-1, sent, ttl, a.uncertain, hold), nil
}

// setHold is what a guard of a MultiMutex holds beyond a Mutex's guard:
// the set, and the token of each of its names.
type setHold struct {
	set    *lockSet
	tokens []int64 // in the set's order
	// refused is the lease key of the name whose renewal was refused, for
	// the guard's LostError; written by the renewal that found it, read by
	// the actor once that renewal has answered.
	refused string
	// What the final delete's tries have learnt: the groups answered, and
	// whether every name answered so far was still held until deleted.
	// Only the owner of the guard's end touches them.
	answered []bool
	notHeld  bool
}

// refusal names a lease whose renewal Redis refused, and what it found
// there instead.
type refusal struct{ key, holder string }

// renew renews group gi's leases with value to ttl, in one script, and
// returns the first refusal, or nil when every one of them was extended.
func (s *lockSet) renew(ctx context.Context, gi int, value string, ttl time.Duration) (*refusal, error) {
	ks := s.group(gi)
	if s.engines[0].ack.Replicas > 0 {
		// A client that waits for replicas renews one lease at a time.
		for _, k := range ks {
			r, err := s.engines[0].store.Renew(ctx, k, value, ttl)
			switch {
			case err != nil:
				return nil, err
			case !r.OK:
				return &refusal{k.Lease, r.Holder}, nil
			}
		}
		return nil, nil
	}
	items := make([]lease.RenewItem, len(ks))
	for i, k := range ks {
		items[i] = lease.RenewItem{Keys: k, Value: value, TTL: ttl}
	}
	out := make([]lease.Renewal, len(ks))
	if err := s.store.RenewBatch(ctx, items, out); err != nil {
		return nil, err
	}
	for i, r := range out {
		if !r.OK {
			return &refusal{ks[i].Lease, r.Holder}, nil
		}
	}
	return nil, nil
}

// renewAll renews every name of the set with value to ttl, one script per
// group, and answers as one lease's renewal would: OK when every name was
// extended, refused (with the holder found) when any was refused, and an
// error when a group got no answer and none was refused.
func (h *setHold) renewAll(ctx context.Context, value string, ttl time.Duration) (lease.Renewal, error) {
	s := h.set
	refusals := make([]*refusal, s.ngroups())
	errs := make([]error, s.ngroups())
	s.eachGroup(func(gi int) { refusals[gi], errs[gi] = s.renew(ctx, gi, value, ttl) })
	for gi, refused := range refusals {
		if refused != nil && errs[gi] == nil {
			h.refused = refused.key
			return lease.Renewal{Holder: refused.holder}, nil
		}
	}
	for _, err := range errs {
		if err != nil {
			return lease.Renewal{}, err
		}
	}
	return lease.Renewal{OK: true}, nil
}

// releaseAll releases (or, with void, cancels) every name of the set, one
// script per group, and answers as one lease's release would: Deleted
// when every name still held value until it was deleted. It tells this
// process's waiters of the passes at once. A try goes on from the tries
// before it: a group already answered is not sent again.
func (h *setHold) releaseAll(ctx context.Context, value string, void bool) (lease.Release, error) {
	s := h.set
	if h.answered == nil {
		h.answered = make([]bool, s.ngroups())
	}
	results := make([][]lease.Release, s.ngroups())
	errs := make([]error, s.ngroups())
	s.eachGroup(func(gi int) {
		if h.answered[gi] {
			return // a try before this one released it
		}
		sent := time.Now()
		if void {
			results[gi], errs[gi] = s.store.CancelAll(ctx, s.group(gi), value, s.engines[0].ttl)
		} else {
			results[gi], errs[gi] = s.store.ReleaseAll(ctx, s.group(gi), value)
		}
		if errs[gi] == nil {
			s.deliver(s.groups[gi], results[gi], sent)
		}
	})
	var firstErr error
	for gi, err := range errs {
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		if results[gi] != nil {
			h.answered[gi] = true
		}
		for _, r := range results[gi] {
			h.notHeld = h.notHeld || !r.Deleted
		}
	}
	return lease.Release{Deleted: !h.notHeld && firstErr == nil}, firstErr
}

// eachGroup calls f for every group of s, at once when there are several
// (so that a slow or unreachable node holds up no other), and returns once
// every call has.
func (s *lockSet) eachGroup(f func(gi int)) {
	if s.ngroups() == 1 {
		f(0)
		return
	}
	var wg sync.WaitGroup
	for gi := range s.ngroups() {
		wg.Go(func() { f(gi) })
	}
	wg.Wait()
}

// giveUp releases, in the background, the names of a set whose loss is
// final (one of them was refused), until end at the latest. The guard is
// retired: nothing else sends for it, so the final delete's state is this
// goroutine's alone. A failure leaves the names to expire.
func (h *setHold) giveUp(value string, void bool, end time.Time) {
	proc.goWork(func() {
		defer proc.work.done()
		ctx, cancel := context.WithDeadline(context.Background(), end)
		defer cancel()
		_, _ = h.releaseAll(ctx, value, void)
	})
}

// TokenOf returns the fencing token of name, one of a [MultiMutex]'s
// names, drawn from that name's own sequence (as a [Mutex] of the name
// would have drawn it): guard each name's resource with its own token. On
// the guard of a single lock it returns [Guard.Token] for that lock's name.
// For a name the guard does not hold it returns 0.
func (g *Guard) TokenOf(name string) int64 {
	if g == nil {
		return 0
	}
	if g.set == nil {
		if name == g.e.name {
			return g.token
		}
		return 0
	}
	s := g.set.set
	for i := range s.keys {
		if s.engine(i).name == name {
			return g.set.tokens[i]
		}
	}
	return 0
}

// refusedKey returns the lease key to name in the LostError of a refused
// renewal: the name's whose renewal was refused, for a MultiMutex's guard.
func (g *Guard) refusedKey() string {
	if g.set != nil && g.set.refused != "" {
		return g.set.refused
	}
	return g.e.keys.Lease
}
