package distlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distkit-go/distlock/actor"
	"github.com/distkit-go/distlock/lease"
)

// A Guard is one held acquisition: of a [Mutex] (returned by Lock, TryLock
// and TryLockFor), of a permit of a [Semaphore] (Acquire, TryAcquire,
// TryAcquireFor), of a term of an [Election] (Campaign), of an [RWMutex]
// (RLock and Lock, and their Try forms; see [Guard.Downgrade]) or of every
// name of a [MultiMutex] (Lock, TryLock, TryLockFor; see [Guard.TokenOf]).
// It stays valid until it is released.
//
// A guard renews the lease every TTL/3, watches the lease deadline and
// publishes what it learns, from a goroutine of its own, its actor, which
// starts when the first renewal is due (a third of the TTL after the
// acquisition) and runs until the guard ends. Before then the guard has no
// goroutine at all, only a timer, so a short hold costs none. The
// renewals stop when the guard is released, by [Guard.Release], by
// [Guard.Leave] or by the cancellation of the context given to Lock, and
// when Redis refuses a renewal (the lease is someone else's or gone, so
// there is nothing left to renew); the actor then exits. Until then they
// go on, so a guard that is neither released nor cancelled holds the lock
// for as long as the process lives.
//
// All methods are safe for concurrent use. Only Release, Leave and
// Downgrade wait; the others answer from the guard's memory at once.
//
// A nil *Guard, which every call that returns a guard returns with its
// error, holds nothing, and its methods do not panic: Release and Leave
// return the zero State and an [*ArgumentError] matching
// [ErrInvalidArgument], so a "defer g.Release(ctx)" written before the
// error check is harmless; State is 0, Deadline zero, Done closed, Context
// cancelled with that error as its cause, and Subscribe's channel holds
// one event with that error.
type Guard struct {
	e        *engine
	value    string
	token    int64
	attempt  int
	void     bool            // release with Cancel: a lost call with value may still reach Redis
	lockCtx  context.Context // the context given to Lock
	acquired time.Time
	// done is Done's channel, made when first asked for; finish closes it,
	// or stores closedChan when nobody has asked (see ended). Under doneMu.
	doneMu sync.Mutex
	done   chan struct{}

	// owner is who owns the guard's state (the fields from how to final):
	// nil while nobody does (before the first renewal is due), the guard's
	// actor from then on, or one of the marks ending and retired. It
	// changes only by a compare-and-swap, so that exactly one goroutine
	// owns the guard at any time (see "Who owns a guard" in guardactor.go).
	owner atomic.Pointer[guardActor]

	// how is how the guard ends, once its end has begun; 0 until then.
	// endFrom is the state it was in at that moment.
	how     endHow
	endFrom State
	// The last write Redis confirmed: its send time and the TTL it set
	// (the claim window for a lease passed to a waiter, until its first
	// renewal).
	lastSent time.Time
	leaseTTL time.Duration
	// renewal activates the actor when the first renewal is due (see "Who
	// owns a guard"). The keeper's watch sets it, with g.keeper, under the
	// keeper's lock, before anyone else can see the guard; the timer's own
	// run does not read it. unwatch stops the watch on the Lock context
	// while no actor runs.
	renewal *time.Timer
	unwatch func() bool
	// keeper is the keeper of the client's session that watches the guard
	// from its acquisition until its end or its final loss (keeper.go).
	keeper *keeper
	// The retries of renewals that failed while the lease held: their
	// pause, and the last failure (the cause of a loss at the deadline,
	// until a renewal is confirmed).
	retry    backoff
	renewErr error
	// deleting is what the tries of the final delete have learnt so far
	// (an owner of the end may hand them over to an actor).
	deleting deletion
	// final is written by finish before done is closed, and read only
	// after that.
	final outcome
	// downgraded: a Downgrade made this write hold of an RWMutex a read
	// hold. Written by the actor, read by mode from any goroutine.
	downgraded atomic.Bool
	// moved is the lease deadline that the last renewal confirmed, as
	// nanoseconds after acquired (0: none yet): the actor's owner stores
	// it (Guard.extend), and the batcher too, for a confirmation it does
	// not wake the actor for (see guardActor.renew). Only vouched reads
	// it.
	moved atomic.Int64

	// pub is what the guard shows to every goroutine: its status, its
	// context and its subscriptions.
	pub signals

	// hold is what the guard holds: its engine's lease, or for a
	// MultiMutex's guard every name (see hold.go).
	hold holding
}

