package distlock

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/distkit-go/distlock/actor"
	"github.com/distkit-go/distlock/lease"
)

// The guard's actor, and the guard's state machine.
//
// # Who owns a guard
//
// A guard is a virtual actor: it exists from the acquisition, but a
// goroutine runs it only when it has work. Exactly one party owns its
// state at any time, named by Guard.owner and changed only by a
// compare-and-swap:
//
//   - nil: nobody, while the guard is dormant: from the acquisition until
//     the first renewal is due, and between two renewals. A lock held for
//     less than a third of its TTL never has a goroutine, and a lock held
//     longer has one only while it renews. The call that ends the guard
//     (Release, Leave, the watch on the Lock context) claims it (nil →
//     ending) and makes the end on its own goroutine.
//   - an actor: while a renewal is due (the renewal timer's goroutine
//     claims the guard, nil → actor, and becomes its actor), or when a
//     Downgrade, or a Release whose context can end, needs one. The actor
//     owns the renewals, the lease deadline and the Lock context; every
//     command reaches it on its mailbox (endMsg, downgradeMsg) with a
//     one-slot reply, and every Redis call it makes is a child whose
//     answer comes back as a message, so its loop never waits on Redis
//     and answers a command at once. Once a renewal is confirmed with
//     nothing else in flight or waiting, the actor deactivates (actor →
//     nil): it arms the renewal timer for the next renewal, sets the watch
//     on the Lock context and exits, and the guard is dormant again. A
//     goroutine costs a held lock about 2.5 KiB at least (its stack and
//     its descriptor), more than the rest of the guard; a dormant one
//     costs a timer. The deadline needs no timer of its own while the
//     guard is dormant: the renewal is due two thirds of a TTL before it,
//     and the actor it starts arms one.
//   - ending: the end's owner, for good. A caller that claimed the end may
//     hand the tries of the final delete over to a new actor when its own
//     wait is over (ending → actor).
//   - retired: nobody, after a final loss. An actor whose renewal Redis
//     refused (the lease is gone or someone else's: it can never come
//     back) has nothing left to do: it exits, and the guard stays Lost
//     until its end, which sends nothing (retired → ending).
//
// Whoever owns the guard changes its state through one function, apply,
// which makes every transition and emits every event.

// guardActor is the actor of one guard, with the state of its loop.
type guardActor struct {
	g *Guard
	a *actor.Actor[guardMsg]

	// The next renewal, a child that the runtime starts when it is due
	// (actor.GoAfter): stopRenewal keeps it from starting; nil while none
	// is scheduled or in flight. Every renewal runs under ended, which the
	// end of the guard cancels (endRenewals).
	stopRenewal func() bool
	ended       context.Context
	endRenewals context.CancelFunc
	deadAt      *time.Timer      // the lease deadline D, while Acquired
	deadC       <-chan time.Time // deadAt's channel while armed
	// The Downgrade in flight and the ones waiting behind it, in order;
	// cancelDowngrade cancels the one in flight.
	downgrades      []downgradeMsg
	cancelDowngrade context.CancelFunc
	deleting        bool // the final delete is in flight
	// renewNow is where the client's keeper (Guard.renewSoon) tells a
	// running actor, without blocking, that the connection came back after
	// it dropped: the server may have forgotten the lease (see keeper.go).
	// It is made with the actor, since the keeper may read it as soon as
	// the actor owns the guard.
	renewNow chan struct{}
	// batcher sends the renewals of the client's guards in batches
	// (batcher.go), from the actor's first renewal on; nil when its
	// renewals go alone (with WithReplicaAck, or a store that cannot
	// batch).
	batcher  *batcher
	retiring bool // a renewal was refused: exit once nothing is in flight
	retired  bool // it retired: the guard is no longer its own
	byTimer  bool // the renewal timer activated it
	dormant  bool // it deactivated: the guard is no longer its own
	exit     bool // the loop returns
	// stopKeeper is the keeper that retire left last, to be stopped on
	// the way out.
	stopKeeper *keeper
}

