package distlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/distkit-go/distlock/actor"
	"github.com/distkit-go/distlock/lease"
)

// minReleaseWait is the least time the final delete is given, even when the
// lease has already lapsed (a lease lost to a failed renewal may still hold
// our value in Redis, and deleting it frees the lock for the next holder).
const minReleaseWait = 100 * time.Millisecond

// leaseLoop is the state of one guard's actor. Every field is owned by the
// actor goroutine; the children it starts read only the immutable ones (m
// and value) and report back on channels.
type leaseLoop struct {
	m     *Mutex
	g     *Guard
	value string

	state    State         // Acquired or Lost while running
	since    time.Time     // when state was entered
	cause    error         // why, for Lost
	lastSent time.Time     // send time of the last write Redis confirmed
	leaseTTL time.Duration // the TTL that write set: the claim window for a lease passed to a waiter, until its first renewal
	deadline time.Time     // D: lastSent + leaseTTL - margin
	void     bool          // release with Cancel (see startGuard)
	subs     subscribers

	acquired      time.Time // when the guard was created
	heldAtRelease bool      // whether the lease was held when the release began
	releasing     bool      // the guard's end has begun: State reports Released
	leaving       bool      // it ends by Leave: no delete
}

type renewResult struct {
	sent time.Time
	r    lease.Renewal
	err  error
}

type releaseResult struct {
	deleted bool
	err     error
}

// confirm records a write of ttl that Redis confirmed, sent at sent.
func (l *leaseLoop) confirm(sent time.Time, ttl time.Duration) {
	l.lastSent, l.leaseTTL = sent, ttl
	l.deadline = leaseDeadline(sent, ttl)
}

// run is the actor's loop. It renews, watches the deadline and serves the
// mailbox until the guard's end begins, then ends it (see ending) and
// returns.
//
// One timer serves two purposes: while no renewal is in flight it fires when
// the next one is due; while one is in flight and the lease is held it fires
// at the deadline D, so that a hanging renewal cannot delay Lost.
//
// The loop never waits on the network itself: renewals and the final
// delete run in child goroutines and report back on channels, so the
// mailbox (Subscribe and its cancellation) is served at all times, until
// the final delete has its answer.
func (l *leaseLoop) run(a *actor.Actor[guardMsg], inbox <-chan guardMsg, stop <-chan struct{}) {
	// Cancelling the Lock context releases the guard. The registration is
	// removed on the way out, so a long-lived context does not accumulate
	// them.
	if lockCtx := l.g.lockCtx; lockCtx.Done() != nil {
		// It stops the actor through a, not g.act: startGuard sets g.act
		// only once Start has returned, and this may run before.
		defer context.AfterFunc(lockCtx, func() {
			l.g.beginEnd(endRelease)
			a.Stop()
		})()
	}

	timer := time.NewTimer(time.Until(l.lastSent.Add(l.leaseTTL / 3)))
	defer timer.Stop()
	results := make(chan renewResult, 1) // at most one renewal in flight
	var cancelRenew context.CancelFunc   // set while a renewal is in flight
	var final <-chan releaseResult       // set once the final step has started

	// ending reports whether the guard's end has begun. The first time it
	// sees so, it stops vouching for the lease; then it cancels a renewal in
	// flight or, once none is, starts the final step. The guard's ending
	// flag is set before stop is closed, so any case may be the first to
	// see it.
	ending := func() bool {
		if !l.releasing {
			if l.g.ending.Load() == 0 {
				return false
			}
			timer.Stop()
			l.beginEnd()
		}
		switch {
		case cancelRenew != nil:
			// Stop waiting for the renewal; the final step starts once
			// the renewal call has returned. If its command is still on
			// its way (rueidis may use another connection than the
			// delete's), it can only extend this acquisition's own value
			// and never re-creates a deleted key, so arriving late does
			// no harm.
			cancelRenew()
		case final == nil:
			final = l.startFinal(a)
		}
		return true
	}

	for {
		select {
		case <-timer.C:
			if ending() {
				continue
			}
			if cancelRenew != nil {
				// The deadline, with a renewal in flight. If its answer is
				// already here (select picks among ready cases at random),
				// it counts: it was confirmed, and its own deadline decides.
				select {
				case res := <-results:
					cancelRenew()
					cancelRenew = nil
					timer.Reset(l.onRenew(res))
				default:
					l.checkDeadline() // the renewal in flight is late
				}
				continue
			}
			cancelRenew = l.startRenew(a, results)
			if l.state == Acquired {
				timer.Reset(time.Until(l.deadline))
			}

		case res := <-results:
			cancelRenew()
			cancelRenew = nil
			if ending() { // the renewal was all the end waited for
				continue
			}
			timer.Reset(l.onRenew(res))

		case msg := <-inbox:
			ending()
			l.handle(a, msg)

		case <-stop:
			stop = nil
			ending()

		case r := <-final:
			l.finish(r)
			return
		}
	}
}

