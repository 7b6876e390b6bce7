package distlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/distkit-go/distlock/actor"
	"github.com/distkit-go/distlock/lease"
)

// The guard's actor, and the guard's state machine.
//
// # Who owns a guard
//
// A guard is a virtual actor until its first renewal, and a goroutine of
// its own from then until its end. Exactly one party owns its state at
// any time, named by Guard.owner and changed only by a compare-and-swap:
//
//   - nil: nobody, while the guard is young: from the acquisition until
//     its first renewal is due (a third of the TTL, less the batcher's
//     slack). The guard then has no goroutine, only its renewal timer and
//     a watch on the Lock context; a lock held for less than that never
//     has one. The call that ends it (Release, Leave, the watch on the
//     Lock context) claims it (nil → ending) and makes the end on its own
//     goroutine.
//   - an actor: from the first renewal on. The renewal timer's goroutine
//     claims the guard (nil → actor) and becomes its actor, and stays it
//     until the guard ends or its loss is final: it owns the renewal
//     timer, the lease deadline and the Lock context, and takes every
//     command on its mailbox (endMsg, downgradeMsg) with a one-slot reply.
//     Its loop never waits on Redis: a renewal through the client's
//     batcher is an ask whose answer the batcher writes into the ask and
//     wakes the actor for, and every other Redis call (a lone renewal, a
//     Downgrade, the final delete) is a child whose answer comes back on
//     the mailbox. A Downgrade of a young guard starts its actor early.
//   - ending: the end's owner, for good. A caller that claimed the end may
//     hand the tries of the final delete over to a new actor when its own
//     wait is over (ending → actor); that actor sends nothing else.
//   - retired: nobody, after a final loss. An actor whose renewal Redis
//     refused (the lease is gone or someone else's: it can never come
//     back) has nothing left to do: it exits, and the guard stays Lost
//     until its end, which sends nothing (retired → ending).
//
// An actor stores its successor (ending or retired) before its loop
// returns, so a caller whose message finds the actor stopped reads who
// owns the guard now, once, and never waits for a new actor.
//
// Whoever owns the guard changes its state through one function, apply,
// which makes every transition and emits every event.

