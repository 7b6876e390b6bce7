package distlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/lease"
)

// brokenConnTries bounds how many times in a row a waiting Lock sends its
// call again at once after it failed without a reply. It is more than the
// number of connections rueidis keeps to one node by default (two, or four
// with four or more CPUs), since each dead one can fail one call.
const brokenConnTries = 8

// expiryGrace is added to the holder's remaining TTL (which Redis rounds
// down to the millisecond) before the first waiter in line asks again, so
// that it asks just after a holder that died without releasing has expired.
const expiryGrace = time.Millisecond

// acquire runs one Lock, TryLock or TryLockFor call and reports it to the
// Observer. wait is the longest it may wait (0: no limit); interval > 0 or
// poll selects plain polling; once makes a single attempt.
func (m *Mutex) acquire(ctx context.Context, owner string, wait, interval time.Duration, poll, once bool) (*Guard, error) {
	if ctx == nil {
		return nil, invalid("ctx", "is nil")
	}
	if err := ctx.Err(); err != nil {
		return nil, m.ctxError(ctx)
	}
	a := &acquirer{
		m:     m,
		ctx:   ctx,
		start: time.Now(),
		// One value for every attempt of this call: if an attempt's reply
		// is lost, the next attempt finds its own value and is granted at
		// once.
		value: lease.NewValue(owner),
	}
	if wait > 0 {
		a.limit = a.start.Add(wait)
	}
	a.room = enterRoom(m)
	defer a.room.exit()
	var g *Guard
	var err error
	switch {
	case once:
		g, err = a.once()
	case poll:
		g, err = a.poll(interval)
	default:
		g, err = a.queue()
	}
	if a.timer != nil {
		a.timer.Stop()
	}
	if g == nil && a.dirty {
		// The call gives up with something of its value possibly in Redis:
		// a place in line, a lease passed to it, or a call whose reply it
		// did not see. Cancel it in the background: the caller does not
		// wait on the network to give up.
		a.room.goClean(func() { m.cleanup(context.Background(), a.value) })
	}
	info := AcquireInfo{Key: m.keys.Lease, Kind: m.kind, Owner: owner, Wait: time.Since(a.start), Attempts: a.attempts, Err: err}
	if g != nil {
		info.Token = g.token
	}
	m.obs.ObserveAcquire(info)
	return g, err
}

// acquirer is the state of one acquire call. It is used by one goroutine.
type acquirer struct {
	m        *Mutex
	room     *room      // the lock's waiting room, which owns the call's goroutines
	waiter   *waiter    // Lock's place in the room, while it waits in line
	noted    *grantNote // a grant that came while a call was in flight
	ctx      context.Context
	value    string
	start    time.Time
	limit    time.Time // when waiting must end; zero for no limit
	attempts int
	timer    *time.Timer
	// dirty: something of value may be in Redis (a place in line, a lease,
	// or a call whose reply was lost) that must be cancelled if the call
	// gives up.
	dirty bool
	// uncertain: a call with value may still reach Redis, after any later
	// one; the guard then voids value when it releases, so that such a call
	// cannot put it back in line.
	uncertain bool
}

// attempt sends one acquire call: Acquire when p is nil, AcquireOrQueue with
// *p otherwise. It returns the guard when the lock was acquired, otherwise
// the grant that says who holds it and where the caller stands, or an error.
// retry reports whether the error came without a reply from Redis (a lost
// connection, a deadline), which a waiter may ride out.
func (a *acquirer) attempt(p *lease.Place) (g *Guard, grant lease.Grant, retry bool, err error) {
	m := a.m
	broken := 0 // calls that failed on a broken connection
	for {
		sent := time.Now()
		a.attempts++
		var stop error
		grant, err, stop = a.call(leaseDeadline(sent, m.ttl), p)
		if stop != nil {
			a.dirty, a.uncertain = true, true
			return nil, grant, false, stop
		}
		if err != nil {
			// A reply from Redis means the script did not run to a write (it
			// reads before it writes); anything else (a lost connection, a
			// deadline, a cancelled ctx) leaves its outcome unknown.
			_, replied := rueidis.IsRedisErr(err)
			var ackErr *lease.AckError
			notAcked := errors.As(err, &ackErr)
			if !replied {
				a.dirty, a.uncertain = true, true
			}
			if a.ctx.Err() != nil {
				return nil, grant, false, m.ctxError(a.ctx)
			}
			retry := !replied && !notAcked
			if retry && p != nil && !errors.Is(err, context.DeadlineExceeded) && broken < brokenConnTries {
				// A pooled connection that broke while idle fails the first
				// call sent on it although Redis is reachable. A waiter
				// sends its call again at once (it carries the same value,
				// so a repeat is harmless), as Release does; TryLock, a
				// single attempt, reports the error.
				broken++
				continue
			}
			// A grant that replicas did not acknowledge was undone and
			// ends the call; so does any error Redis answered with.
			return nil, grant, retry, fmt.Errorf("distlock: acquiring %s: %w", m.keys.Lease, err)
		}
		if !grant.Acquired {
			if grant.Holder != "" && m.abandoned.take(grant.Holder) && m.cleanup(a.ctx, grant.Holder) {
				// It was our own orphan, left by an earlier call whose
				// clean-up failed; now it is gone, so try again at once.
				continue
			}
			return nil, grant, false, nil
		}
		if g, err := a.granted(grant.Token, sent, m.ttl); g != nil || err != nil {
			return g, grant, false, err
		}
		// The reply came too late to trust the lease; the next attempt
		// finds our value and renews it with a fresh send time.
	}
}