// beginEnd is the moment the guard stops vouching for the lease, whether
// by Release, Leave or the cancellation of the Lock context.
func (l *leaseLoop) beginEnd() {
	l.checkDeadline()
	l.heldAtRelease = l.state == Acquired
	l.leaving = l.g.ending.Load() == endLeave
	// From now on nothing (such as a refusal found by the delete) may make
	// the guard report anything but Released again.
	l.releasing = true
	l.g.snap.Store(&snapshot{state: Released})
	// The critical section ends before the lease is deleted. Release and
	// Leave have done this already; the Lock context's cancellation has
	// cancelled the guard's context through its parent.
	l.g.cancel(ErrReleased)
	if l.debug() {
		l.logger().Debug("distlock: ending", "leave", l.leaving)
	}
}

// startFinal starts the guard's last step and returns the channel on which
// its result comes. For a release that is the final delete (which may pass
// the lock to the next waiter in line); it runs in a child goroutine, so
// that the actor keeps serving its mailbox meanwhile, and release reads only
// what the actor no longer changes once the end has begun. Leaving sends
// nothing: its result is there at once.
func (l *leaseLoop) startFinal(a *actor.Actor[guardMsg]) <-chan releaseResult {
	done := make(chan releaseResult, 1)
	if l.leaving {
		done <- releaseResult{}
		return done
	}
	a.Go(func() { done <- l.release() })
	return done
}

// startRenew sends one renewal in a child goroutine and returns the function
// that cancels it. The call's deadline is the lease deadline while the lease
// is held (L1: no call for a held lock outlives D), and one renewal period
// when it is Lost.
func (l *leaseLoop) startRenew(a *actor.Actor[guardMsg], results chan<- renewResult) context.CancelFunc {
	sent := time.Now()
	dl := sent.Add(l.m.ttl / 3)
	if l.state == Acquired {
		dl = l.deadline
	}
	ctx, cancel := context.WithDeadline(context.Background(), dl)
	m, value := l.m, l.value
	a.Go(func() {
		r, err := m.store.Renew(ctx, m.keys, value, m.ttl)
		results <- renewResult{sent: sent, r: r, err: err}
	})
	return cancel
}

// onRenew applies a renewal's result and returns how long to wait before the
// next one.
func (l *leaseLoop) onRenew(res renewResult) time.Duration {
	ttl := l.m.ttl
	now := time.Now()
	info := RenewInfo{Key: l.m.keys.Lease, Kind: l.m.kind, Token: l.g.token, Latency: now.Sub(res.sent), Err: res.err}
	if res.err == nil && !res.r.OK {
		info.Err = &LostError{Key: l.m.keys.Lease, Reason: LostRefused, Holder: lease.Owner(res.r.Holder)}
	}
	l.m.obs.ObserveRenew(info)
	switch {
	case res.err != nil:
		reason := LostRenewFailed
		if errors.Is(res.err, context.DeadlineExceeded) && !now.Before(l.deadline) {
			reason = LostDeadline
		}
		if l.debug() {
			l.logger().Debug("distlock: renewal failed", "err", res.err, "took", now.Sub(res.sent))
		}
		l.markLost(&LostError{Key: l.m.keys.Lease, Reason: reason, Err: res.err})
		// Retry sooner than usual: a short outage then heals quickly.
		return ttl / 9
	case !res.r.OK:
		if l.debug() {
			l.logger().Debug("distlock: renewal refused", "holder", res.r.Holder)
		}
		l.markLost(info.Err.(*LostError))
		return ttl / 3
	}
	if !now.Before(leaseDeadline(res.sent, ttl)) {
		// Confirmed, but too late to count: the lease may already be gone
		// by the time we could act on it.
		l.markLost(&LostError{Key: l.m.keys.Lease, Reason: LostDeadline})
		return 0
	}
	l.confirm(res.sent, ttl)
	if l.state == Lost {
		l.setState(Acquired, nil)
		l.logger().Info("distlock: lock regained")
	} else {
		l.g.snap.Store(&snapshot{state: Acquired, deadline: l.deadline})
	}
	if l.debug() {
		l.logger().Debug("distlock: renewed", "deadline_in", l.deadline.Sub(now))
	}
	return res.sent.Add(ttl / 3).Sub(now)
}

// checkDeadline marks the lease Lost if its deadline has passed.
func (l *leaseLoop) checkDeadline() {
	if l.state == Acquired && !time.Now().Before(l.deadline) {
		l.markLost(&LostError{Key: l.m.keys.Lease, Reason: LostDeadline})
	}
}

// markLost moves an Acquired lease to Lost for cause. The first loss cancels
// the guard's context; later ones only publish the event.
func (l *leaseLoop) markLost(cause *LostError) {
	if l.state != Acquired {
		return
	}
	// State first, then the context, then the event: whoever sees the
	// context cancelled must not then read Acquired from State, and whoever
	// receives the Lost event finds the context cancelled.
	l.setStateThen(Lost, cause, func() { l.g.cancel(cause) })
	l.logger().Warn("distlock: lock lost", "reason", cause.Reason.String(), "err", cause)
}

