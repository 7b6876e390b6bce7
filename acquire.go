package distlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// brokenConnTries bounds how many times in a row a waiting Lock sends its
// call again at once after it failed without a reply. It is more than the
// number of connections rueidis keeps to one node by default (two, or four
// with four or more CPUs), since each dead one can fail one call.
const brokenConnTries = 8

// acquireMode says how an acquire call goes about it.
type acquireMode int8

const (
	// inLine stands in the lock's line and sleeps until the lock is passed
	// to it (Lock, by default).
	inLine acquireMode = iota
	// polling asks again every interval, never standing in line
	// (TryLockFor, and Lock with WithRetryInterval).
	polling
	// once makes a single attempt (TryLock).
	once
)

// lockMode returns the mode of e's Lock: in line, or polling where
// WithRetryInterval asks for it.
func (e *engine) lockMode() acquireMode {
	if e.polling {
		return polling
	}
	return inLine
}

// acquire runs one Lock, TryLock or TryLockFor call and reports it to the
// Observer. wait is the longest it may wait (0: no limit); interval is the
// pause between two tries of a polling call.
func (e *engine) acquire(ctx context.Context, owner string, mode acquireMode, wait, interval time.Duration) (*Guard, error) {
	ac, err := e.startAcquire(ctx, owner, wait)
	if err != nil {
		return nil, err
	}
	a := &ac
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
		value := a.value
		proc.goWork(func() {
			defer proc.work.done()
			e.cleanup(context.Background(), value, true)
		})
	}
	a.report(e, owner, g, err)
	return g, err
}