// endHow says how a guard ends.
type endHow int8

const (
	endRelease endHow = 1 // delete the lease (Release, or the Lock context ended)
	endLeave   endHow = 2 // stop renewing and keep the lease until it expires
)

// outcome is how the guard ended.
type outcome struct {
	state State // Released, or Lost if the lease had slipped before release
	err   error // the release's Redis error, if any
}

// ReleaseTimeout bounds how long [Guard.Release] and [Guard.Leave] wait when
// their context has no deadline, such as the context.WithoutCancel(ctx) of
// a deferred Release. A release is one round trip, a few milliseconds on a
// healthy Redis; two seconds is far beyond that, yet short enough that a
// process shutting down with Redis unreachable is not held up for the
// whole TTL (30 s by default) by each deferred Release. Once it has passed,
// Release returns an error matching [context.DeadlineExceeded] while the
// delete goes on in the background until the lease ends, as [Guard.Done]
// reports; if the process exits first, the lease expires on its own. Give
// Release a context with a deadline to wait longer or shorter.
const ReleaseTimeout = 2 * time.Second

// newGuard makes the guard of a lease acquired with value and token, for
// ttl, by a write sent at sent or after it (see acquirer.granted). lockCtx
// is the context given to Lock: the guard's context derives from it, and
// its end releases the guard. void makes the release cancel value rather
// than only delete the lease: a call with value whose reply was lost may
// still reach Redis, and must not find value welcome.
//
// The guard starts without a goroutine: a timer activates its actor when
// the first renewal is due, the Lock context is watched with
// context.AfterFunc, and the client's keeper watches for a restart.
func (e *engine) newGuard(lockCtx context.Context, value string, token int64, attempt int, sent time.Time, ttl time.Duration, void bool) *Guard {
	return e.newGuardOf(lockCtx, value, token, attempt, sent, ttl, void, e)
}

// newGuardOf is newGuard for a guard that holds hold: e's lease (hold is
// e), or the names of a MultiMutex (hold is its set's, e its first name's
// engine).
func (e *engine) newGuardOf(lockCtx context.Context, value string, token int64, attempt int, sent time.Time, ttl time.Duration, void bool, hold holding) *Guard {
	now := time.Now()
	g := &Guard{e: e, value: value, token: token, attempt: attempt, void: void, lockCtx: lockCtx, acquired: now,
		lastSent: sent, leaseTTL: ttl, hold: hold}
	g.pub.first = status{state: Acquired, since: now, deadline: leaseDeadline(sent, ttl)}
	g.pub.st.Store(&g.pub.first)
	if e.debug() {
		g.logger().Debug("distlock: acquired", "attempt", attempt)
	}
	var slack time.Duration
	if hold.batchable() {
		slack = e.renewSlack(renewAfter(ttl))
	}
	// A keeper of the client's session watches the guard from now on, so
	// that a restart of an empty server is noticed before the first
	// renewal too (keeper.go); it sets the watch on the Lock context and
	// arms the timer.
	proc.sessions.watch(g, sent.Add(renewAfter(ttl)-slack).Sub(now))
	return g
}

// Key returns the Redis key that holds the lease: for a [MultiMutex]'s
// guard, the key of the first name given.
func (g *Guard) Key() string {
	if g == nil {
		return ""
	}
	return g.e.keys.Lease
}

// Token returns the fencing token of this acquisition: an integer strictly
// greater than the token of every earlier acquisition of the same lock. Pass
// it with every write the lock protects, and have the resource reject a write
// whose token is lower than the highest it has accepted; that is what keeps a
// holder that was paused past its lease from doing damage. For a
// [MultiMutex]'s guard it is the token of the first name given; each
// name's is [Guard.TokenOf].
func (g *Guard) Token() int64 {
	if g == nil {
		return 0
	}
	return g.token
}

// Attempt returns how many calls to Redis the acquisition made before its
// last one: 0 if the first try succeeded. For a Lock that waited in line,
// the calls are the one that put it in line and each refresh of its place;
// when a release passed it the lock, its last call is the last refresh
// before the pass.
func (g *Guard) Attempt() int {
	if g == nil {
		return 0
	}
	return g.attempt
}

