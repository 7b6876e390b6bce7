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
// lease deadline D (so that a renewal in flight cannot delay Lost past D),
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
	r, err := e.store.Renew(ctx, e.keys, g.value, e.ttl)
	cancel()
	return g.renewed(sent, r, err)
}

// renewed applies the answer to a renewal sent at sent and returns how long
// to wait before the next one. Once the guard's end has begun, an answer
// changes nothing.
func (g *Guard) renewed(sent time.Time, r lease.Renewal, err error) time.Duration {
	e := g.e
	ttl := e.ttl
	now := time.Now()
	info := RenewInfo{Key: e.keys.Lease, Kind: e.kind, Token: g.token, Latency: now.Sub(sent), Err: err}
	if err == nil && !r.OK {
		info.Err = &LostError{Key: e.keys.Lease, Reason: LostRefused, Holder: lease.Owner(r.Holder)}
	}
	e.obs.ObserveRenew(info)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.how != 0 {
		return 0
	}
	switch {
	case err != nil:
		reason := LostRenewFailed
		if errors.Is(err, context.DeadlineExceeded) && !now.Before(g.st.Load().deadline) {
			reason = LostDeadline
		}
		if e.debug() {
			g.logger().Debug("distlock: renewal failed", "err", err, "took", now.Sub(sent))
		}
		g.loseLocked(&LostError{Key: e.keys.Lease, Reason: reason, Err: err})
		// Retry sooner than usual: a short outage then heals quickly.
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