// ending and retired are the owners of a guard that are not an actor (see
// "Who owns a guard").
var ending, retired = new(guardActor), new(guardActor)

// The actor's messages: the commands, sent by callers with a one-slot
// reply, and the answers of its children.
type guardMsg interface{ isGuardMsg() }

// endMsg begins the guard's end as how says (Release, Leave, the Lock
// context's end), unless it has begun already. The reply comes once State
// reports Released.
type endMsg struct {
	how   endHow
	reply actor.Reply[struct{}]
}

// downgradeMsg asks for a Downgrade; the reply is its error.
type downgradeMsg struct {
	ctx   context.Context
	reply actor.Reply[error]
}

// renewedMsg is the answer to a renewal sent at sent.
type renewedMsg struct {
	sent time.Time
	r    lease.Renewal
	err  error
}

// downgradedMsg is the answer to a Downgrade's script: whether it ran
// (ok), the readers it granted, and the error of its last try.
type downgradedMsg struct {
	sent   time.Time
	ok     bool
	passes lease.Release
	err    error
}

// deletedMsg says the tries of the final delete are over (their result is
// in Guard.deleting).
type deletedMsg struct{}

func (endMsg) isGuardMsg()        {}
func (downgradeMsg) isGuardMsg()  {}
func (renewedMsg) isGuardMsg()    {}
func (downgradedMsg) isGuardMsg() {}
func (deletedMsg) isGuardMsg()    {}

func newGuardActor(g *Guard) *guardActor {
	return &guardActor{g: g, a: actor.New[guardMsg](), renewNow: make(chan struct{}, 1)}
}

// takeOver makes a new actor the owner of g, if from owns it now, and
// returns it for the caller to run; it returns nil if from does not own g.
func (g *Guard) takeOver(from *guardActor) *guardActor {
	act := newGuardActor(g)
	if !g.owner.CompareAndSwap(from, act) {
		return nil
	}
	return act
}

// activate is the function of the renewal timer: unless the guard has an
// owner already, the timer's goroutine becomes its actor. A timer that
// fires late for an owner that has gone (one that ended the guard, or an
// actor that a command started meanwhile) finds the guard taken and does
// nothing.
func (g *Guard) activate() {
	if act := g.takeOver(nil); act != nil {
		act.byTimer = true
		act.a.Run(act.loop)
	}
}

// renewalTimer returns the renewal timer. Only newGuard's first
// activation can run before newGuard has stored it, and then only an
// actor that has already had a renewal answered asks for it, a round trip
// at least after the store: the wait is for a pathological scheduler.
func (g *Guard) renewalTimer() *time.Timer {
	for {
		if t := g.renewal.Load(); t != nil {
			return t
		}
		runtime.Gosched()
	}
}

// renewSoon has the guard renew at once; the client's keeper calls it when
// the connection came back after it dropped. It never blocks. poked is set
// first and its owner clears it when it schedules a renewal, so that a
// guard going dormant at this very moment cannot miss it: either the
// keeper sees it dormant and fires its timer, or the actor that leaves it
// sees poked (see deactivate). A renewal already in flight answers for
// the poke.
func (g *Guard) renewSoon() {
	g.poked.Store(true)
	switch a := g.owner.Load(); a {
	case nil:
		g.renewalTimer().Reset(0)
	case ending, retired:
	default:
		select {
		case a.renewNow <- struct{}{}:
		default: // asked already
		}
	}
}

// leaveKeeper takes the guard out of its keeper's watch, at its end or
// its final loss, and returns the keeper if the guard was the last one
// there: the caller must stop it (keeper.stop). It is called by the
// guard's owner.
func (g *Guard) leaveKeeper() *keeper {
	k := g.keeper
	if k == nil {
		return nil
	}
	g.keeper = nil
	if k.detach(g) {
		return k
	}
	return nil
}

