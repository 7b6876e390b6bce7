package distlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distkit-go/distlock/actor"
)

// A Guard is one held acquisition: of a [Mutex] (returned by Lock, TryLock
// and TryLockFor), of a permit of a [Semaphore] (Acquire, TryAcquire,
// TryAcquireFor) or of a term of an [Election] (Campaign). It stays valid
// until it is released.
//
// Behind each Guard runs one goroutine, its actor, which renews the lease
// every TTL/3, watches the lease deadline, publishes state changes and, at
// the end, releases the lease. The actor exits when the guard is released,
// by [Guard.Release], by [Guard.Leave] or by the cancellation of the context
// given to Lock; until then it keeps renewing, so a guard that is neither
// released nor cancelled holds the lock for as long as the process lives.
//
// All methods are safe for concurrent use. Only Release and Leave wait on
// Redis; the others answer from the guard's own memory at once.
type Guard struct {
	key     string
	token   int64
	attempt int

	act  *actor.Actor[guardMsg]
	snap atomic.Pointer[snapshot] // written by the actor only
	// ending is how the guard is to end (endRelease or endLeave), once
	// Release, Leave or the Lock context's cancellation asked; the first
	// one decides. It is set before the actor is told, so that State and
	// the actor stop vouching for the lease from that moment.
	ending atomic.Int32

	// The guard's context is made on first use: most critical sections
	// never ask for it. ctxMu guards the three fields.
	ctxMu    sync.Mutex
	lockCtx  context.Context // the parent: the context given to Lock
	ctx      context.Context
	cancelFn context.CancelCauseFunc
	cause    error // why it was cancelled, if it was before it was made

	// final is written by the actor's loop before it returns, and read only
	// once it has (act.Done() is closed, or act.Send reports
	// actor.ErrStopped).
	final outcome
}

// snapshot is the state the actor publishes for State to read without a
// round trip through the mailbox. State checks deadline against the clock
// itself, so a late timer cannot make it report a lapsed lease as held.
type snapshot struct {
	state    State
	deadline time.Time // for Acquired: the local lease deadline D
}

// How a guard ends.
const (
	endRelease = 1 // delete the lease (Release, or the Lock context ended)
	endLeave   = 2 // stop renewing and keep the lease until it expires
)

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

// outcome is how the guard ended.
type outcome struct {
	state State // Released, or Lost if the lease had slipped before release
	err   error // the release's Redis error, if any
	event Event // the final Released event
}

// guardMsg is a message to a guard's actor: subscribe or unsubscribe.
type guardMsg interface{ isGuardMsg() }

type subscribeMsg struct {
	ctx   context.Context
	ch    chan Event
	reply actor.Reply[struct{}]
}

type unsubscribeMsg struct{ ch chan Event }

func (subscribeMsg) isGuardMsg()   {}
func (unsubscribeMsg) isGuardMsg() {}

// startGuard starts the actor for a lease acquired with value and token,
// for ttl, by a write sent at sent or after it (see acquirer.granted).
// lockCtx is the context given to Lock: the guard's context derives from it,
// and its cancellation releases the guard. void makes the release cancel
// value rather than only delete the lease: a call with value whose reply
// was lost may still reach Redis, and must not find value welcome.
func (m *Mutex) startGuard(lockCtx context.Context, value string, token int64, attempt int, sent time.Time, ttl time.Duration, void bool) *Guard {
	g := &Guard{key: m.keys.Lease, token: token, attempt: attempt, lockCtx: lockCtx}
	l := &leaseLoop{m: m, g: g, value: value, subs: make(subscribers), void: void}
	l.confirm(sent, ttl)
	l.state, l.since = Acquired, time.Now()
	l.acquired = l.since
	g.snap.Store(&snapshot{state: Acquired, deadline: l.deadline})
	if l.debug() {
		l.logger().Debug("distlock: acquired", "attempt", attempt)
	}
	g.act = actor.Start(l.run)
	return g
}

// Key returns the Redis key that holds the lease.
func (g *Guard) Key() string { return g.key }

