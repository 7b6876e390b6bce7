package distlock

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/lease"
)

// How a waiter wakes up when it does not hear of a release.
const (
	// expiryGrace is added to the holder's remaining TTL (which Redis rounds
	// down to the millisecond) before a waiter tries again, so that it tries
	// just after a holder that died without releasing has expired.
	expiryGrace = time.Millisecond
	// noExpiryRecheck is how often a waiter re-checks a lock whose key has no
	// expiry (someone set it by hand), in case the announcement of its
	// deletion is missed.
	noExpiryRecheck = time.Second
)

// acquire runs one Lock, TryLock or TryLockFor call and reports it to the
// Observer. wait is the longest it may wait (0: no limit); interval > 0 or
// poll selects plain polling; once makes a single attempt.
func (m *Mutex) acquire(ctx context.Context, wait, interval time.Duration, poll, once bool) (*Guard, error) {
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
		value: lease.NewValue(m.owner),
	}
	if wait > 0 {
		a.limit = a.start.Add(wait)
	}
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
	info := AcquireInfo{Key: m.keys.Lease, Owner: m.owner, Wait: time.Since(a.start), Attempts: a.attempts, Err: err}
	if g != nil {
		info.Token = g.token
	}
	m.obs.ObserveAcquire(info)
	return g, err
}

// acquirer is the state of one acquire call. It is used by one goroutine.
type acquirer struct {
	m        *Mutex
	ctx      context.Context
	value    string
	start    time.Time
	limit    time.Time // when waiting must end; zero for no limit
	attempts int
	timer    *time.Timer
}

// try makes one attempt. It returns the guard when the lock was acquired,
// otherwise the grant that says who holds it, or an error that ends the
// call.
func (a *acquirer) try() (*Guard, lease.Grant, error) {
	m := a.m
	for {
		sent := time.Now()
		a.attempts++
		actx, cancel := context.WithDeadline(a.ctx, m.leaseDeadline(sent))
		grant, err := m.store.Acquire(actx, m.keys, a.value, m.ttl)
		cancel()
		if err != nil {
			// A reply from Redis means the script did not run to a write (it
			// reads before it writes); anything else (a lost connection, a
			// deadline, a cancelled ctx) leaves its outcome unknown.
			if _, replied := rueidis.IsRedisErr(err); !replied {
				m.cleanup(a.ctx, a.value)
			}
			if a.ctx.Err() != nil {
				return nil, grant, m.ctxError(a.ctx)
			}
			return nil, grant, fmt.Errorf("distlock: acquiring %s: %w", m.keys.Lease, err)
		}
		if !grant.Acquired {
			if grant.Holder != "" && m.abandoned.take(grant.Holder) && m.cleanup(a.ctx, grant.Holder) {
				// It was our own orphan, left by an earlier call whose
				// clean-up failed; now it is gone, so try again at once.
				continue
			}
			return nil, grant, nil
		}
		if g, err := a.granted(grant.Token, sent); g != nil || err != nil {
			return g, grant, err
		}
		// The reply came too late to trust the lease; the next attempt
		// finds our value and renews it with a fresh send time.
	}
}

// granted turns a grant of a.value with token, written by a command sent at
// sent (an attempt, or a hand-off made for us), into a guard. If the caller
// has given up meanwhile, it deletes the lease again and returns ctx's
// error. If the grant came too late to trust (the lease deadline counted
// from sent has passed), it returns neither, and the caller tries again: the
// next attempt finds its own value and renews it with a fresh send time.
func (a *acquirer) granted(token int64, sent time.Time) (*Guard, error) {
	if a.ctx.Err() != nil {
		a.m.cleanup(a.ctx, a.value)
		return nil, a.m.ctxError(a.ctx)
	}
	if !time.Now().Before(a.m.leaseDeadline(sent)) {
		return nil, nil
	}
	return a.m.startGuard(a.ctx, a.value, token, a.attempts-1, sent), nil
}

// once makes a single attempt.
func (a *acquirer) once() (*Guard, error) {
	g, grant, err := a.try()
	if g != nil || err != nil {
		return g, err
	}
	return nil, &NotAcquiredError{Key: a.m.keys.Lease, Holder: lease.Owner(grant.Holder), Remaining: grant.HolderTTL}
}

// poll tries, then tries again every interval (0: at once) until it
// acquires the lock, the limit passes or ctx ends.
func (a *acquirer) poll(interval time.Duration) (*Guard, error) {
	for {
		g, _, err := a.try()
		if g != nil || err != nil {
			return g, err
		}
		if _, err := a.pause(interval, nil); err != nil {
			return nil, err
		}
	}
}

// pause waits for d to pass (d < 0: no timer), for wake to be ready, for the
// wait limit or for ctx. It reports whether wake ended it; it returns an
// error when the limit has passed or ctx is done, which ends the call. With
// d == 0 it only checks the limit and ctx.
func (a *acquirer) pause(d time.Duration, wake <-chan struct{}) (bool, error) {
	why, _, err := a.wait(d, wake, nil)
	return why == wokeByChannel, err
}

// wakeReason says what ended a wait.
type wakeReason int

const (
	wokeByTimer wakeReason = iota
	wokeByChannel
	wokeByHandoff
)

// wait is pause that also ends when a hand-off result arrives on handoff.
func (a *acquirer) wait(d time.Duration, wake <-chan struct{}, handoff <-chan handoffResult) (wakeReason, handoffResult, error) {
	if !a.limit.IsZero() {
		left := time.Until(a.limit)
		if left <= 0 {
			return wokeByTimer, handoffResult{}, &TimeoutError{Key: a.m.keys.Lease, Waited: time.Since(a.start), Attempts: a.attempts}
		}
		if d < 0 || d > left {
			d = left
		}
	}
	if d == 0 {
		if a.ctx.Err() != nil {
			return wokeByTimer, handoffResult{}, a.m.ctxError(a.ctx)
		}
		return wokeByTimer, handoffResult{}, nil
	}
	var timerC <-chan time.Time
	if d > 0 {
		if a.timer == nil {
			a.timer = time.NewTimer(d)
		} else {
			a.timer.Reset(d)
		}
		timerC = a.timer.C
	}
	select {
	case <-wake:
		return wokeByChannel, handoffResult{}, nil
	case r := <-handoff:
		return wokeByHandoff, r, nil
	case <-timerC:
		return wokeByTimer, handoffResult{}, nil
	case <-a.ctx.Done():
		return wokeByTimer, handoffResult{}, a.m.ctxError(a.ctx)
	}
}