// call sends one acquire call with deadline dl: Acquire when p is nil,
// AcquireOrQueue with *p otherwise. The call runs in a goroutine owned by
// the lock's room, and the caller waits for it, for ctx and for the wait
// limit: when one of those ends first, call returns the error that ends the
// acquire (stop) at once and leaves the call to finish in the background.
// rueidis watches ctx while a command waits for its reply, but not while it
// (re)establishes a connection, which can take its dial timeout. A waiter
// in line also stops waiting for its call when a grant comes: it returns
// errNoted with the grant in a.noted, and the call (a refresh of its place,
// perhaps stuck on a dead connection) goes on in the background.
func (a *acquirer) call(dl time.Time, p *lease.Place) (grant lease.Grant, err, stop error) {
	m := a.m
	var place lease.Place
	if p != nil {
		place = *p
	}
	type result struct {
		grant lease.Grant
		err   error
	}
	done := make(chan result, 1)
	a.room.goClean(func() {
		ctx, cancel := context.WithDeadline(a.ctx, dl)
		defer cancel()
		var r result
		if p == nil {
			r.grant, r.err = m.store.Acquire(ctx, m.keys, a.value, m.ttl)
		} else {
			r.grant, r.err = m.store.AcquireOrQueue(ctx, m.keys, a.value, m.ttl, place)
		}
		done <- r
	})
	var limit <-chan time.Time
	if !a.limit.IsZero() {
		t := time.NewTimer(time.Until(a.limit))
		defer t.Stop()
		limit = t.C
	}
	var noted <-chan grantNote
	if a.waiter != nil {
		noted = a.waiter.grant
	}
	select {
	case r := <-done:
		return r.grant, r.err, nil
	case n := <-noted:
		a.noted = &n
		return lease.Grant{}, nil, errNoted
	case <-a.ctx.Done():
		return lease.Grant{}, nil, m.ctxError(a.ctx)
	case <-limit:
		return lease.Grant{}, nil, &TimeoutError{Key: m.keys.Lease, Waited: time.Since(a.start), Attempts: a.attempts}
	}
}

// errNoted ends a call whose caller was passed the lock meanwhile; the
// grant is in acquirer.noted.
var errNoted = errors.New("distlock: passed the lock while asking for it")

// granted turns a grant of a.value with token, for ttl, made by a command
// sent at sent (or after it), into a guard. If the caller has given up
// meanwhile, it returns ctx's error (the lease is cancelled on the way out).
// If the grant came too late to trust (the lease deadline counted from sent
// has passed), it returns neither, and the caller asks again: the lease
// still holds its value, so the next call grants it anew with a fresh send
// time.
func (a *acquirer) granted(token int64, sent time.Time, ttl time.Duration) (*Guard, error) {
	if a.ctx.Err() != nil {
		a.dirty = true
		return nil, a.m.ctxError(a.ctx)
	}
	if !time.Now().Before(leaseDeadline(sent, ttl)) {
		return nil, nil
	}
	return a.m.startGuard(a.ctx, a.value, token, a.attempts-1, sent, ttl, a.uncertain), nil
}

