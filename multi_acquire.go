package distlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// The acquisition of a MultiMutex: its single attempt, its polling and its
// wait in the lines of its names.

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
	// seen is, for each name, the largest token the request learnt of (a
	// reply's fence, its own grant, a grant announced to it): what a
	// Mutex's call brings as lease.Place.Seen (see setSeen).
	seen []int64
}

func (m *MultiMutex) acquire(ctx context.Context, mode acquireMode, wait, interval time.Duration) (*Guard, error) {
	s := m.set
	first := s.first()
	ac, err := first.startAcquire(ctx, first.owner, wait)
	if err != nil {
		return nil, err
	}
	a := &setAcquirer{
		acquirer: ac,
		s:        s,
		tokens:   make([]int64, len(s.keys)),
		seen:     make([]int64, len(s.keys)),
		sent:     make([]time.Time, s.ngroups()),
		ttl:      make([]time.Duration, s.ngroups()),
		reached:  make([]int, s.ngroups()),
	}
	var g *Guard
	switch mode {
	case once:
		g, err = a.once()
	case polling:
		g, err = a.poll(interval)
	default:
		g, err = a.queue()
	}
	if a.finish(g) {
		// On every name a call reached (see cleanup).
		value, reached := a.value, a.reached
		proc.goWork(func() {
			defer proc.work.done()
			s.cleanup(value, reached)
		})
	}
	a.report(first, first.owner, g, err)
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
		ctx = a.leftBehind()
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
// it cannot have and sleeping in that name's room until the name is passed
// to it, its place is due for a refresh, or the holder's lease would end:
// the line's rules of a Lock's queue (wait.go: standing, holdsPass,
// nextAsk), for one line at a time. Each group is granted the TTL; while
// the request waits for a later group, it shortens the groups it holds to
// the claim window and renews them every half window, after each call at
// which that renewal would fall due before the next call (see keep), so
// that a waiter that dies costs the others no more and a waiter whose
// nodes answer keeps what it holds. (A call to the group it waits for that
// gets no reply holds up those renewals until its deadline: the held names
// may then lapse, and the set starts again.) If one of them is lost, it
// gives back everything and starts again from the first group, with the
// same ticket.
//
// A name passed to it is taken with the rest of its group by the next
// call, except the set's last name: then every name is held, and the set
// is held at once, as a Mutex's waiter holds a lock passed to it (its
// guard renews every name to the TTL a third of the claim window in).
func (a *setAcquirer) queue() (*Guard, error) {
	s := a.s
	// One standing for every line: its ticket is the request's place in
	// each, and the rest is of the line it stands in now (lineOf).
	line := standing{place: lease.Place{Claim: a.e.claim, Room: proc.roomID}}
	last := len(s.keys) - 1
	var (
		r       *room
		roomFor = -1 // the index of the name whose room r is
		lineOf  = -1 // the index of the name whose line line is of
		pre     []preJoined
		pause   = backoff{first: DefaultRetryInterval, most: 16 * DefaultRetryInterval}
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
		if lineOf >= 0 {
			a.seen[lineOf] = max(a.seen[lineOf], line.place.Seen)
		}
		line.place.SetSeen = a.setSeen(gi, lastStop)
		sent := time.Now()
		sg, held, retry, err := a.take(gi, &line.place)
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
		if lineOf != stop {
			// Another name's line: what it saw of the last one's tokens
			// says nothing of this one's.
			line.moved()
			lineOf = stop
			// What the request learnt of this name's tokens before.
			line.place.Seen = a.seen[stop]
		}
		if line.stale(sg.Blocked) {
			continue // stand in line again at once (see standing.stale)
		}
		line.queuedBy(sent, sg.Blocked)
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
		until := sent.Add(nextAsk(a.e.claim, r.listen(), sg.Blocked, true))
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
			if why != wokeByGrant {
				break // ask again
			}
			from := line.passed(note)
			if stop != last {
				break // take it with the rest of its group: ask again
			}
			// The set's last name, passed to it: every name is held.
			if from.IsZero() {
				continue // an announcement older than our last call
			}
			if !a.e.holdsPass(from) {
				break // claim it by asking
			}
			a.tokens[stop] = note.token
			a.sent[gi], a.ttl[gi] = minTime(from, line.queued), a.e.claim
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
