package distlock

import (
	"context"
	"errors"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// The guard's actor: the goroutine that renews a held lease.
//
// It is started by the guard's first-renewal timer, in the goroutine of
// that timer, a third of the lease after the acquisition; a guard released
// before then never has one. From then on it alone sends renewals: it
// renews every TTL/3, sends each renewal with a deadline no later than the
// lease deadline D, and turns the guard Lost at D even if the renewal in
// flight has not returned by then (a client may not honour the deadline),
// and applies each answer to the guard's state (guard.go). When the guard's
// end begins, its stop function cancels the renewal in flight, and the
// actor takes the end's last step itself (the final delete, or nothing for
// Leave) before it returns. Its owner is the guard: the end is its stop
// signal, and [Guard.Done], closed once that last step has its answer, is
// its wait.

// activate is the function of the guard's first-renewal timer. Unless the
// guard's end has begun, it makes the goroutine it runs in the guard's
// actor.
func (g *Guard) activate() {
	g.mu.Lock()
	if g.how != 0 {
		g.mu.Unlock()
		return
	}
	end, stop := context.WithCancel(context.Background())
	g.stopActor = stop
	g.retry = backoff{first: firstRetry, most: max(firstRetry, lostRetry(g.e.ttl))}
	g.mu.Unlock()
	g.run(end)
}

// run is the actor's loop: renew, then sleep until the next renewal is due
// (or, if that comes later, until the deadline), until end is cancelled.
// Then it takes the end's last step.
func (g *Guard) run(end context.Context) {
	var t *time.Timer
	for {
		next := g.renew(end)
		if end.Err() != nil {
			break
		}
		if t == nil {
			t = time.NewTimer(next)
		} else {
			t.Reset(next)
		}
		select {
		case <-t.C:
		case <-end.Done():
		}
		if end.Err() != nil {
			break
		}
		g.mu.Lock()
		g.checkDeadlineLocked()
		g.mu.Unlock()
	}
	if t != nil {
		t.Stop()
	}
	g.mu.Lock()
	leaving := g.how == endLeave
	g.mu.Unlock()
	if leaving {
		g.finish(releaseResult{})
		return
	}
	g.release(context.WithoutCancel(g.lockCtx), time.Time{})
}

// renew sends one renewal and applies its answer. It returns how long to
// wait before the next one. The call's deadline is the lease deadline while
// the lease is held (L1: no call for a held lock outlives D), and one
// renewal period when it is Lost; the end of the guard cancels it.
func (g *Guard) renew(end context.Context) time.Duration {
	e := g.e
	g.mu.Lock()
	g.checkDeadlineLocked()
	s := g.st.Load()
	g.mu.Unlock()
	sent := time.Now()
	dl := sent.Add(renewAfter(e.ttl))
	if s.state == Acquired {
		dl = s.deadline
	}
	ctx, cancel := context.WithDeadline(end, dl)
	var atDeadline *time.Timer
	var fired chan struct{}
	if s.state == Acquired {
		// Not every client returns when a call's deadline passes (go-redis
		// waits for its ReadTimeout, and retries), and a dial may not
		// watch it: the guard turns Lost at D whatever the call does.
		fired = make(chan struct{})
		atDeadline = time.AfterFunc(time.Until(dl), func() {
			defer close(fired)
			g.deadlinePassed()
		})
	}
	r, err := e.store.Renew(ctx, e.keys, g.value, e.ttl)
	if atDeadline != nil && !atDeadline.Stop() {
		<-fired // the timer's goroutine is the actor's: wait for it
	}
	cancel()
	return g.renewed(sent, r, err)
}

// deadlinePassed makes the guard Lost if its deadline has passed while a
// renewal is in flight; once the guard's end has begun it does nothing.
// It runs in the goroutine of a timer that renew starts and stops, and
// waits for when it has fired; it holds nothing but g.mu, for as long as
// the transition takes.
func (g *Guard) deadlinePassed() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.how == 0 {
		g.checkDeadlineLocked()
	}
}

// renewed applies the answer to a renewal sent at sent and returns how long
// to wait before the next one. Once the guard's end has begun, an answer
// changes nothing.
//
// A renewal that Redis refused (the key no longer holds this acquisition's
// value) makes the guard Lost at once. One that failed without confirming
// anything (no reply: a reset, a refused dial, a timeout; or an error
// reply, or replicas that did not acknowledge it) proves nothing either
// way: it can only have extended the lease, never shortened it (L1b). While
// the guard is Acquired, such a failure is reported (to the Observer, to
// the subscribers as an Acquired event with a [*RenewError], and in the
// log at Warn) and the renewal is retried after a short pause that grows
// with each failure; the guard turns Lost when its deadline comes first.
func (g *Guard) renewed(sent time.Time, r lease.Renewal, err error) time.Duration {
	e := g.e
	ttl := e.ttl
	now := time.Now()
	info := RenewInfo{Key: e.keys.Lease, Kind: e.kind, Mode: g.mode().String(), Token: g.token, Latency: now.Sub(sent), Err: err}
	if err == nil && !r.OK {
		info.Err = &LostError{Key: e.keys.Lease, Reason: LostRefused, Holder: lease.Owner(r.Holder)}
	}
	e.obs.ObserveRenew(info)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.how != 0 {
		return 0
	}
	s := g.st.Load()
	switch {
	case err != nil && s.state == Acquired && now.Before(s.deadline):
		g.renewErr = err
		pause := g.retry.next()
		if left := s.deadline.Sub(now); pause >= left {
			// No retry can be sent before the deadline: the guard is
			// Lost then (see run).
			pause = left
		}
		rerr := &RenewError{Key: e.keys.Lease, Err: err, Deadline: s.deadline, Retry: pause}
		g.subs.publish(Event{State: Acquired, Time: now, Err: rerr})
		g.logger().Warn("distlock: renewal failed; the lease still holds, retrying",
			"err", err, "deadline_in", s.deadline.Sub(now), "retry_in", pause)
		return pause
	case err != nil:
		cause := &LostError{Key: e.keys.Lease, Reason: LostRenewFailed, Err: err}
		if errors.Is(err, context.DeadlineExceeded) && s.state == Acquired {
			// A renewal still in flight at the deadline: Lost for the
			// failures before it, if there were any, or for the deadline.
			if g.renewErr != nil {
				cause.Err = g.renewErr
			} else {
				cause.Reason = LostDeadline
			}
		}
		if e.debug() {
			g.logger().Debug("distlock: renewal failed", "err", err, "took", now.Sub(sent))
		}
		g.loseLocked(cause)
		// A Lost guard keeps trying: a renewal that finds the key still
		// holding its value regains it.
		return lostRetry(ttl)
	case !r.OK:
		if e.debug() {
			g.logger().Debug("distlock: renewal refused", "holder", r.Holder)
		}
		g.loseLocked(info.Err.(*LostError))
		return renewAfter(ttl)
	case !now.Before(leaseDeadline(sent, ttl)):
		// Confirmed, but too late to count: the lease may already be gone
		// by the time we could act on it.
		g.loseLocked(&LostError{Key: e.keys.Lease, Reason: LostDeadline})
		return 0
	}
	g.confirmLocked(sent, ttl)
	if e.debug() {
		g.logger().Debug("distlock: renewed", "deadline_in", g.st.Load().deadline.Sub(now))
	}
	return sent.Add(renewAfter(ttl)).Sub(now)
}