// State reports the guard's state now. It does not call Redis: it reads the
// result of the last renewal and checks the lease deadline against the clock,
// so it reports Lost as soon as the deadline has passed, even if no timer
// has fired yet. It reports Released from the moment the guard's end begins
// (Release or Leave is called, or the Lock context is cancelled), before any
// delete is sent: once the delete reaches Redis another client may acquire
// the lock at once, and the guard must not still claim it. After that it
// never reports Acquired again.
func (g *Guard) State() State {
	if g == nil {
		return 0
	}
	state, deadline := g.vouched()
	if state == Acquired && !time.Now().Before(deadline) {
		return Lost
	}
	return state
}

// vouched returns the guard's state as its owner published it and, while
// it is Acquired, the deadline it vouches for: the published one (of the
// acquisition, or of the last regain), or a later one that a renewal
// confirmed since (Guard.moved), which the batcher may have published
// before the actor read the answer. Only the owner changes the state: a
// confirmation moves the deadline, nothing else.
func (g *Guard) vouched() (State, time.Time) {
	s := g.pub.st.Load()
	d := s.deadline
	if s.state == Acquired {
		if m := g.moved.Load(); m != 0 {
			if md := g.acquired.Add(time.Duration(m)); md.After(d) {
				d = md
			}
		}
	}
	return s.state, d
}

// Deadline returns until when the guard vouches for the lease: the local
// lease deadline, counted from the send time of the last write Redis
// confirmed plus the TTL minus the safety margin, which each renewal moves
// on. State reports Acquired exactly while the clock is before it, so a
// step that must finish under the lock fits if time.Until(g.Deadline())
// exceeds the step's duration (renewals normally keep moving it, but only a
// renewal that has been confirmed counts). A lock passed to a waiting Lock
// by a release starts with only its claim window ([WithClaimWindow]) until
// its first renewal, a third of the window in, extends it to the full TTL:
// check Deadline before each step, not once after Lock. The time carries a
// monotonic clock reading, so wall-clock changes do not affect time.Until.
//
// Deadline returns the zero Time whenever the guard does not vouch for the
// lease: when it is Lost, and from the moment its end begins (it is
// Released). It does not call Redis.
func (g *Guard) Deadline() time.Time {
	if g == nil {
		return time.Time{}
	}
	state, deadline := g.vouched()
	if state != Acquired || !time.Now().Before(deadline) {
		return time.Time{}
	}
	return deadline
}

// Done returns a channel that is closed once the guard has ended (released
// or left), its final delete, if any, has its answer, and its actor, if it
// had one, has stopped renewing.
func (g *Guard) Done() <-chan struct{} {
	if g == nil {
		return closedChan
	}
	g.doneMu.Lock()
	defer g.doneMu.Unlock()
	if g.done == nil {
		g.done = make(chan struct{})
	}
	return g.done
}

// closedChan is the Done channel of every guard that ended before anyone
// asked for it (a Release that ends a guard on its own goroutine makes
// none), and of a nil *Guard, which holds nothing to wait for.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// ended closes the guard's Done channel, or, if nobody has asked for it
// yet, has Done return closedChan from now on. It is called once, by
// finish.
func (g *Guard) ended() {
	g.doneMu.Lock()
	defer g.doneMu.Unlock()
	if g.done == nil {
		g.done = closedChan
		return
	}
	close(g.done)
}

// Context returns a context for the critical section. It is derived from the
// context given to Lock, so it carries that context's values, and it is
// cancelled at the first Lost (with a cause matching [ErrLost]), when the
// guard's end begins (with cause [ErrReleased]: as soon as Release or Leave
// is called, before either returns), or when the Lock context is cancelled
// (with that context's cause). Read the cause with
// [context.Cause]. It is never un-cancelled: a guard that regains its lease
// after Lost still reports a cancelled context, because the work that ran in
// between was not protected.
func (g *Guard) Context() context.Context {
	if g == nil {
		return nilGuardContext()
	}
	return g.pub.context(g.lockCtx)
}