// guardActor is the actor of one guard, with the state of its loop.
//
// It is lean on purpose: a process may hold 100,000 of them. Its loop
// selects on three channels (four with a Lock context that can end), a
// renewal allocates nothing of its own, and the loop's frame and the calls
// it makes on a renewal are shallow, so that its goroutine's stack stays
// at the runtime's smallest.
type guardActor struct {
	g *Guard
	a *actor.Actor[guardMsg]

	// One timer wakes the actor for what comes first: the next renewal,
	// due at renewAt (zero while none is scheduled: one is in flight, or
	// the renewals have stopped), and the lease deadline D it watches,
	// watchD (zero while it watches none; see armDeadline). timerC is the
	// timer's channel while it is armed, at armedAt; nil otherwise.
	timer   *time.Timer
	timerC  <-chan time.Time
	armedAt time.Time
	renewAt time.Time
	watchD  time.Time
	sendNow bool // a renewal is due now: sent when the step returns (sendDue)
	// Through the batcher the renewal is asked to be sent by latest.
	// While one is in flight, asking says req is with the batcher (its
	// answer is written into it, and wake wakes the actor) or lone says a
	// child sends it alone, under ended, which the guard's end cancels.
	latest      time.Time
	req         renewAsk
	asking      bool
	lone        bool
	ended       context.Context
	endRenewals context.CancelFunc
	// wake is the actor's one-slot wake-up: the batcher wakes it when the
	// answer to req is there, and the client's keeper (Guard.renewSoon)
	// when the connection came back after it dropped (the server may
	// have forgotten the lease: see keeper.go), setting soon first.
	wake chan struct{}
	soon atomic.Bool
	// The Downgrade in flight and the ones waiting behind it, in order;
	// cancelDowngrade cancels the one in flight.
	downgrades      []downgradeMsg
	cancelDowngrade context.CancelFunc
	deleting        bool // the final delete is in flight
	// batcher sends the renewals of the client's guards in batches
	// (batcher.go), from the actor's first renewal on; nil when its
	// renewals go alone (with WithReplicaAck, or a store that cannot
	// batch, or a set's).
	batcher  *batcher
	retiring bool // a renewal was refused: exit once nothing is in flight
	retired  bool // it retired: the guard is no longer its own
	byTimer  bool // the renewal timer activated it
	exit     bool // the loop returns
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

// renewedMsg is the answer, which came at at, to a renewal sent alone at
// sent.
type renewedMsg struct {
	sent, at time.Time
	r        lease.Renewal
	err      error
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
	return &guardActor{g: g, a: actor.New[guardMsg](), wake: make(chan struct{}, 1)}
}

// run runs the actor's loop on the calling goroutine, counted in
// proc.actors while it runs.
func (l *guardActor) run() {
	proc.actors.Add(1)
	l.a.Run(l.loop)
	proc.actors.Add(-1)
}

// poke wakes the actor without blocking.
func (l *guardActor) poke() {
	select {
	case l.wake <- struct{}{}:
	default: // woken already
	}
}

// activate is the function of the renewal timer: unless the guard has an
// owner already, the timer's goroutine becomes its actor, for the rest of
// the guard's life. A timer that fires late for an owner that has gone
// (one that ended the guard, or an actor that a Downgrade started) finds
// the guard taken and does nothing.
func (g *Guard) activate() {
	act := newGuardActor(g)
	if g.owner.CompareAndSwap(nil, act) {
		act.byTimer = true
		act.run()
	}
}

// renewSoon has the guard renew at once; the client's keeper calls it when
// the connection came back after it dropped. It never blocks. A young
// guard's renewal timer is fired now (if the guard has just become an
// actor, that actor renews at once anyway, and the timer's second run
// finds the guard taken); an actor is told by soon and woken. A renewal
// already in flight answers for the poke.
func (g *Guard) renewSoon() {
	switch a := g.owner.Load(); a {
	case nil:
		g.renewal.Reset(0)
	case ending, retired:
	default:
		a.soon.Store(true)
		a.poke()
	}
}

// leaveKeeper takes the guard out of its keeper's watch, at its end or
// its final loss. It never waits. It is called by the guard's owner.
func (g *Guard) leaveKeeper() {
	if k := g.keeper; k != nil {
		g.keeper = nil
		k.detach(g)
	}
}

// loop is the actor's loop: renew when due (and retry within the rules of
// L1b and L4), turn the guard Lost at D, answer commands, and end the
// guard when told to or when the Lock context ends. It returns when the
// guard has ended and when its loss is final (it retires), at no other
// time. It only dispatches: what it does for each wake-up is a call that
// returns before the loop selects again, so the frames under the select,
// where the goroutine spends its life, are few and small.
func (l *guardActor) loop(_ *actor.Actor[guardMsg], inbox <-chan guardMsg) {
	l.start()
	for !l.exit {
		l.arm()
		var lockDone <-chan struct{}
		if l.g.how == 0 {
			lockDone = l.g.lockCtx.Done()
		}
		var m guardMsg
		var by wakeUp
		select {
		case m = <-inbox:
			by = byMessage
		case <-l.wake:
			by = byWake
		case <-l.timerC:
			by = byTimer
		case <-lockDone:
			by = byLockCtx
		}
		l.step(by, m)
	}
	l.timer.Stop()
	l.exited()
}

// wakeUp is what woke the actor's loop.
type wakeUp int8

const (
	byMessage wakeUp = iota // a message on the mailbox
	byWake                  // its one-slot wake-up (the batcher, the keeper)
	byTimer                 // its timer
	byLockCtx               // the end of the Lock context
)

// step acts on one wake-up of the loop (m is the message, for byMessage).
// An answer the batcher wrote without waking the actor (a renewal it
// confirmed, see renew) is read first, whatever woke the actor: the
// guard's deadline, and whatever is decided now, must count it.
//
// It is kept out of the loop's frame on purpose: the loop's frame and the
// select's stay on the goroutine's stack while it is parked, and what
// step calls comes and goes above them.
//
//go:noinline
func (l *guardActor) step(by wakeUp, m guardMsg) {
	if l.asking && l.req.ready.Load() {
		l.answered()
		if l.exit {
			// The answer ended the actor (a final loss, or the last step
			// of an end): the guard is no longer its own. A message it
			// took goes unanswered, and its caller, told the actor
			// stopped, reads who owns the guard now (see Guard.end).
			return
		}
	}
	switch by {
	case byMessage:
		l.handle(m)
	case byWake:
		l.woken()
	case byTimer:
		l.timerC = nil
		l.fired()
	case byLockCtx:
		l.begin(endRelease)
		l.g.warnLockDeadline()
	}
	l.sendDue()
}

// answered reads the batcher's answer to the renewal in flight.
func (l *guardActor) answered() {
	l.asking = false
	a := &l.req.ans
	l.renewed(a.sent, a.at, a.r, a.err)
}

// start takes the guard over: the renewal timer has done its part (a
// timer that activated the actor has fired), the actor watches the Lock
// context itself, and the first renewal is scheduled, or, for an actor
// handed the end, the final delete is sent.
func (l *guardActor) start() {
	g := l.g
	if !l.byTimer {
		g.renewal.Stop()
	}
	if g.unwatch != nil {
		g.unwatch()
		g.unwatch = nil
	}
	l.timer = newStoppedTimer()
	if g.how != 0 {
		// Handed over by the owner of the end, to finish the final delete.
		l.afterBegin()
		return
	}
	g.retry = backoff{first: firstRetry, most: max(firstRetry, lostRetry(g.e.ttl))}
	due := time.Until(g.lastSent.Add(renewAfter(g.leaseTTL)))
	if l.byTimer && due > g.e.renewSlack(renewAfter(g.e.ttl)) {
		// The timer fired before its time: the keeper fired it (see
		// renewSoon), and the first renewal is brought forward.
		due = 0
	}
	l.renewIn(due)
	l.armDeadline()
	l.sendDue()
}

// woken acts on a wake-up: the keeper's restart poke (a renewal that is
// scheduled, not in flight, goes now, and through the batcher with no
// slack left: the keeper flushes the batcher), or the batcher's answer,
// which step has read.
func (l *guardActor) woken() {
	if l.soon.Swap(false) && l.g.how == 0 && !l.retiring && !l.renewAt.IsZero() && !l.asking {
		l.renewAt = time.Time{}
		l.latest = time.Now()
		l.sendNow = true
	}
}

// fired acts on the timer: D has come (the guard is Lost unless a renewal
// was confirmed meanwhile), the next renewal is due, or both. While a
// renewal through the batcher is in flight, renewAt is when its answer,
// if it confirmed the lease, is read (step has read one that is there):
// an answer that is still missing then is asked to wake the actor when
// it comes.
func (l *guardActor) fired() {
	now := time.Now()
	if !l.watchD.IsZero() && !now.Before(l.watchD) {
		l.watchD = time.Time{}
		l.g.checkDeadline()
	}
	if !l.renewAt.IsZero() && !now.Before(l.renewAt) {
		l.renewAt = time.Time{}
		switch {
		case !l.asking:
			l.sendNow = true
		case l.batcher.louden(&l.req):
			// The answer came just now, quietly.
			l.answered()
		}
	}
}

// arm arms the timer for the earlier of renewAt and watchD, or stops it
// when neither is set; a timer armed for that moment already is left be.
func (l *guardActor) arm() {
	next := l.renewAt
	if !l.watchD.IsZero() && (next.IsZero() || l.watchD.Before(next)) {
		next = l.watchD
	}
	switch {
	case next.IsZero():
		if l.timerC != nil {
			l.timer.Stop()
			l.timerC = nil
		}
	case l.timerC == nil || !next.Equal(l.armedAt):
		l.timer.Reset(time.Until(next))
		l.timerC, l.armedAt = l.timer.C, next
	}
}

// exited is the actor's last step: the keeper's watch ends with the
// guard, or with its final loss (retire left it already). It does not
// wait: the batcher belongs to the client's session, and what stops a
// keeper or a session, which may wait for the server, runs in the
// background, where Settle waits for it.
func (l *guardActor) exited() {
	if !l.retired {
		l.g.leaveKeeper()
	}
	if l.endRenewals != nil {
		l.endRenewals()
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
		l.lone = false
		l.renewed(m.sent, m.at, m.r, m.err)
	case downgradedMsg:
		l.downgraded(m)
	case deletedMsg:
		l.deleting = false
		g.finishDelete()
		l.exit = true
	}
}

// renewed acts on the answer, which came at at, to a renewal sent at sent,
// alone or in a batch: the next renewal is scheduled, or the loss is
// final.
func (l *guardActor) renewed(sent, at time.Time, r lease.Renewal, err error) {
	g := l.g
	if g.how != 0 {
		l.afterBegin()
		return
	}
	if l.retiring {
		// The loss became final while this renewal was in flight (a
		// refused Downgrade): its answer, from a script that ran before
		// the refusal, must not make the guard Acquired again (L4). It is
		// dropped.
		l.retire()
		return
	}
	next, final := g.renewed(sent, at, r, err)
	if final {
		l.retire()
		return
	}
	l.renewIn(next)
	l.armDeadline()
}

// renewIn schedules the next renewal d from now. Through the batcher, the
// timer fires a little earlier (the slack of the renewal period, or at
// once when less than that is left: a retry, the first renewal, whose
// timer took the slack already) and asks for the renewal to be sent by d
// from now: it goes then, or earlier with the renewals of other guards
// that are due within their own slack. A renewal due now is asked for at
// once, without a timer's round trip.
func (l *guardActor) renewIn(d time.Duration) {
	e := l.g.e
	if l.batcher == nil && l.g.hold.batchable() && l.g.keeper != nil {
		l.joinBatcher()
	}
	if l.batcher != nil {
		l.latest = time.Now().Add(d)
		d -= min(max(d, 0), renewSlack(renewAfter(e.ttl)))
	}
	if d <= 0 {
		l.sendNow = true
		return
	}
	l.renewAt = time.Now().Add(d)
}

// sendDue sends the renewal that is due now, if one is (sendNow), once
// the step that found it due has returned: the calls a renewal makes (the
// batcher's ask, its heap) then stack on the loop's frame alone, not on
// the calls that found it due, so that the goroutine's stack stays at the
// runtime's smallest.
func (l *guardActor) sendDue() {
	if l.sendNow {
		l.sendNow = false
		l.renew()
	}
}

// joinBatcher has the guard renew through its client's batcher from now
// on, if the client's session has one for it. (A set's renewals go as
// batches of their own, one per group.)
//
//go:noinline
func (l *guardActor) joinBatcher() {
	e := l.g.e
	if l.batcher = l.g.keeper.s.batcherFor(e); l.batcher != nil {
		l.req = l.batcher.newAsk(&e.keys, l.g.value, e.ttl, l.wake)
		l.req.moved, l.req.base = &l.g.moved, l.g.acquired
	}
}

// renew sends one renewal: through the batcher, as an ask whose answer
// the batcher writes into it; otherwise in a child, whose answer comes on
// the mailbox. The batcher wakes the actor for an answer at once, but for
// one that confirms in time the lease of a guard that is Acquired (nearly
// every answer): that one moves D on and changes nothing else, so the
// batcher publishes the new D itself (in Guard.moved, which State and
// Deadline read, see Guard.vouched), and the actor reads the answer when
// it next wakes anyway, a renewal period after the send, when the next
// renewal is due (or at D, if it watches a deadline that comes first).
// One wake-up per renewal, not two. Whatever else wakes the actor in
// between reads the answer first (see step), so that the actor never
// decides on a deadline older than what the batcher confirmed. The call's deadline is the lease deadline while
// the lease is held (L1: no call for a held lock outlives D; the batcher
// keeps it itself, see batcher.go, "Deadlines"), and one renewal period
// when it is Lost. A lease whose deadline has passed before the deadline
// timer said so gets a call that fails at once, and the answer makes the
// guard Lost, as the timer would.
func (l *guardActor) renew() {
	g := l.g
	e := g.e
	state, d := g.vouched()
	sent := time.Now()
	dl := sent.Add(renewAfter(e.ttl))
	if state == Acquired {
		dl = d
	}
	if l.batcher != nil {
		l.asking = true
		quiet := state == Acquired
		l.batcher.ask(&l.req, dl, l.latest, sent, quiet)
		if quiet {
			// When the next renewal's timer would fire if the batch went
			// at latest; it went then or earlier, and renewIn then asks
			// at once for a renewal due within the slack. Guards that
			// shared a batch ask together again from the next round on
			// (their asks' latest is the batch's send time plus a period).
			period := renewAfter(e.ttl)
			l.renewAt = l.latest.Add(period - renewSlack(period))
		}
		return
	}
	l.renewAlone(sent, dl)
}

// renewAlone sends one renewal, sent at sent with the call's deadline dl,
// in a child.
//
//go:noinline
func (l *guardActor) renewAlone(sent, dl time.Time) {
	g := l.g
	e := g.e
	if l.ended == nil {
		l.ended, l.endRenewals = context.WithCancel(context.Background())
	}
	l.lone = true
	ended := l.ended
	l.a.Go(func(actx context.Context) {
		ctx, cancel := context.WithDeadline(ended, dl)
		r, err := g.hold.renew(ctx, g.value, e.ttl)
		cancel()
		_ = l.a.Send(actx, renewedMsg{sent: sent, at: time.Now(), r: r, err: err})
	})
}

// stopRenewing stops the renewals for good, at the guard's end or its
// final loss: the timer, an ask pending in the batcher (dropped: its
// answer, if one comes, is stale), and a lone renewal in flight
// (cancelled: its answer still comes, and lone stays set until then).
func (l *guardActor) stopRenewing() {
	l.renewAt, l.sendNow = time.Time{}, false
	if l.asking {
		l.batcher.drop(&l.req)
		l.asking = false
	}
	if l.lone {
		l.endRenewals()
	}
}

// armDeadline has the actor watch D while the guard is Acquired, so that
// it turns Lost at D even while a renewal is still in flight: not every
// client ends a call at its deadline (go-redis waits out its ReadTimeout,
// and retries), and a dial may not watch it. The loop arms the timer.
func (l *guardActor) armDeadline() {
	l.watchD = time.Time{}
	if state, d := l.g.vouched(); state == Acquired {
		l.watchD = d
	}
}

// begin begins the guard's end: State reports Released, the context is
// cancelled, and whatever is in flight is cancelled; the end's last step
// comes once it has answered (afterBegin).
func (l *guardActor) begin(how endHow) {
	l.g.begin(how)
	l.watchD = time.Time{}
	l.stopRenewing()
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
	if l.lone || l.cancelDowngrade != nil || l.deleting {
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
	l.stopRenewing()
	if l.lone {
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
	// The keeper's watch ends here, while the guard is still the actor's.
	g.leaveKeeper()
	// What the guard may still hold goes back now, in the background
	// (see holding.giveUp).
	g.hold.giveUp(g.value, g.void, g.leaseEnd())
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
		d := e.store.(downgrader) // Guard.Downgrade checked it
		_, dl := g.vouched()      // L1: no call for a held lock outlives D
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
		deliverPasses(e, m.passes, m.sent)
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
	g.ended()
}

// confirm records a write of ttl, sent at sent, that Redis confirmed: the
// deadline moves on, and a Lost guard is Acquired again.
func (g *Guard) confirm(sent time.Time, ttl time.Duration) {
	g.lastSent, g.leaseTTL = sent, ttl
	g.renewErr = nil
	g.retry.reset()
	d := leaseDeadline(sent, ttl)
	prev := g.pub.st.Load()
	if prev.state != Lost {
		g.extend(d)
		return
	}
	g.regain(&status{state: Acquired, since: prev.since, deadline: d})
}

// extend publishes the deadline d that a renewal of an Acquired guard
// confirmed: apply's one shortcut. Nothing else changes (no transition, no
// event, no cause), so none of apply's order is at stake; d goes where the
// batcher publishes the confirmations it does not wake the actor for
// (Guard.moved, see Guard.vouched), and a renewal allocates no status.
func (g *Guard) extend(d time.Time) { g.moved.Store(int64(d.Sub(g.acquired))) }

// regain publishes a Lost guard's return to Acquired.
//
//go:noinline
func (g *Guard) regain(next *status) {
	next.since = time.Now()
	g.apply(change{next: next, ev: Event{State: Acquired, Time: next.since}, emit: true, from: Lost})
	g.logger().Info("distlock: lock regained")
}

// lose moves an Acquired guard to Lost for cause; the deadline it had is
// kept. The first loss cancels the guard's context.
func (g *Guard) lose(cause *LostError) {
	state, d := g.vouched()
	if state != Acquired {
		return
	}
	now := time.Now()
	g.apply(change{next: &status{state: Lost, since: now, deadline: d, err: cause}, cause: cause,
		ev: Event{State: Lost, Time: now, Err: cause}, emit: true, from: Acquired})
	g.logger().Warn("distlock: lock lost", "reason", cause.Reason.String(), "err", cause)
}

// checkDeadline marks the guard Lost if its deadline has passed: because
// renewals failed up to it (the last failure says why), or because none
// was confirmed in time.
func (g *Guard) checkDeadline() {
	if state, d := g.vouched(); state == Acquired && !time.Now().Before(d) {
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
func (g *Guard) renewed(sent, at time.Time, r lease.Renewal, err error) (next time.Duration, final bool) {
	ttl := g.e.ttl
	if err != nil || !r.OK || g.void && g.pub.st.Load().state == Lost || !at.Before(leaseDeadline(sent, ttl)) {
		return g.notConfirmed(sent, at, r, err)
	}
	g.observeRenew(sent, at, nil)
	g.confirm(sent, ttl)
	if g.e.debug() {
		g.debugRenewed()
	}
	return sent.Add(renewAfter(ttl)).Sub(time.Now()), false
}

// observeRenew tells the Observer of the answer, which came at at, to a
// renewal sent at sent; err is its failure, if any. (Kept out of line with
// every rare path of renewed: a renewal's frames stay small.)
//
//go:noinline
func (g *Guard) observeRenew(sent, at time.Time, err error) {
	e := g.e
	e.obs.ObserveRenew(RenewInfo{Key: e.keys.Lease, Kind: e.kind, Mode: g.mode().String(), Token: g.token,
		Latency: at.Sub(sent), Sent: sent, Err: err})
}

//go:noinline
func (g *Guard) debugRenewed() {
	g.logger().Debug("distlock: renewed", "deadline_in", time.Until(g.Deadline()))
}

// notConfirmed is renewed for an answer that confirmed nothing that
// counts: a failure, a refusal, a value that no longer proves the lease
// was ours throughout, or a confirmation that came too late.
//
//go:noinline
func (g *Guard) notConfirmed(sent, at time.Time, r lease.Renewal, err error) (next time.Duration, final bool) {
	e := g.e
	ttl := e.ttl
	now := time.Now()
	var refused *LostError
	infoErr := err
	if err == nil && !r.OK {
		refused = &LostError{Key: g.hold.refusedKey(), Reason: LostRefused, Holder: lease.Owner(r.Holder)}
		infoErr = refused
	}
	g.observeRenew(sent, at, infoErr)
	state, deadline := g.vouched()
	switch {
	case err != nil && state == Acquired && now.Before(deadline):
		g.renewErr = err
		pause := g.retry.next()
		if left := deadline.Sub(now); pause >= left {
			// No retry can be sent before the deadline: the guard is
			// Lost then (see armDeadline).
			pause = left
		}
		rerr := &RenewError{Key: e.keys.Lease, Err: err, Deadline: deadline, Retry: pause}
		g.apply(change{ev: Event{State: Acquired, Time: now, Err: rerr}, emit: true, from: Acquired})
		g.logger().Warn("distlock: renewal failed; the lease still holds, retrying",
			"err", err, "deadline_in", deadline.Sub(now), "retry_in", pause)
		return pause, false
	case err != nil:
		cause := &LostError{Key: e.keys.Lease, Reason: LostRenewFailed, Err: err}
		if errors.Is(err, context.DeadlineExceeded) && state == Acquired {
			// A renewal still in flight at the deadline: Lost for the
			// failures before it, if there were any, or for the deadline.
			if g.renewErr != nil {
				cause.Err = g.renewErr
			} else {
				cause.Reason = LostDeadline
			}
		}
		if e.debug() {
			g.logger().Debug("distlock: renewal failed", "err", err, "took", at.Sub(sent))
		}
		g.lose(cause)
		// A Lost guard keeps trying: a renewal that finds the key still
		// holding its value regains it.
		return lostRetry(ttl), false
	case !r.OK:
		if e.debug() {
			g.logger().Debug("distlock: renewal refused", "holder", r.Holder)
		}
		g.lose(refused)
		return 0, true
	case state == Lost && g.void:
		// The key holds this acquisition's value again, but a call of
		// the acquisition whose outcome it never saw may have reached
		// Redis late and granted the value anew after another holder
		// (lease/doc.go, "A grant is its acquisition's"): the value no
		// longer proves that nobody held the lock in between (L4). The
		// loss is final, and retire cancels the value.
		if e.debug() {
			g.logger().Debug("distlock: a renewal found the value again, but the acquisition has a call whose outcome it never saw; the loss is final")
		}
		return 0, true
	}
	// Confirmed, but too late to count (it came at or after the deadline
	// it would have set): the lease may already be gone by the time we
	// could act on it.
	g.lose(&LostError{Key: e.keys.Lease, Reason: LostDeadline})
	return 0, false
}