// loop is the actor's loop: renew when due (and retry within the rules of
// L1b and L4), turn the guard Lost at D, answer commands, and end the
// guard when told to or when the Lock context ends. It returns when the
// guard has ended, when its loss is final (it retires), and when a
// renewal was confirmed with nothing else to do (it deactivates).
func (l *guardActor) loop(_ *actor.Actor[guardMsg], inbox <-chan guardMsg) {
	g := l.g
	// The actor owns the renewals and the Lock context from now on: the
	// renewal timer has done its part (a timer that activated the actor
	// has fired, and at the first renewal may not be stored yet).
	if !l.byTimer {
		g.renewalTimer().Stop()
	}
	if g.unwatch != nil {
		g.unwatch()
		g.unwatch = nil
	}
	l.deadAt = newStoppedTimer()
	defer l.deadAt.Stop()
	l.ended, l.endRenewals = context.WithCancel(context.Background())
	defer l.endRenewals()
	if g.how != 0 {
		// Handed over by the owner of the end, to finish the final delete.
		l.afterBegin()
	} else {
		g.retry = backoff{first: firstRetry, most: max(firstRetry, lostRetry(g.e.ttl))}
		due := time.Until(g.lastSent.Add(renewAfter(g.leaseTTL)))
		if g.poked.Swap(false) {
			due = 0 // the keeper asked while the guard was dormant
		}
		l.renewIn(due)
		l.armDeadline()
	}
	defer func() {
		// The keeper's watch ends with the guard, or with its final loss
		// (retire left it already); a dormant guard stays watched.
		k := l.stopKeeper
		if !l.dormant && !l.retired {
			k = g.leaveKeeper()
		}
		if k != nil {
			// Its stop may wait for the server: not in the actor's exit,
			// where a caller's Call could wait for it (Settle does).
			stopInBackground(k.stop)
		}
		if l.batcher != nil {
			l.batcher.leave()
		}
	}()
	for !l.exit {
		var lockDone <-chan struct{}
		if g.how == 0 {
			lockDone = g.lockCtx.Done()
		}
		select {
		case m := <-inbox:
			l.handle(m)
		case <-l.deadC:
			l.deadC = nil
			g.checkDeadline()
		case <-l.renewNow:
			if g.poked.Swap(false) && g.how == 0 && !l.retiring && l.unschedule() {
				l.renewIn(0)
			}
		case <-lockDone:
			l.begin(endRelease)
			g.warnLockDeadline()
		}
	}
}

// handle acts on one message.
func (l *guardActor) handle(m guardMsg) {
	g := l.g
	switch m := m.(type) {
	case endMsg:
		if g.how == 0 {
			l.begin(m.how)
		}
		m.reply.Send(struct{}{})
	case downgradeMsg:
		l.downgrades = append(l.downgrades, m)
		if len(l.downgrades) == 1 {
			l.downgrade()
		}
	case renewedMsg:
		l.stopRenewal = nil
		if g.how != 0 {
			l.afterBegin()
			return
		}
		if l.retiring {
			// The loss became final while this renewal was in flight (a
			// refused Downgrade): its answer, from a script that ran
			// before the refusal, must not make the guard Acquired again
			// (L4). It is dropped.
			l.retire()
			return
		}
		next, final := g.renewed(m.sent, m.r, m.err)
		if final {
			l.retire()
			return
		}
		if g.keeper == nil {
			// From its first renewal on, the client's keeper watches for
			// the guard (an actor that only ends a young guard needs none).
			g.keeper = proc.keepers.watch(g)
		}
		if l.idle(next) {
			l.deactivate(next)
			return
		}
		l.renewIn(next)
		l.armDeadline()
	case downgradedMsg:
		l.downgraded(m)
	case deletedMsg:
		l.deleting = false
		g.finishDelete()
		l.exit = true
	}
}

// idle reports whether the actor has nothing to do until the next
// renewal, next from now: the last one was confirmed (no retry is due, the
// guard is Acquired), and no Downgrade is in flight or waiting.
func (l *guardActor) idle(next time.Duration) bool {
	g := l.g
	return next > 0 && g.renewErr == nil && g.pub.st.Load().state == Acquired &&
		l.cancelDowngrade == nil && len(l.downgrades) == 0
}