// Subscribe returns a channel of the guard's states. The first event is the
// state at the time of the call; each later event is a transition, or the
// report of a renewal that failed while the lease still held (State
// Acquired, Err a [*RenewError]: nothing has changed yet, and the guard
// retries; see the package documentation, "Renewal and loss"). After the
// Released event, or once ctx is done, the channel is closed.
//
// Subscribe does not wait on Redis or on the guard's actor: it answers at
// once, even while a renewal or the final delete is in flight.
//
// The channel is never written to in a way that blocks: it buffers four
// events and, when a reader falls further behind, the oldest buffered event
// is dropped to make room. A slow reader may therefore miss intermediate
// transitions (such as a brief Lost and Acquired) but always receives the
// newest state, and always receives Released before the channel closes. For
// a fact that cannot be missed, use [Guard.Done] or [Guard.Context].
//
// Subscribing to a guard whose end has begun returns a channel that
// receives only the final Released event, once the release has its answer
// (at once if it has already ended), and is then closed; a subscription
// never reports Acquired after Release or Leave was called. Subscribing with
// a ctx that is already done returns a closed channel. A nil ctx is refused
// as Release refuses it: the channel holds one event, whose Err is an
// [*ArgumentError] matching [ErrInvalidArgument], and is closed.
func (g *Guard) Subscribe(ctx context.Context) <-chan Event {
	ch := make(chan Event, subscriberBuffer)
	if g == nil || ctx == nil {
		ch <- Event{State: g.State(), Time: time.Now(), Err: refusedSubscription(g)}
		close(ch)
		return ch
	}
	if ctx.Err() != nil {
		close(ch)
		return ch
	}
	g.pub.subscribe(ctx, ch)
	return ch
}

// Release ends the guard and deletes its lease. It stops the renewals,
// waits for one in flight, and deletes the lease if it still holds this
// acquisition's value (never another holder's). From the moment it is
// called, State reports Released and the guard's context is cancelled with
// cause [ErrReleased]. When the context is one that cannot be cancelled,
// such as context.WithoutCancel(ctx), and the guard has no actor yet, the
// delete is sent from the calling goroutine; otherwise the guard's actor
// sends it and Release waits for it.
//
// It returns Released when the lease was held until it was deleted, and Lost
// when it had already slipped (the guard was Lost, or the key no longer held
// this acquisition's value). A guard whose renewal Redis refused has
// nothing left in Redis to delete: Release returns Lost at once, without
// sending anything. A delete that gets no reply (a reset connection, a
// refused dial) may not have run, so it is sent again after a pause that
// grows from 10 ms to 200 ms, while the wait and the lease last; Release
// returns Released and no error as soon as one is confirmed. An error that
// Redis answered with is returned wrapped alongside the state, as is the
// last failure when no try was confirmed in time; the lease then expires
// on its own within the TTL.
//
// ctx bounds the wait, not the release. If ctx has no deadline, Release
// waits at most [ReleaseTimeout]; the delete itself never waits past the
// end of the lease, since the key is gone by then anyway. If ctx ends (or
// ReleaseTimeout passes) first, Release returns Released and an error
// matching ctx.Err() (context.DeadlineExceeded for ReleaseTimeout); the
// release goes on in the background and [Guard.Done] reports its end. This
// holds on every path, also when the guard's actor is held up (an
// [Observer] that blocks, a starved process) and has not yet taken the
// end when ctx ends: the end is then handed to the background, and State
// and the guard's context report it once the actor takes it. So
// the usual deferred call
//
//	defer g.Release(context.WithoutCancel(ctx))
//
// keeps ctx's values, ignores its cancellation and returns within
// ReleaseTimeout even when Redis is unreachable (unless rueidis is, at that
// moment, establishing the connection for another call: then the delete
// waits for that attempt, which rueidis bounds by its dial timeout).
//
// Calling Release again, or after Leave or the cancellation of the Lock
// context, is harmless: whichever came first decides how the guard ends,
// and Release waits for that end and returns its result (the same state
// and error as the first call, once the end has its answer). A nil ctx is
// refused with an error matching [ErrInvalidArgument] (an
// [*ArgumentError]), and the guard is left as it was.
func (g *Guard) Release(ctx context.Context) (State, error) {
	if g == nil {
		return 0, errNilGuard()
	}
	if ctx == nil {
		return g.State(), badArgument("ctx", "is nil")
	}
	bound := waitBound(ctx)
	g.end(endRelease, ctx, bound, false)
	return g.wait(ctx, bound, "releasing")
}