// logger returns the Mutex's logger with this guard's attributes.
func (l *leaseLoop) logger() *slog.Logger {
	return l.m.log.With("owner", lease.Owner(l.value), "token", l.g.token)
}

// debug reports whether debug messages are wanted; the hot paths check it
// before building any.
func (l *leaseLoop) debug() bool {
	return l.m.log.Enabled(context.Background(), slog.LevelDebug)
}

// setState records a transition, publishes it to State and to subscribers.
// Once the guard's end has begun (even if the loop has not seen it yet) it
// does not regain the lease: the guard never reports Acquired again.
func (l *leaseLoop) setState(s State, err error) { l.setStateThen(s, err, nil) }

// setStateThen is setState that runs then, if not nil, after State reports
// s and before the subscribers are told.
func (l *leaseLoop) setStateThen(s State, err error, then func()) {
	if s == Acquired && l.g.ending.Load() != 0 {
		return
	}
	l.m.obs.ObserveTransition(TransitionInfo{Key: l.m.keys.Lease, Kind: l.m.kind, Token: l.g.token, From: l.state, To: s, Err: err})
	l.state, l.since, l.cause = s, time.Now(), err
	if !l.releasing {
		l.g.snap.Store(&snapshot{state: s, deadline: l.deadline})
	}
	if then != nil {
		then()
	}
	l.subs.publish(Event{State: s, Time: l.since, Err: err})
}

// handle serves one mailbox message.
func (l *leaseLoop) handle(a *actor.Actor[guardMsg], msg guardMsg) {
	switch msg := msg.(type) {
	case subscribeMsg:
		ch := msg.ch
		unsubscribe := func() { _ = a.Send(context.Background(), unsubscribeMsg{ch: ch}) }
		if l.releasing {
			// The first event is the final Released, published by finish.
			l.subs.add(msg.ctx, ch, nil, unsubscribe)
		} else {
			l.checkDeadline()
			l.subs.add(msg.ctx, ch, &Event{State: l.state, Time: l.since, Err: l.cause}, unsubscribe)
		}
		msg.reply.Send(struct{}{})
	case unsubscribeMsg:
		l.subs.remove(msg.ch)
	}
}

// release sends the conditional delete and waits for its outcome. It runs
// in a child goroutine of the actor (see startFinal), so that the actor
// keeps serving its mailbox meanwhile; it reads only fields that the actor
// no longer changes once the end has begun. Waiting past the end of the
// lease would be pointless, since the key is gone by then either way;
// minReleaseWait still gives a lapsed lease one try.
func (l *leaseLoop) release() releaseResult {
	dl := l.lastSent.Add(l.leaseTTL)
	if floor := time.Now().Add(minReleaseWait); dl.Before(floor) {
		dl = floor
	}
	ctx, cancel := context.WithDeadline(context.Background(), dl)
	defer cancel()
	sent := time.Now()
	var r lease.Release
	var err error
	if l.void {
		r, err = l.m.store.Cancel(ctx, l.m.keys, l.value, l.m.ttl)
	} else {
		r, err = l.m.store.Release(ctx, l.m.keys, l.value)
	}
	// The release passed the lock to the next in line; if that waiter is in
	// this process, it wakes now rather than at the announcement.
	deliverPasses(l.m.queueKey(), r, sent)
	return releaseResult{deleted: r.Deleted, err: err}
}

// finish records how the guard ended, publishes Released and closes every
// subscription. After Leave, r is empty: nothing was sent, and the lease
// stays until it expires.
func (l *leaseLoop) finish(r releaseResult) {
	final := Released
	switch {
	case l.leaving:
		// Nothing was sent, so nothing new was learnt. The lease stays
		// until it expires; the waiter first in line watches its TTL and
		// takes it then.
		if !l.heldAtRelease {
			final = Lost
		}
	case r.err != nil:
		if !l.heldAtRelease {
			final = Lost
		}
	case !r.deleted:
		// The key no longer held our value: whatever we believed, the lease
		// had slipped.
		l.markLost(&LostError{Key: l.m.keys.Lease, Reason: LostRefused})
		final = Lost
	case !l.heldAtRelease:
		final = Lost
	}
	var err error
	if r.err != nil {
		err = fmt.Errorf("distlock: releasing %s: %w", l.m.keys.Lease, r.err)
		l.logger().Warn("distlock: release failed; the lease will expire on its own", "err", err)
	} else if l.debug() {
		l.logger().Debug("distlock: released", "outcome", final.String(), "left", l.leaving)
	}
	ev := Event{State: Released, Time: time.Now(), Err: err}
	l.m.obs.ObserveTransition(TransitionInfo{Key: l.m.keys.Lease, Kind: l.m.kind, Token: l.g.token, From: l.state, To: Released,
		Err: err, Held: ev.Time.Sub(l.acquired)})
	l.g.final = outcome{state: final, err: err, event: ev}
	l.state = Released // State has reported Released since the release began
	l.subs.publish(ev)
	l.subs.closeAll()
}