// deactivate makes the guard dormant until its next renewal, next from
// now, and ends the actor: the guard is nobody's again (owner nil), with
// the watch on the Lock context set and the renewal timer armed, whose
// goroutine becomes the guard's actor when the renewal is due, as at the
// first renewal. Nothing is in flight (see idle), so the actor's return
// waits for nothing.
//
// The order matters, for whoever comes meanwhile. The watch is set while
// the actor still owns the guard: if the Lock context ends at once, the
// watch's end finds the actor, whose mailbox reports it stopped once the
// loop returns, and then claims the dormant guard. The timer is armed
// only after the guard is released to nobody, since a timer that fired
// while the actor still owned it would find it taken and activate
// nothing; a caller that claims the guard in between stops the timer,
// which this Reset may arm again: its activation then finds the guard
// taken. A keeper's poke that came while the actor was leaving it is
// caught by poked (see renewSoon).
func (l *guardActor) deactivate(next time.Duration) {
	g := l.g
	l.deadAt.Stop()
	l.deadC = nil
	if g.lockCtx.Done() != nil {
		g.unwatch = context.AfterFunc(g.lockCtx, g.lockCtxEnded)
	}
	l.dormant, l.exit = true, true
	t := g.renewalTimer()
	// Through the batcher, the renewal starts within its slack, as the
	// first one does (see renewIn): the timer takes the slack.
	next -= min(next, g.e.renewSlack(renewAfter(g.e.ttl)))
	g.owner.Store(nil)
	// The guard is not this actor's any more: only the timer, which is
	// safe for concurrent use, is touched from here on.
	t.Reset(next)
	if g.poked.Load() {
		t.Reset(0)
	}
}

// renewIn schedules the next renewal d from now. Through the batcher, the
// child starts a little earlier (the slack of the renewal period, or
// at once when less than that is left: a retry, the first renewal, whose
// timer took the slack already) and asks for the renewal to be sent by d
// from now: it goes then, or earlier with the renewals of other guards
// that are due within their own slack.
func (l *guardActor) renewIn(d time.Duration) {
	e := l.g.e
	if l.batcher == nil && l.g.set == nil {
		// (A set's renewals go as batches of their own, one per group.)
		l.batcher = proc.batchers.join(e)
	}
	if l.batcher == nil {
		l.stopRenewal = l.a.GoAfter(d, l.renew)
		return
	}
	latest := time.Now().Add(d)
	slack := min(max(d, 0), renewSlack(renewAfter(e.ttl)))
	l.stopRenewal = l.a.GoAfter(d-slack, func(actx context.Context) { l.renewBy(actx, latest) })
}

// unschedule stops a renewal that is scheduled and has not started, and
// reports whether none is in flight now.
func (l *guardActor) unschedule() bool {
	if l.stopRenewal == nil {
		return true
	}
	if !l.stopRenewal() {
		return false // it runs: its answer will come
	}
	l.stopRenewal = nil
	return true
}

// armDeadline arms the deadline timer at D while the guard is Acquired, so
// that it turns Lost at D even while a renewal is still in flight: not
// every client ends a call at its deadline (go-redis waits out its
// ReadTimeout, and retries), and a dial may not watch it.
func (l *guardActor) armDeadline() {
	if s := l.g.pub.st.Load(); s.state == Acquired {
		l.deadAt.Reset(time.Until(s.deadline))
		l.deadC = l.deadAt.C
		return
	}
	l.deadAt.Stop()
	l.deadC = nil
}

// renew sends one renewal; it runs as the actor's child when the renewal
// is due, and sends the answer to the loop. The call's deadline is the
// lease deadline while the lease is held (L1: no call for a held lock
// outlives D), and one renewal period when it is Lost; the end of the
// guard (l.ended) ends it too. A lease whose deadline has passed
// before the deadline timer said so gets a call that fails at once, and
// the answer makes the guard Lost, as the timer would.
func (l *guardActor) renew(actx context.Context) { l.renewBy(actx, time.Time{}) }