// Leave ends the guard without deleting its lease: it stops the renewals,
// waits for one in flight to return, and sends nothing to Redis. The key
// keeps this acquisition's value until it expires, at the end of the lease
// as Redis counts it: one TTL after the last renewal was sent, so between
// two thirds of a TTL and a whole TTL after Leave. Until then nobody can
// acquire the lock; a waiter of this process, or elsewhere, acquires it
// once the key has expired.
//
// Leave is for work that must run at most once per period even when its
// replicas start seconds apart: take the lock with TryLock and a TTL a
// little shorter than the period, do the work, and Leave. Replicas that
// start later in the period find the lock held and skip. A process that
// crashes keeps the lock just as long; one that calls Release frees it at
// once.
//
// From the moment Leave is called the guard reports Released (State,
// Deadline, events) and its context is cancelled with cause
// [ErrReleased], and after Leave returns no command of this guard reaches
// Redis. It returns Released if the lease was held when Leave was called,
// and Lost if it had already slipped; in neither case has it asked Redis.
// ctx bounds the wait as for [Guard.Release], including [ReleaseTimeout]
// when ctx has no deadline; the wait is normally short, since nothing is
// sent and a renewal in flight is cancelled. Calling Leave after Release, or
// after the Lock context was cancelled, waits for that release and returns
// its result. A nil ctx is refused with an error matching
// [ErrInvalidArgument], and the guard is left as it was.
func (g *Guard) Leave(ctx context.Context) (State, error) {
	if g == nil {
		return 0, errNilGuard()
	}
	if ctx == nil {
		return g.State(), badArgument("ctx", "is nil")
	}
	bound := waitBound(ctx)
	g.end(endLeave, ctx, bound, false)
	return g.wait(ctx, bound, "leaving")
}

// lockCtxEnded is the watch on the Lock context while no actor runs (an
// actor watches it itself): its end releases the guard, as Release would,
// from the goroutine that context.AfterFunc starts.
func (g *Guard) lockCtxEnded() {
	g.end(endRelease, context.WithoutCancel(g.lockCtx), time.Time{}, true)
}

// warnLockDeadline logs at Warn that the Lock context's deadline has ended
// the hold: it is usually a timeout meant for the wait alone (the habit of
// libraries whose lock outlives the context it was taken with), and the
// work under the lock is cut short.
func (g *Guard) warnLockDeadline() {
	if errors.Is(g.lockCtx.Err(), context.DeadlineExceeded) {
		g.logger().Warn("distlock: the deadline of the context given to Lock has ended the hold; releasing the lock "+
			"(to bound only the wait, use WithMaxWait or TryLockFor)", "held", time.Since(g.acquired))
	}
}

// end begins the guard's end as how says, unless it has begun already,
// and sees that the rest of it is done. Whoever owns the guard makes the
// end: its actor, when it has one (end asks it on its mailbox, and the
// actor answers at once, its loop never waiting on Redis; end waits for
// the answer only until ctx ends or bound passes, see tell); otherwise the caller,
// which claims the guard first, in one compare-and-swap, so that a timer
// that would activate the actor finds it taken.
//
// The owner moves one way only (nil → actor → retired → ending, with
// steps skipped), so end reads it at most three times and never loops: a
// claim that fails finds the actor that took the guard, and an actor that
// stopped before it took the message stored its successor first.
//
// A caller that claims the guard takes the end's last step itself, on its
// own goroutine (endClaimed). byWatch says the caller is the watch on the
// Lock context.
func (g *Guard) end(how endHow, ctx context.Context, bound time.Time, byWatch bool) {
	a := g.owner.Load()
	if a == nil {
		if g.owner.CompareAndSwap(nil, ending) {
			g.endClaimed(how, ctx, bound, byWatch, false)
			return
		}
		a = g.owner.Load() // the timer made it an actor, or another end claimed it
	}
	if a != ending && a != retired {
		err := g.tell(a, how, ctx, bound)
		if err == nil {
			return
		}
		if !errors.Is(err, actor.ErrStopped) {
			// The caller's wait is over before the actor answered (it is
			// held up: an Observer that blocks, a starved process). The
			// end still comes: a goroutine of the process's background
			// work, which Settle waits for, tells the actor with no bound
			// and returns once it has answered or stopped; a second end
			// message is answered at once, so it does not matter whether
			// the actor took this one.
			proc.goWork(func() {
				defer proc.work.done()
				g.end(how, context.WithoutCancel(ctx), time.Time{}, byWatch)
			})
			return
		}
		a = g.owner.Load() // it stopped: ending, or retired
	}
	if a == retired && g.owner.CompareAndSwap(retired, ending) {
		g.endClaimed(how, ctx, bound, byWatch, true)
	}
}