// Token returns the fencing token of this acquisition: an integer strictly
// greater than the token of every earlier acquisition of the same lock. Pass
// it with every write the lock protects, and have the resource reject a write
// whose token is lower than the highest it has accepted; that is what keeps a
// holder that was paused past its lease from doing damage.
func (g *Guard) Token() int64 { return g.token }

// Attempt returns how many calls to Redis the acquisition made before its
// last one: 0 if the first try succeeded. For a Lock that waited in line,
// the calls are the one that put it in line and each refresh of its place;
// when a release passed it the lock, its last call is the last refresh
// before the pass.
func (g *Guard) Attempt() int { return g.attempt }

// State reports the guard's state now. It does not call Redis: it reads the
// result of the last renewal and checks the lease deadline against the clock,
// so it reports Lost as soon as the deadline has passed, even if the actor's
// timer has not fired yet. It reports Released from the moment the guard's
// end begins (Release or Leave is called, or the Lock context is
// cancelled), before any delete is sent: once the delete reaches Redis
// another client may acquire the lock at once, and the guard must not still
// claim it. After that it never reports Acquired again.
func (g *Guard) State() State {
	if g.ending.Load() != 0 {
		return Released
	}
	s := g.snap.Load()
	if s.state == Acquired && !time.Now().Before(s.deadline) {
		return Lost
	}
	return s.state
}

// Deadline returns until when the guard vouches for the lease: the local
// lease deadline, counted from the send time of the last write Redis
// confirmed plus the TTL minus the safety margin, which each renewal moves
// on. State reports Acquired exactly while the clock is before it, so a
// step that must finish under the lock fits if time.Until(g.Deadline())
// exceeds the step's duration (renewals normally keep moving it, but only a
// renewal that has been confirmed counts). The time carries a monotonic
// clock reading, so wall-clock changes do not affect time.Until.
//
// Deadline returns the zero Time whenever the guard does not vouch for the
// lease: when it is Lost, and from the moment its end begins (it is
// Released). It does not call Redis.
func (g *Guard) Deadline() time.Time {
	if g.ending.Load() != 0 {
		return time.Time{}
	}
	s := g.snap.Load()
	if s.state != Acquired || !time.Now().Before(s.deadline) {
		return time.Time{}
	}
	return s.deadline
}

// Done returns a channel that is closed once the guard has ended (released
// or left), its final delete, if any, has its answer, and its actor and
// everything the actor started have exited.
func (g *Guard) Done() <-chan struct{} { return g.act.Done() }

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
	g.ctxMu.Lock()
	defer g.ctxMu.Unlock()
	if g.ctx == nil {
		g.ctx, g.cancelFn = context.WithCancelCause(g.lockCtx)
		if g.cause != nil {
			g.cancelFn(g.cause)
		}
	}
	return g.ctx
}

// cancel cancels the guard's context with cause, or records cause for when
// the context is made. Only the first cause counts.
func (g *Guard) cancel(cause error) {
	g.ctxMu.Lock()
	defer g.ctxMu.Unlock()
	if g.cause != nil {
		return
	}
	g.cause = cause
	if g.cancelFn != nil {
		g.cancelFn(cause)
	}
}

// Subscribe returns a channel of the guard's states. The first event is the
// state at the time of the call; each later event is a transition. After the
// Released event, or once ctx is done, the channel is closed.
//
// Subscribe does not wait on Redis: the guard's actor serves it at once,
// even while a renewal or the final delete is in flight. If ctx is done
// before the actor takes the request, Subscribe returns a closed channel.
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
// a ctx that is already done returns a closed channel.
func (g *Guard) Subscribe(ctx context.Context) <-chan Event {
	ch := make(chan Event, subscriberBuffer)
	if ctx == nil || ctx.Err() != nil {
		close(ch)
		return ch
	}
	reply := make(actor.Reply[struct{}], 1)
	switch err := g.act.Send(ctx, subscribeMsg{ctx: ctx, ch: ch, reply: reply}); {
	case err == nil:
		// The actor owns ch now. It answers as soon as it has registered
		// ch, which involves no network.
		<-reply
	case errors.Is(err, actor.ErrStopped): // the guard has ended
		ch <- g.final.event
		close(ch)
	default: // ctx ended before the actor took ch
		close(ch)
	}
	return ch
}