// renewBy is renew through the batcher, when the actor has one, which
// sends the renewal by latest. Its answer means what a lone renewal's
// does; the send time is the batch's (no later than the script's start,
// so the lease deadline counts from it as from a lone renewal's), or the
// time of the ask when none was sent before the call's context ended.
func (l *guardActor) renewBy(actx context.Context, latest time.Time) {
	g := l.g
	e := g.e
	s := g.pub.st.Load()
	sent := time.Now()
	dl := sent.Add(renewAfter(e.ttl))
	if s.state == Acquired {
		dl = s.deadline
	}
	var r lease.Renewal
	var err error
	switch {
	case l.batcher != nil:
		// The batcher keeps dl itself (see batcher.go, "Deadlines").
		sent, r, err = l.batcher.renew(l.ended, dl, e.keys, g.value, e.ttl, latest, sent)
	case g.set != nil:
		ctx, cancel := context.WithDeadline(l.ended, dl)
		r, err = g.set.renewAll(ctx, g.value, e.ttl)
		cancel()
	default:
		ctx, cancel := context.WithDeadline(l.ended, dl)
		r, err = e.store.Renew(ctx, e.keys, g.value, e.ttl)
		cancel()
	}
	_ = l.a.Send(actx, renewedMsg{sent: sent, r: r, err: err})
}

// begin begins the guard's end: State reports Released, the context is
// cancelled, and whatever is in flight is cancelled; the end's last step
// comes once it has answered (afterBegin).
func (l *guardActor) begin(how endHow) {
	l.g.begin(how)
	l.deadAt.Stop()
	l.deadC = nil
	if !l.unschedule() {
		l.endRenewals() // the one in flight
	}
	if l.cancelDowngrade != nil {
		l.cancelDowngrade()
	}
	l.afterBegin()
}

// afterBegin takes the end's last step once nothing else is in flight
// (after Release or Leave returns, no command of the guard reaches Redis
// but the final delete): nothing to send for Leave, the final delete
// otherwise.
func (l *guardActor) afterBegin() {
	g := l.g
	if l.stopRenewal != nil || l.cancelDowngrade != nil || l.deleting {
		return
	}
	if g.how == endLeave {
		g.finish(releaseResult{})
		l.exit = true
		return
	}
	l.deleting = true
	ctx, dl := context.WithoutCancel(g.lockCtx), g.leaseEnd()
	l.a.Go(func(actx context.Context) {
		g.sendDelete(ctx, dl)
		_ = l.a.Send(actx, deletedMsg{})
	})
}

// retire ends the actor after a final loss, once nothing else is in
// flight: the guard stays Lost, with no goroutine, until its end (see "Who
// owns a guard"), and the Lock context is watched again without one.
func (l *guardActor) retire() {
	l.retiring = true
	if !l.unschedule() {
		return // retire when the renewal has answered
	}
	if l.cancelDowngrade != nil {
		l.cancelDowngrade()
		return // retire when it has answered
	}
	g := l.g
	if g.lockCtx.Done() != nil {
		g.unwatch = context.AfterFunc(g.lockCtx, g.lockCtxEnded)
	}
	if g.e.debug() {
		g.logger().Debug("distlock: the loss is final; the guard's actor exits")
	}
	// The keeper's watch ends here, while the guard is still the actor's;
	// the keeper, if this was its last guard, is stopped on the way out.
	l.stopKeeper = g.leaveKeeper()
	if g.set != nil {
		// A set lost one name: the others are held for nothing, and go
		// back to their lines now rather than at the end of their leases.
		g.set.giveUp(g.value, g.void, g.leaseEnd())
	}
	g.owner.Store(retired)
	l.retired, l.exit = true, true
}