// tell asks the guard's actor a to begin the end as how says, and waits
// for its answer until ctx ends or bound passes (zero: until ctx ends). It
// returns nil once the actor has begun the end, [actor.ErrStopped] when
// the actor stopped before, and an error matching context.DeadlineExceeded
// or ctx.Err() when the wait ended first.
func (g *Guard) tell(a *guardActor, how endHow, ctx context.Context, bound time.Time) error {
	if _, ok := ctx.Deadline(); !ok && !bound.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, bound)
		defer cancel()
	}
	_, err := actor.Call(ctx, a.a, func(r actor.Reply[struct{}]) guardMsg {
		return endMsg{how: how, reply: r}
	})
	return err
}

// endClaimed makes the end of a guard that the caller has claimed (owner
// ending), from a young guard or a retired one: nothing to send for
// Leave, or for a guard whose renewal was refused, and otherwise the final
// delete, tried until bound (zero: the end of the lease). A Release whose
// ctx can end must not wait on the delete past it, so it hands the delete
// to a new actor (handOver), which sends nothing else.
func (g *Guard) endClaimed(how endHow, ctx context.Context, bound time.Time, byWatch, wasRetired bool) {
	if !byWatch {
		// (The watch leaves the timer be: the timer then finds the guard
		// taken.)
		g.renewal.Stop()
		if g.unwatch != nil {
			g.unwatch()
		}
	}
	g.leaveKeeper()
	g.begin(how)
	if byWatch {
		g.warnLockDeadline()
	}
	if how == endLeave || wasRetired {
		g.finish(releaseResult{})
		return
	}
	if ctx.Done() != nil {
		// The delete must be able to outlast ctx: an actor sends it, and
		// only it (the end has begun: no renewal).
		g.handOver()
		return
	}
	g.deleteLease(ctx, bound)
}

// deleteLease sends the final delete from the goroutine that owns the
// guard's end, until it has an answer or bound passes (zero: until the
// lease ends), and records the end. When bound passes first with the lease
// still running, an actor takes over the tries, and the guard ends when
// they have their answer.
func (g *Guard) deleteLease(ctx context.Context, bound time.Time) {
	leaseEnd := g.leaseEnd()
	dl := leaseEnd
	if !bound.IsZero() && bound.Before(dl) {
		dl = bound
	}
	g.sendDelete(ctx, dl)
	if !g.deleting.answered && dl.Before(leaseEnd) {
		// The caller's wait is over, the lease is not: hand the rest over.
		g.handOver()
		return
	}
	g.finishDelete()
}

// handOver gives the rest of the end, the final delete's tries, to a new
// actor: the caller owns the end (owner ending) and has begun it, so the
// actor starts at the delete (ending → actor).
func (g *Guard) handOver() {
	act := newGuardActor(g)
	g.owner.Store(act)
	go act.run()
}

// waitBound returns until when Release or Leave waits: ctx's deadline, or
// ReleaseTimeout from now when it has none.
func waitBound(ctx context.Context) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now().Add(ReleaseTimeout)
}

// errReleaseTimeout is the cause of the wait of a Release or Leave whose
// context had no deadline when ReleaseTimeout passed.
var errReleaseTimeout = fmt.Errorf("not done within distlock.ReleaseTimeout (%v); it goes on in the background until the lease ends", ReleaseTimeout)