// startAcquire checks ctx and returns the state of a new acquire call of
// e for owner, whose wait ends wait from now (0: no limit).
func (e *engine) startAcquire(ctx context.Context, owner string, wait time.Duration) (acquirer, error) {
	if ctx == nil {
		return acquirer{}, invalid("ctx", "is nil")
	}
	if err := ctx.Err(); err != nil {
		return acquirer{}, e.ctxError(ctx)
	}
	a := acquirer{
		e:     e,
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
	return a, nil
}

// finish ends an acquire call whose outcome is g: it stops the call's
// timer and the calls it left behind, and reports whether the call gives
// up with something of its value possibly in Redis (a place in line, a
// lease passed to it, or a call whose reply it did not see). The caller
// then cancels that in the background: it does not wait on the network to
// give up.
func (a *acquirer) finish(g *Guard) (abandoned bool) {
	if a.timer != nil {
		a.timer.Stop()
	}
	if a.stopCalls != nil {
		a.stopCalls()
	}
	return g == nil && a.dirty
}

// report tells the Observer of e, the engine the call was made on (for a
// MultiMutex, its first name's), of the call's outcome.
func (a *acquirer) report(e *engine, owner string, g *Guard, err error) {
	info := AcquireInfo{Key: e.keys.Lease, Kind: e.kind, Mode: e.keys.Mode.String(), Owner: owner, Wait: time.Since(a.start), Attempts: a.attempts, Err: err}
	if g != nil {
		info.Token = g.token
	}
	e.obs.ObserveAcquire(info)
}

// The calls of the faces (Mutex, Semaphore, RWMutex): lock is a waiting
// acquire with e's options (Lock, Acquire, RLock), try a single attempt,
// tryFor a polling one with a timeout. typ names the face, for the error of
// a zero value.
func (e *engine) lock(ctx context.Context, typ string) (*Guard, error) {
	if e.store == nil {
		return nil, zeroValue(typ)
	}
	return e.acquire(ctx, e.owner, e.lockMode(), e.maxWait, e.retryInterval)
}

func (e *engine) try(ctx context.Context, typ string) (*Guard, error) {
	if e.store == nil {
		return nil, zeroValue(typ)
	}
	return e.acquire(ctx, e.owner, once, 0, 0)
}

func (e *engine) tryFor(ctx context.Context, typ string, timeout, retryInterval time.Duration) (*Guard, error) {
	if e.store == nil {
		return nil, zeroValue(typ)
	}
	switch {
	case timeout < 0:
		return nil, invalid("timeout", "%v is negative", timeout)
	case retryInterval < 0:
		return nil, invalid("retry interval", "%v is negative", retryInterval)
	case timeout == 0:
		return e.acquire(ctx, e.owner, once, 0, 0)
	}
	return e.acquire(ctx, e.owner, polling, timeout, retryInterval)
}

// acquirer is the state of one acquire call. It is used by one goroutine.
type acquirer struct {
	e        *engine
	waiter   *waiter    // Lock's place in its room, while it waits in line
	noted    *grantNote // a grant that came while a call was in flight
	ctx      context.Context
	value    string
	start    time.Time
	limit    time.Time // when waiting must end; zero for no limit
	attempts int
	timer    *time.Timer
	// callCtx is the context of the calls that the wait limit may leave
	// behind while ctx lives (see call); stopCalls cancels it when the
	// acquire call returns.
	callCtx   context.Context
	stopCalls context.CancelFunc
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
	e := a.e
	broken := 0 // calls that failed on a broken connection
	for {
		sent := time.Now()
		a.attempts++
		var stop error
		dl := replyDeadline(sent, e.ttl)
		grant, err, stop = a.call(dl, p)
		if stop != nil {
			a.dirty, a.uncertain = true, true
			return nil, grant, false, stop
		}
		if err != nil {
			// A reply from Redis means the script did not run to a write (it
			// reads before it writes); anything else (a lost connection, a
			// deadline, a cancelled ctx) leaves its outcome unknown.
			replied := lease.IsReply(err)
			var ackErr *lease.AckError
			notAcked := errors.As(err, &ackErr)
			if !replied {
				a.dirty, a.uncertain = true, true
			}
			if a.ctx.Err() != nil {
				return nil, grant, false, e.ctxError(a.ctx)
			}
			retry := !replied && !notAcked
			ctxDeadline := errors.Is(err, context.DeadlineExceeded)
			clientTimeout := lease.IsTimeout(err)
			if retry && (ctxDeadline || clientTimeout) {
				if cdl, ok := a.ctx.Deadline(); ok && (ctxDeadline && !cdl.After(dl) || clientTimeout && !time.Now().Before(cdl)) {
					// The caller's deadline, which the client may report a
					// moment before ctx does: ctx is done at once.
					<-a.ctx.Done()
					return nil, grant, false, e.ctxError(a.ctx)
				}
				// The call's own deadline, or the client's own timeout
				// (rueidis's ConnWriteTimeout, go-redis's ReadTimeout),
				// not the caller's: no reply in time. A waiting call
				// tries again like after any failed attempt; TryLock
				// reports it, as what it is.
				nr := &NoReplyError{Key: e.keys.Lease, After: time.Since(sent)}
				if clientTimeout {
					nr.Err = err
				}
				return nil, grant, true, nr
			}
			if retry && p != nil && broken < brokenConnTries {
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
			return nil, grant, retry, fmt.Errorf("distlock: acquiring %s: %w", e.keys.Lease, err)
		}
		if !grant.Acquired {
			if grant.Holder != "" && grant.HolderTTL < 0 && e.keys.Permits == 0 {
				// A lock's key without an expiry: distlock never writes
				// one (someone set it by hand, or made it persist), and it
				// would never free itself, so a Lock would wait forever.
				if p != nil {
					a.dirty = true // the call put us in line
				}
				return nil, grant, false, fmt.Errorf("distlock: acquiring %s: %w", e.keys.Lease, noExpiry(e.keys, grant.Holder))
			}
			if grant.Holder != "" && e.abandoned.take(grant.Holder) && e.cleanup(a.ctx, grant.Holder, false) {
				// It was our own orphan, left by an earlier call whose
				// clean-up failed; now it is gone, so try again at once.
				continue
			}
			return nil, grant, false, nil
		}
		if g, err := a.granted(grant.Token, sent, e.ttl); g != nil || err != nil {
			return g, grant, false, err
		}
		// The reply came too late to trust the lease; the next attempt
		// finds our value and renews it with a fresh send time.
	}
}

// replyDeadline returns the deadline of an acquire call sent at sent for a
// lease of ttl: the lease deadline counted from the send time, since a
// reply after it could not be trusted anyway (see granted), and at most
// [MaxReplyWait] after sending, so that one attempt on a long TTL does not
// wait that long for a server that has stopped.
func replyDeadline(sent time.Time, ttl time.Duration) time.Time {
	dl := leaseDeadline(sent, ttl)
	if limit := sent.Add(MaxReplyWait); limit.Before(dl) {
		return limit
	}
	return dl
}

// call sends one acquire call with deadline dl: Acquire when p is nil,
// AcquireOrQueue with *p otherwise. dl is replyDeadline: a call that Redis
// does not answer (a stopped server, a dead path) ends then, and the
// caller asks again or fails.
//
// When nothing can end the call early (ctx can never be done, there is no
// wait limit, nothing of the caller's value is in Redis yet, so no grant
// can come to it before this call's reply, and the client ends the call at
// dl by itself, as rueidis does), call sends it on the caller's goroutine:
// that is an uncontended Lock or TryLock with a context such as
// context.Background(), or the first call of such a Lock that waits, and
// it costs no goroutine and no hand-off. (A grant to the caller needs this
// call to have put it in line, so its reply is on its way; a grant that
// reaches the room meanwhile waits in the waiter's one-slot channel and is
// acted on once the call returns.)
//
// Otherwise the call runs in a goroutine of the process's background work,
// and the caller waits for it, for ctx and for the wait limit: when one of
// those ends first, call returns the error that ends the acquire (stop) at
// once and leaves the call to finish in the background. rueidis watches
// ctx while a command waits for its reply, but not while it (re)establishes
// a connection, which can take its dial timeout. For a client that does
// not end a call at its context's deadline (go-redis waits for its
// ReadTimeout), call also waits for dl, and then returns
// context.DeadlineExceeded as the call's error: no reply in time, which a
// waiter rides out. A waiter in line also
// stops waiting for its call when a grant comes: it returns errNoted with
// the grant in a.noted, and the call (a refresh of its place, perhaps stuck
// on a dead connection) goes on in the background.
func (a *acquirer) call(dl time.Time, p *lease.Place) (grant lease.Grant, err, stop error) {
	e := a.e
	keeps := e.keepsDeadlines()
	if a.ctx.Done() == nil && a.limit.IsZero() && (a.waiter == nil || !a.dirty) && keeps {
		ctx, cancel := context.WithDeadline(a.ctx, dl)
		defer cancel()
		if p == nil {
			grant, err = e.store.Acquire(ctx, e.keys, a.value, e.ttl)
		} else {
			grant, err = e.store.AcquireOrQueue(ctx, e.keys, a.value, e.ttl, *p)
		}
		return grant, err, nil
	}
	// The goroutine gets a copy of the place, not p: a Lock's place then
	// stays on its stack (one allocation fewer per Lock).
	var place lease.Place
	queue := p != nil
	if queue {
		place = *p
	}
	type result struct {
		grant lease.Grant
		err   error
	}
	done := make(chan result, 1)
	ctx, value := a.ctx, a.value
	if !a.limit.IsZero() || !keeps {
		// The call may be left behind while ctx lives, when the wait limit
		// or the call's own deadline (for a client that does not end the
		// call then) ends the acquire call. (A refresh left behind because
		// a grant came meanwhile goes on: the call has succeeded, and the
		// refresh, sent already, only extends the caller's own lease.)
		ctx = a.leftBehind()
	}
	proc.goWork(func() {
		defer proc.work.done()
		ctx, cancel := context.WithDeadline(ctx, dl)
		defer cancel()
		var r result
		if queue {
			r.grant, r.err = e.store.AcquireOrQueue(ctx, e.keys, value, e.ttl, place)
		} else {
			r.grant, r.err = e.store.Acquire(ctx, e.keys, value, e.ttl)
		}
		done <- r
	})
	var limit <-chan time.Time
	if !a.limit.IsZero() {
		t := time.NewTimer(time.Until(a.limit))
		defer t.Stop()
		limit = t.C
	}
	var noReply <-chan time.Time
	if !keeps {
		t := time.NewTimer(time.Until(dl))
		defer t.Stop()
		noReply = t.C
	}
	var noted <-chan grantNote
	if a.waiter != nil {
		noted = a.waiter.grant
	}
	select {
	case r := <-done:
		return r.grant, r.err, nil
	case <-noReply:
		// The call's deadline passed and the client is still waiting (it
		// ends the call by its own timeouts): no reply in time, as if the
		// client had said so. The call goes on in the background.
		return lease.Grant{}, context.DeadlineExceeded, nil
	case n := <-noted:
		a.noted = &n
		return lease.Grant{}, nil, errNoted
	case <-a.ctx.Done():
		return lease.Grant{}, nil, e.ctxError(a.ctx)
	case <-limit:
		return lease.Grant{}, nil, &TimeoutError{Key: e.keys.Lease, Waited: time.Since(a.start), Attempts: a.attempts}
	}
}

// leftBehind returns the context of a call that the acquire call may
// leave behind while ctx lives. Such a call must not go on once the
// acquire call has failed (it could, say, dial a connection of a client
// that its owner closes as soon as Lock has returned), so its context ends
// with the acquire call (stopCalls, which finish calls).
func (a *acquirer) leftBehind() context.Context {
	if a.stopCalls == nil {
		a.callCtx, a.stopCalls = context.WithCancel(a.ctx)
	}
	return a.callCtx
}

// keepsDeadlines reports whether e's client ends a call when its
// context's deadline passes (rueidis does); for one that does not
// (go-redis waits for its ReadTimeout), call waits for the deadline beside
// the call.
func (e *engine) keepsDeadlines() bool {
	k, ok := e.store.(lease.DeadlineKeeper)
	return ok && k.KeepsDeadlines()
}

// noExpiry returns the error of a lock whose key k.Lease holds value
// without an expiry.
func noExpiry(k lease.Keys, value string) error {
	want := "lock"
	if k.Mode != 0 {
		want = "rwmutex"
	}
	return &WrongKindError{Key: k.Lease, Want: want, Found: "string without expiry (" + strconv.Quote(value) + ")"}
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
// time, and if the caller gives up instead, it cancels that lease.
func (a *acquirer) granted(token int64, sent time.Time, ttl time.Duration) (*Guard, error) {
	if a.ctx.Err() != nil {
		a.dirty = true
		return nil, a.e.ctxError(a.ctx)
	}
	if !time.Now().Before(leaseDeadline(sent, ttl)) {
		// The lease holds a.value in Redis all the same: if the call that
		// should renew it fails, the acquire gives up and cancels it.
		a.dirty = true
		return nil, nil
	}
	return a.e.newGuard(a.ctx, a.value, token, a.attempts-1, sent, ttl, a.uncertain), nil
}

// once makes a single attempt.
func (a *acquirer) once() (*Guard, error) {
	g, grant, _, err := a.attempt(nil)
	if g != nil || err != nil {
		return g, err
	}
	return nil, &NotAcquiredError{Key: a.e.keys.Lease, Holder: lease.Owner(grant.Holder), Remaining: grant.HolderTTL, Permits: a.e.keys.Permits}
}

// poll tries, then tries again every interval (0: at once) until it
// acquires the lock, the limit passes or ctx ends. It never stands in line,
// and while others do, it does not get ahead of them: a free lock goes to
// the first in line.
func (a *acquirer) poll(interval time.Duration) (*Guard, error) {
	for {
		g, _, _, err := a.attempt(nil)
		if g != nil || (err != nil && !errors.Is(err, ErrNoReply)) {
			return g, err
		}
		// Held, or no reply in time: ask again after the interval.
		if _, _, err := a.wait(interval, nil); err != nil {
			return nil, err
		}
	}
}