// downgrade sends the first waiting Downgrade's script, in a child, unless
// the guard cannot be downgraded (then it answers at once and goes on with
// the next).
func (l *guardActor) downgrade() {
	g := l.g
	e := g.e
	for len(l.downgrades) > 0 {
		m := l.downgrades[0]
		if err := g.downgradable(); err != nil {
			m.reply.Send(err)
			l.downgrades = l.downgrades[1:]
			continue
		}
		d := e.store.(downgrader)      // Guard.Downgrade checked it
		dl := g.pub.st.Load().deadline // L1: no call for a held lock outlives D
		ctx, cancel := context.WithCancel(m.ctx)
		l.cancelDowngrade = cancel
		l.a.Go(func(actx context.Context) {
			var msg downgradedMsg
			var t tries
			untilAnswered(ctx, dl, &t, func(ctx context.Context) error {
				msg.sent = time.Now()
				var err error
				msg.ok, msg.passes, err = d.Downgrade(ctx, e.keys, g.value, e.ttl)
				return err
			})
			msg.err = t.err
			if !t.answered && t.err != nil && ctx.Err() == nil {
				msg.err = fmt.Errorf("no reply before the lease deadline: %w", t.err)
			}
			_ = l.a.Send(actx, msg)
		})
		return
	}
}

// downgraded applies the answer to a Downgrade's script and goes on with
// the next Downgrade, if one waits.
func (l *guardActor) downgraded(m downgradedMsg) {
	g := l.g
	e := g.e
	l.cancelDowngrade()
	l.cancelDowngrade = nil
	req := l.downgrades[0]
	l.downgrades = l.downgrades[1:]
	var lost bool
	switch {
	case g.how != 0:
		req.reply.Send(fmt.Errorf("distlock: downgrading %s: %w", e.keys.Lease, ErrReleased))
	case m.err == nil && m.ok:
		g.downgraded.Store(true)
		deliverPasses(e.roomKey(), m.passes, m.sent)
		if e.debug() {
			g.logger().Debug("distlock: downgraded to a read hold", "granted", len(m.passes.Passes()))
		}
		req.reply.Send(nil)
	case m.err == nil:
		cause := &LostError{Key: e.keys.Lease, Reason: LostRefused}
		g.lose(cause)
		lost = true
		req.reply.Send(fmt.Errorf("distlock: downgrading %s: %w", e.keys.Lease, cause))
	default:
		req.reply.Send(fmt.Errorf("distlock: downgrading %s: %w", e.keys.Lease, m.err))
	}
	switch {
	case g.how != 0:
		for _, r := range l.downgrades {
			r.reply.Send(fmt.Errorf("distlock: downgrading %s: %w", e.keys.Lease, ErrReleased))
		}
		l.downgrades = nil
		l.afterBegin()
	case lost || l.retiring:
		for _, r := range l.downgrades {
			r.reply.Send(g.downgradable())
		}
		l.downgrades = nil
		l.armDeadline()
		l.retire()
	default:
		l.downgrade()
	}
}

// downgradable returns the error of a Downgrade of a guard that cannot be
// downgraded now: one downgraded already, one whose end has begun, one
// whose lease is in doubt. It is called by the guard's owner.
func (g *Guard) downgradable() error {
	key := g.e.keys.Lease
	g.checkDeadline()
	switch s := g.pub.st.Load(); {
	case g.how != 0:
		return fmt.Errorf("distlock: downgrading %s: %w", key, ErrReleased)
	case g.mode() != lease.Write:
		return fmt.Errorf("%w: the guard of %s holds it for reading", ErrNotWriteLock, key)
	case s.state != Acquired:
		var lost *LostError
		if errors.As(s.err, &lost) {
			return fmt.Errorf("distlock: downgrading %s: %w", key, lost)
		}
		return fmt.Errorf("distlock: downgrading %s: %w", key, ErrLost)
	}
	return nil
}

// newStoppedTimer returns a timer that is not armed.
func newStoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// The guard's state machine. Every change of the guard's state is made by
// its owner, through apply.