// wait waits, as Release and Leave do, until the guard has ended, ctx is
// done or bound has passed, and returns how the guard ended. verb says what
// it was doing, for the error.
func (g *Guard) wait(ctx context.Context, bound time.Time, verb string) (State, error) {
	done := g.Done()
	select {
	case <-done:
		return g.final.state, g.final.err
	default:
	}
	var err, cause error
	if _, ok := ctx.Deadline(); ok {
		select {
		case <-done:
			return g.final.state, g.final.err
		case <-ctx.Done():
			err, cause = ctx.Err(), context.Cause(ctx)
		}
	} else {
		t := time.NewTimer(time.Until(bound))
		defer t.Stop()
		select {
		case <-done:
			return g.final.state, g.final.err
		case <-ctx.Done():
			err, cause = ctx.Err(), context.Cause(ctx)
		case <-t.C:
			err, cause = context.DeadlineExceeded, errReleaseTimeout
		}
	}
	if cause != nil && !errors.Is(cause, err) {
		return Released, fmt.Errorf("distlock: %s %s: %w: %w", verb, g.e.keys.Lease, err, cause)
	}
	return Released, fmt.Errorf("distlock: %s %s: %w", verb, g.e.keys.Lease, err)
}

// leaseEnd returns until when the final delete is worth sending: the end
// of the lease as Redis counts it, or minReleaseWait from now when that is
// sooner (a lease lost to a failed renewal may still hold our value, and
// deleting it frees the lock for the next holder at once).
func (g *Guard) leaseEnd() time.Time {
	end := g.lastSent.Add(g.leaseTTL)
	if floor := time.Now().Add(minReleaseWait); end.Before(floor) {
		return floor
	}
	return end
}

// releaseResult is the answer to the final delete.
type releaseResult struct {
	deleted bool
	err     error
	// unanswered: an earlier try got no reply, so it may be the one that
	// deleted the lease, and a later "not deleted" says nothing.
	unanswered bool
}

// deletion is what the tries of the final delete have learnt.
type deletion struct {
	tries
	deleted bool // the answered try deleted the lease
}

// sendDelete sends the final delete until Redis answers it or dl passes,
// going on from the tries made before: the conditional delete (or, for a
// guard whose acquisition left a call with its value unaccounted for, the
// cancel that also voids the value), which passes the lock to the next
// waiter in line. It is called by the owner of the guard's end.
func (g *Guard) sendDelete(ctx context.Context, dl time.Time) {
	d := &g.deleting
	untilAnswered(ctx, dl, &d.tries, func(ctx context.Context) error {
		r, err := g.hold.release(ctx, g.value, g.void)
		d.deleted = r.Deleted
		return err
	})
}

// finishDelete ends the guard with what the tries of the final delete
// learnt.
func (g *Guard) finishDelete() {
	d := g.deleting
	if d.answered {
		g.finish(releaseResult{deleted: d.deleted, err: d.err, unanswered: d.unanswered})
		return
	}
	err := d.err
	if errors.Is(err, context.DeadlineExceeded) {
		// The tries ran out of the lease, not the caller out of time: say
		// why they got no answer, not that a context ended.
		err = &noAnswerError{last: d.cause}
	}
	g.finish(releaseResult{err: err})
	// A renewal of ours that the path held back may still land, before
	// or after the deletes that got no answer, and keep the lease a full
	// TTL from its landing, which no reckoning of ours can bound: the
	// lock would then stay taken, with nobody holding it, after this
	// Release returned. So the delete goes on in the background, as the
	// cancel that also voids the value (a renewal landing after it is
	// refused), for a TTL more, and frees the lock as soon as the path
	// is back (TestHeldRenewalOutlivesNoRelease).
	g.hold.giveUp(g.value, true, time.Now().Add(g.leaseTTL))
}

// noAnswerError reports a final delete that got no answer from Redis
// before the lease ended; the lease expires on its own.
type noAnswerError struct{ last error }

func (e *noAnswerError) Error() string {
	if e.last != nil {
		return "no answer from Redis before the lease ended, the last try failed with: " + e.last.Error()
	}
	return "no answer from Redis before the lease ended"
}

// Unwrap returns the last failure of a try, if one failed before the lease
// ended.
func (e *noAnswerError) Unwrap() error { return e.last }

// maxReleaseRetry is the longest pause between two tries of the final
// delete: a released lock should be free again soon after the path is back.
const maxReleaseRetry = 200 * time.Millisecond

// logger returns the engine's logger with this guard's attributes.
func (g *Guard) logger() *slog.Logger {
	return g.e.logger().With("owner", lease.Owner(g.value), "token", g.token)
}
