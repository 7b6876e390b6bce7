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
	m       *Mutex
	g       *Guard
	value   string
	lockCtx context.Context
	cancel  context.CancelCauseFunc
	log     *slog.Logger

	state    State     // Acquired or Lost while running
	since    time.Time // when state was entered
	cause    error     // why, for Lost
	lastSent time.Time // send time of the last write Redis confirmed
	deadline time.Time // D: lastSent + TTL - margin
	subs     subscribers

	acquired      time.Time // when the guard was created
	heldAtRelease bool      // whether the lease was held when the release began
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

// confirm records a write that Redis confirmed, sent at sent.
func (l *leaseLoop) confirm(sent time.Time) {
	l.lastSent = sent
	l.deadline = sent.Add(l.m.ttl - margin(l.m.ttl))
}

// run is the actor's loop. It renews, watches the deadline and serves the
// mailbox until stop is closed, then releases the lease and returns.
func (l *leaseLoop) run(a *actor.Actor[guardMsg], inbox <-chan guardMsg, stop <-chan struct{}) {
	// Cancelling the Lock context releases the guard. The registration is
	// removed on the way out, so a long-lived context does not accumulate
	// them.
	defer context.AfterFunc(l.lockCtx, a.Stop)()

	ttl := l.m.ttl
	renewTimer := time.NewTimer(time.Until(l.lastSent.Add(ttl / 3)))
	defer renewTimer.Stop()
	deadlineTimer := time.NewTimer(time.Until(l.deadline))
	defer deadlineTimer.Stop()

	results := make(chan renewResult, 1) // at most one renewal in flight
	var cancelRenew context.CancelFunc   // set while a renewal is in flight
	var released chan releaseResult      // set while the release is in flight
	renewC := renewTimer.C               // nil while a renewal is in flight or after stop
	releasing := false

	for {
		select {
		case <-renewC:
			renewC = nil
			cancelRenew = l.startRenew(a, results)

		case res := <-results:
			cancelRenew()
			cancelRenew = nil
			if releasing {
				released = l.startRelease(a)
				continue
			}
			next := l.onRenew(res)
			renewTimer.Reset(next)
			renewC = renewTimer.C
			if l.state == Acquired {
				deadlineTimer.Reset(time.Until(l.deadline))
			}

		case <-deadlineTimer.C:
			l.checkDeadline()

		case msg := <-inbox:
			l.handle(a, msg)

		case <-stop:
			stop, renewC, releasing = nil, nil, true
			l.checkDeadline()
			l.heldAtRelease = l.state == Acquired
			// The critical section ends before the lease is deleted.
			l.cancel(ErrReleased)
			if cancelRenew != nil {
				// Stop waiting for the renewal; its command, if sent, is
				// ahead of the delete on the connection, and the delete
				// starts once the renewal call has returned.
				cancelRenew()
			} else {
				released = l.startRelease(a)
			}

		case r := <-released:
			l.finish(r)
			return
		}
	}
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
	info := RenewInfo{Key: l.m.keys.Lease, Token: l.g.token, Latency: now.Sub(res.sent), Err: res.err}
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
		l.log.Debug("distlock: renewal failed", "err", res.err, "took", now.Sub(res.sent))
		l.markLost(&LostError{Key: l.m.keys.Lease, Reason: reason, Err: res.err})
		// Retry sooner than usual: a short outage then heals quickly.
		return ttl / 9
	case !res.r.OK:
		l.log.Debug("distlock: renewal refused", "holder", res.r.Holder)
		l.markLost(info.Err.(*LostError))
		return ttl / 3
	}
	if newD := res.sent.Add(ttl - margin(ttl)); !now.Before(newD) {
		// Confirmed, but too late to count: the lease may already be gone
		// by the time we could act on it.
		l.markLost(&LostError{Key: l.m.keys.Lease, Reason: LostDeadline})
		return 0
	}
	l.confirm(res.sent)
	if l.state == Lost {
		l.setState(Acquired, nil)
		l.log.Info("distlock: lock regained")
	} else {
		l.g.snap.Store(&snapshot{state: Acquired, deadline: l.deadline})
	}
	l.log.Debug("distlock: renewed", "deadline_in", l.deadline.Sub(now))
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
	l.cancel(cause)
	l.setState(Lost, cause)
	l.log.Warn("distlock: lock lost", "reason", cause.Reason.String(), "err", cause)
}

// setState records a transition, publishes it to State and to subscribers.
func (l *leaseLoop) setState(s State, err error) {
	l.m.obs.ObserveTransition(TransitionInfo{Key: l.m.keys.Lease, Token: l.g.token, From: l.state, To: s, Err: err})
	l.state, l.since, l.cause = s, time.Now(), err
	l.g.snap.Store(&snapshot{state: s, deadline: l.deadline})
	l.subs.publish(Event{State: s, Time: l.since, Err: err})
}

// handle serves one mailbox message.
func (l *leaseLoop) handle(a *actor.Actor[guardMsg], msg guardMsg) {
	switch msg := msg.(type) {
	case subscribeMsg:
		l.checkDeadline()
		ch := msg.ch
		l.subs.add(msg.ctx, ch, Event{State: l.state, Time: l.since, Err: l.cause}, func() {
			_ = a.Send(context.Background(), unsubscribeMsg{ch: ch})
		})
		msg.reply.Send(struct{}{})
	case unsubscribeMsg:
		l.subs.remove(msg.ch)
	}
}

// startRelease sends the conditional delete in a child goroutine. Waiting for
// it past the end of the lease would be pointless, since the key is gone by
// then either way; minReleaseWait still gives a lapsed lease one try.
func (l *leaseLoop) startRelease(a *actor.Actor[guardMsg]) chan releaseResult {
	ch := make(chan releaseResult, 1)
	dl := l.lastSent.Add(l.m.ttl)
	if floor := time.Now().Add(minReleaseWait); dl.Before(floor) {
		dl = floor
	}
	ctx, cancel := context.WithDeadline(context.Background(), dl)
	m, value := l.m, l.value
	a.Go(func() {
		defer cancel()
		deleted, err := m.store.Release(ctx, m.keys, value)
		ch <- releaseResult{deleted: deleted, err: err}
	})
	return ch
}

// finish records how the guard ended, publishes Released and closes every
// subscription.
func (l *leaseLoop) finish(r releaseResult) {
	final := Released
	switch {
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
		l.log.Warn("distlock: release failed; the lease will expire on its own", "err", err)
	} else {
		l.log.Debug("distlock: released", "outcome", final.String())
	}
	queues.released(l.m.queueKey(), l.value, r.err == nil && r.deleted)
	ev := Event{State: Released, Time: time.Now(), Err: err}
	l.m.obs.ObserveTransition(TransitionInfo{Key: l.m.keys.Lease, Token: l.g.token, From: l.state, To: Released,
		Err: err, Held: ev.Time.Sub(l.acquired)})
	l.g.final = outcome{state: final, err: err, event: ev}
	l.state = Released
	l.g.snap.Store(&snapshot{state: Released})
	l.subs.publish(ev)
	l.subs.closeAll()
}