// change is one change of a guard's state, for apply.
type change struct {
	next  *status // the new status; nil keeps it
	cause error   // cancels the guard's context (only the first cause counts)
	// ev is the event to emit, if emit is set. It is a transition,
	// reported to the Observer too, when its state differs from from's.
	ev    Event
	emit  bool
	from  State
	held  time.Duration // for the final Released: how long the guard existed
	final bool          // the guard has ended: close every subscription
}

// apply is the guard's one transition and its one emit. It tells everyone
// who watches in a fixed order: State and Deadline, the context (whoever
// sees it cancelled then reads the new state) and the subscribers at once
// (see signals.publish); then the Observer, from the owner's goroutine.
func (g *Guard) apply(c change) {
	g.pub.publish(c.next, c.cause, c.ev, c.emit, c.final)
	if c.emit && c.ev.State != c.from {
		e := g.e
		e.obs.ObserveTransition(TransitionInfo{Key: e.keys.Lease, Kind: e.kind, Mode: e.keys.Mode.String(), Token: g.token,
			From: c.from, To: c.ev.State, Err: c.ev.Err, Held: c.held})
	}
}

// begin begins the guard's end as how says: from now on State reports
// Released and the guard's context is cancelled with ErrReleased. A lease
// that lapsed before the end began, though no timer has said so yet, was
// lost first.
func (g *Guard) begin(how endHow) {
	g.checkDeadline()
	g.how, g.endFrom = how, g.pub.st.Load().state
	g.apply(change{next: released, cause: ErrReleased})
	if g.e.debug() {
		g.logger().Debug("distlock: ending", "leave", how == endLeave)
	}
}

// finish records how the guard ended, publishes Released and closes every
// subscription and Done. After Leave, r is empty: nothing was sent, and
// the lease stays until it expires.
func (g *Guard) finish(r releaseResult) {
	from, final := g.endFrom, Released
	switch {
	case g.how == endLeave || r.err != nil:
		// Nothing new was learnt: the lease stays until it expires (after
		// Leave the waiter first in line watches its TTL and takes it then;
		// after a failed delete it expires on its own).
	case !r.deleted && from == Acquired && !r.unanswered:
		// The key no longer held our value: whatever we believed, the
		// lease had slipped.
		cause := &LostError{Key: g.e.keys.Lease, Reason: LostRefused}
		g.apply(change{ev: Event{State: Lost, Time: time.Now(), Err: cause}, emit: true, from: Acquired})
		g.logger().Warn("distlock: lock lost", "reason", cause.Reason.String(), "err", cause)
		from = Lost
	}
	if from != Acquired {
		final = Lost
	}
	var err error
	if r.err != nil {
		err = fmt.Errorf("distlock: releasing %s: %w", g.e.keys.Lease, r.err)
		g.logger().Warn("distlock: release failed; the lease will expire on its own", "err", err)
	} else if g.e.debug() {
		g.logger().Debug("distlock: released", "outcome", final.String(), "left", g.how == endLeave)
	}
	g.final = outcome{state: final, err: err}
	now := time.Now()
	g.apply(change{ev: Event{State: Released, Time: now, Err: err}, emit: true, from: from, held: now.Sub(g.acquired), final: true})
	// Whoever owned the guard, its end owns it from now on: an actor
	// that made the end is about to return.
	g.owner.Store(ending)
	close(g.done)
}

// confirm records a write of ttl, sent at sent, that Redis confirmed: the
// deadline moves on, and a Lost guard is Acquired again.
func (g *Guard) confirm(sent time.Time, ttl time.Duration) {
	g.lastSent, g.leaseTTL = sent, ttl
	g.renewErr = nil
	g.retry.reset()
	prev := g.pub.st.Load()
	next := &status{state: Acquired, since: prev.since, deadline: leaseDeadline(sent, ttl)}
	if prev.state != Lost {
		g.apply(change{next: next})
		return
	}
	next.since = time.Now()
	g.apply(change{next: next, ev: Event{State: Acquired, Time: next.since}, emit: true, from: Lost})
	g.logger().Info("distlock: lock regained")
}