// Release ends the guard and deletes its lease. It stops the renewals,
// waits for one in flight, deletes the lease if it still holds this
// acquisition's value (never another holder's), and waits for the actor to
// exit. From the moment it is called, State reports Released and the
// guard's context is cancelled with cause [ErrReleased].
//
// It returns Released when the lease was held until it was deleted, and Lost
// when it had already slipped (the guard was Lost, or the key no longer held
// this acquisition's value). A Redis error is returned wrapped alongside the
// state; the lease then expires on its own within the TTL.
//
// ctx bounds the wait, not the release. If ctx has no deadline, Release
// waits at most [ReleaseTimeout]; the delete itself never waits past the
// end of the lease, since the key is gone by then anyway. If ctx ends (or
// ReleaseTimeout passes) first, Release returns Released and an error
// matching ctx.Err() (context.DeadlineExceeded for ReleaseTimeout); the
// release goes on in the background and [Guard.Done] reports its end. So
// the usual deferred call
//
//	defer g.Release(context.WithoutCancel(ctx))
//
// keeps ctx's values, ignores its cancellation and returns within
// ReleaseTimeout even when Redis is unreachable.
//
// Calling Release again, or after Leave or the cancellation of the Lock
// context, is harmless: whichever came first decides how the guard ends,
// and Release waits for that end and returns its result. A nil ctx is
// refused with an error matching [ErrInvalidArgument] (an
// [*ArgumentError]), and the guard is left as it was.
func (g *Guard) Release(ctx context.Context) (State, error) {
	if ctx == nil {
		return g.State(), badArgument("ctx", "is nil")
	}
	g.end(endRelease)
	return g.wait(ctx, "releasing")
}

// Leave ends the guard without deleting its lease: it stops the renewals,
// waits for one in flight to return and for the actor to exit, and sends
// nothing to Redis. The key keeps this acquisition's value until it
// expires, at the end of the lease as Redis counts it: one TTL after the
// last renewal was sent, so between two thirds of a TTL and a whole TTL
// after Leave. Until then nobody can acquire the lock; a waiter of this
// process, or elsewhere, acquires it once the key has expired.
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
	if ctx == nil {
		return g.State(), badArgument("ctx", "is nil")
	}
	g.end(endLeave)
	return g.wait(ctx, "leaving")
}

// end begins the guard's end as how says, unless it has begun already: it
// stops State from vouching for the lease, ends the critical section and
// tells the actor.
func (g *Guard) end(how int32) {
	g.beginEnd(how)
	g.act.Stop()
}

// beginEnd records how the guard ends, if it is the first to, and cancels
// the guard's context; the caller then stops the actor.
func (g *Guard) beginEnd(how int32) {
	if g.ending.CompareAndSwap(0, how) {
		if s := g.snap.Load(); s.state == Acquired && !time.Now().Before(s.deadline) {
			// The lease lapsed before the end began, though the actor's
			// timer has not said so yet: the loss came first.
			g.cancel(&LostError{Key: g.key, Reason: LostDeadline})
		}
		g.cancel(ErrReleased) // unless the loss came first
	}
}

// errReleaseTimeout is the cause of the wait of a Release or Leave whose
// context had no deadline when ReleaseTimeout passed.
var errReleaseTimeout = fmt.Errorf("not done within distlock.ReleaseTimeout (%v); it goes on in the background until the lease ends", ReleaseTimeout)

// wait waits, as Release and Leave do, for the actor to exit, and returns
// how the guard ended. verb says what it was doing, for the error.
func (g *Guard) wait(ctx context.Context, verb string) (State, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, ReleaseTimeout, errReleaseTimeout)
		defer cancel()
	}
	if err := g.act.Wait(ctx); err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, err) {
			return Released, fmt.Errorf("distlock: %s %s: %w: %w", verb, g.key, err, cause)
		}
		return Released, fmt.Errorf("distlock: %s %s: %w", verb, g.key, err)
	}
	return g.final.state, g.final.err
}