// queue is the default way to wait: stand in the lock's line in Redis and
// sleep until the lease is passed to us.
//
// Each call to Redis (AcquireOrQueue) acquires the lock if it is free and
// nobody is ahead, and otherwise puts us in line or refreshes our place. In
// between, the waiter sleeps until its room wakes it with a grant, until it
// is time to refresh its place (every half claim window; at the polling
// interval while announcements do not arrive), or, when it is first in
// line, until the holder's lease would end, in case the holder died.
//
// A grant passes the lease to us for the claim window, counted from the
// release that made it. We did not send that release, so the lease deadline
// counts from the send time of a call known to precede the grant: our last
// call that found us in line (if the grant's token is above the last token
// that call saw, the grant came after it), or the release itself when a
// guard of this process made it. While the lease deadline counted from
// there leaves at least a third of the window, the guard starts at once,
// and renews the lease to the full TTL a third of the window in (at once,
// if that is past) when it is held that long. Otherwise (a late wake-up,
// or WithReplicaAck, which must see an acknowledged write first) we claim
// it by calling AcquireOrQueue again: the lease holds our value, so Redis
// grants it to us for the full TTL (a lock keeps the grant's token).
func (a *acquirer) queue() (*Guard, error) {
	m := a.m
	r := a.room
	w := r.join(a.value)
	defer r.leave(w)
	a.waiter = w

	place := lease.Place{Claim: m.claim, Room: r.id}
	var (
		queued      time.Time // send time of our last call that left us in line
		queuedFence int64     // the last token issued when that call ran
		failures    int       // calls in a row that failed without a reply
	)
	// use acts on a grant: it returns the guard, or an error that ends the
	// call, or neither when the grant must be claimed (claim) or is an
	// announcement older than our last call (neither claim nor a result).
	use := func(note grantNote) (g *Guard, err error, claim bool) {
		from := note.sent
		if note.token > queuedFence && queued.After(from) {
			from = queued
		}
		if from.IsZero() {
			return nil, nil, false
		}
		if m.ack.Replicas == 0 && time.Until(leaseDeadline(from, m.claim)) >= m.claim/3 {
			if g, err := a.granted(note.token, from, m.claim); g != nil || err != nil {
				return g, err, false
			}
		}
		return nil, nil, true
	}
	for {
		sent := time.Now()
		g, grant, retry, err := a.attempt(&place)
		if errors.Is(err, errNoted) {
			// Passed the lock while asking (a refresh may be stuck on a
			// dead connection): act on the grant now.
			note := *a.noted
			a.noted = nil
			if g, err, _ := use(note); g != nil || err != nil {
				return g, err
			}
			continue // claim it, or ask again after an old announcement
		}
		switch {
		case g != nil:
			return g, nil
		case err != nil && (!retry || queued.IsZero()):
			return nil, err
		case err != nil:
			// We stand in line already: keep the place and ask again soon.
			failures++
			m.log.Debug("distlock: asking for the lock failed; trying again", "err", err)
		default:
			failures = 0
			a.dirty = true
			queued, queuedFence, place.Ticket = sent, grant.Fence, grant.Ticket
		}

		wait := m.claim / 2
		if !r.listen() {
			wait = min(wait, DefaultRetryInterval)
		}
		if failures > 0 {
			wait = min(wait, DefaultRetryInterval<<min(failures-1, 4))
		} else if grant.Rank == 0 && grant.HolderTTL >= 0 {
			wait = min(wait, grant.HolderTTL+expiryGrace)
		}
		until := sent.Add(wait)
		for {
			why, note, err := a.wait(max(time.Until(until), 0), w)
			if err != nil {
				return nil, err
			}
			if why != wokeByGrant {
				break
			}
			g, err, claim := use(note)
			if g != nil || err != nil {
				return g, err
			}
			if claim {
				break
			}
			// An announcement of a grant older than our last call.
		}
	}
}

// once makes a single attempt.
func (a *acquirer) once() (*Guard, error) {
	g, grant, _, err := a.attempt(nil)
	if g != nil || err != nil {
		return g, err
	}
	return nil, &NotAcquiredError{Key: a.m.keys.Lease, Holder: lease.Owner(grant.Holder), Remaining: grant.HolderTTL, Permits: a.m.keys.Permits}
}

// poll tries, then tries again every interval (0: at once) until it
// acquires the lock, the limit passes or ctx ends. It never stands in line,
// and while others do, it does not get ahead of them: a free lock goes to
// the first in line.
func (a *acquirer) poll(interval time.Duration) (*Guard, error) {
	for {
		g, _, _, err := a.attempt(nil)
		if g != nil || err != nil {
			return g, err
		}
		if _, _, err := a.wait(interval, nil); err != nil {
			return nil, err
		}
	}
}

// wakeReason says what ended a wait.
type wakeReason int

const (
	wokeByTimer wakeReason = iota
	wokeByPoke
	wokeByGrant
)

// wait waits for d to pass (d < 0: no timer), for a poke or a grant to w (w
// may be nil), for the wait limit or for ctx. It returns an error when the
// limit has passed or ctx is done, which ends the call. With d <= 0 it
// only checks the limit, ctx, and a grant already there.
func (a *acquirer) wait(d time.Duration, w *waiter) (wakeReason, grantNote, error) {
	if !a.limit.IsZero() {
		left := time.Until(a.limit)
		if left <= 0 {
			return wokeByTimer, grantNote{}, &TimeoutError{Key: a.m.keys.Lease, Waited: time.Since(a.start), Attempts: a.attempts}
		}
		if d < 0 || d > left {
			d = left
		}
	}
	var grant <-chan grantNote
	var poke <-chan struct{}
	if w != nil {
		grant, poke = w.grant, w.poke
	}
	var timerC <-chan time.Time
	switch {
	case d == 0:
		select {
		case n := <-grant:
			return wokeByGrant, n, nil
		default:
		}
		if a.ctx.Err() != nil {
			return wokeByTimer, grantNote{}, a.m.ctxError(a.ctx)
		}
		return wokeByTimer, grantNote{}, nil
	case d > 0:
		if a.timer == nil {
			a.timer = time.NewTimer(d)
		} else {
			a.timer.Reset(d)
		}
		timerC = a.timer.C
	}
	select {
	case n := <-grant:
		return wokeByGrant, n, nil
	case <-poke:
		return wokeByPoke, grantNote{}, nil
	case <-timerC:
		return wokeByTimer, grantNote{}, nil
	case <-a.ctx.Done():
		return wokeByTimer, grantNote{}, a.m.ctxError(a.ctx)
	}
}