// lose moves an Acquired guard to Lost for cause; the deadline it had is
// kept. The first loss cancels the guard's context.
func (g *Guard) lose(cause *LostError) {
	prev := g.pub.st.Load()
	if prev.state != Acquired {
		return
	}
	now := time.Now()
	g.apply(change{next: &status{state: Lost, since: now, deadline: prev.deadline, err: cause}, cause: cause,
		ev: Event{State: Lost, Time: now, Err: cause}, emit: true, from: Acquired})
	g.logger().Warn("distlock: lock lost", "reason", cause.Reason.String(), "err", cause)
}

// checkDeadline marks the guard Lost if its deadline has passed: because
// renewals failed up to it (the last failure says why), or because none
// was confirmed in time.
func (g *Guard) checkDeadline() {
	if s := g.pub.st.Load(); s.state == Acquired && !time.Now().Before(s.deadline) {
		cause := &LostError{Key: g.e.keys.Lease, Reason: LostDeadline}
		if g.renewErr != nil {
			cause.Reason, cause.Err = LostRenewFailed, g.renewErr
		}
		g.lose(cause)
	}
}

// renewed applies the answer to a renewal sent at sent and returns how long
// to wait before the next one, or final when there will be none.
//
// A renewal that Redis refused (the key no longer holds this acquisition's
// value) makes the guard Lost for good: L4 allows no regain once another
// value or nothing holds the key. One that failed without confirming
// anything (no reply: a reset, a refused dial, a timeout; or an error
// reply, or replicas that did not acknowledge it) proves nothing either
// way: it can only have extended the lease, never shortened it (L1b). While
// the guard is Acquired, such a failure is reported (to the Observer, to
// the subscribers as an Acquired event with a [*RenewError], and in the
// log at Warn) and the renewal is retried after a short pause that grows
// with each failure; the guard turns Lost when its deadline comes first,
// and a Lost guard keeps trying every TTL/9.
func (g *Guard) renewed(sent time.Time, r lease.Renewal, err error) (next time.Duration, final bool) {
	e := g.e
	ttl := e.ttl
	now := time.Now()
	info := RenewInfo{Key: e.keys.Lease, Kind: e.kind, Mode: g.mode().String(), Token: g.token, Latency: now.Sub(sent), Err: err}
	if err == nil && !r.OK {
		info.Err = &LostError{Key: g.refusedKey(), Reason: LostRefused, Holder: lease.Owner(r.Holder)}
	}
	e.obs.ObserveRenew(info)
	s := g.pub.st.Load()
	switch {
	case err != nil && s.state == Acquired && now.Before(s.deadline):
		g.renewErr = err
		pause := g.retry.next()
		if left := s.deadline.Sub(now); pause >= left {
			// No retry can be sent before the deadline: the guard is
			// Lost then (see armDeadline).
			pause = left
		}
		rerr := &RenewError{Key: e.keys.Lease, Err: err, Deadline: s.deadline, Retry: pause}
		g.apply(change{ev: Event{State: Acquired, Time: now, Err: rerr}, emit: true, from: Acquired})
		g.logger().Warn("distlock: renewal failed; the lease still holds, retrying",
			"err", err, "deadline_in", s.deadline.Sub(now), "retry_in", pause)
		return pause, false
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
		g.lose(cause)
		// A Lost guard keeps trying: a renewal that finds the key still
		// holding its value regains it.
		return lostRetry(ttl), false
	case !r.OK:
		if e.debug() {
			g.logger().Debug("distlock: renewal refused", "holder", r.Holder)
		}
		g.lose(info.Err.(*LostError))
		return 0, true
	case !now.Before(leaseDeadline(sent, ttl)):
		// Confirmed, but too late to count: the lease may already be gone
		// by the time we could act on it.
		g.lose(&LostError{Key: e.keys.Lease, Reason: LostDeadline})
		return 0, false
	}
	g.confirm(sent, ttl)
	if e.debug() {
		g.logger().Debug("distlock: renewed", "deadline_in", g.pub.st.Load().deadline.Sub(now))
	}
	return sent.Add(renewAfter(ttl)).Sub(now), false
}
