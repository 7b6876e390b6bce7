package distlock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distkit-go/distlock/actor"
)

// A Guard is one held acquisition of a [Mutex]. It is returned by Lock,
// TryLock and TryLockFor, and stays valid until it is released.
//
// Behind each Guard runs one goroutine, its actor, which renews the lease
// every TTL/3, watches the lease deadline, publishes state changes and, at
// the end, releases the lease. The actor exits when the guard is released,
// either by [Guard.Release] or by the cancellation of the context given to
// Lock; until then it keeps renewing, so a guard that is neither released nor
// cancelled holds the lock for as long as the process lives.
//
// All methods are safe for concurrent use.
type Guard struct {
	key     string
	token   int64
	attempt int

	act  *actor.Actor[guardMsg]
	snap atomic.Pointer[snapshot] // written by the actor only

	// The guard's context is made on first use: most critical sections
	// never ask for it. ctxMu guards the three fields.
	ctxMu    sync.Mutex
	lockCtx  context.Context // the parent: the context given to Lock
	ctx      context.Context
	cancelFn context.CancelCauseFunc
	cause    error // why it was cancelled, if it was before it was made

	// final is written by the actor before it exits and read only after
	// act.Done() is closed.
	final outcome
}

// snapshot is the state the actor publishes for State to read without a
// round trip through the mailbox. State checks deadline against the clock
// itself, so a late timer cannot make it report a lapsed lease as held.
type snapshot struct {
	state    State
	deadline time.Time // for Acquired: the local lease deadline D
}

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

// Attempt returns the zero-based attempt that acquired the lock: 0 if the
// first try succeeded, n after n failed tries.
func (g *Guard) Attempt() int { return g.attempt }

// State reports the guard's state now. It does not call Redis: it reads the
// result of the last renewal and checks the lease deadline against the clock,
// so it reports Lost as soon as the deadline has passed, even if the actor's
// timer has not fired yet. It reports Released from the moment the release
// begins (Release is called or the Lock context is cancelled), before the
// delete is sent: once the delete reaches Redis another client may acquire
// the lock at once, and the guard must not still claim it.
func (g *Guard) State() State {
	s := g.snap.Load()
	if s.state == Acquired && !time.Now().Before(s.deadline) {
		return Lost
	}
	return s.state
}

// Done returns a channel that is closed once the guard has been released and
// its actor has exited.
func (g *Guard) Done() <-chan struct{} { return g.act.Done() }

// Context returns a context for the critical section. It is derived from the
// context given to Lock, so it carries that context's values, and it is
// cancelled at the first Lost (with a cause matching [ErrLost]), when the
// release begins (cause [ErrReleased]), or when the Lock context is
// cancelled (with that context's cause). Read the cause with
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
// The channel is never written to in a way that blocks: it buffers four
// events and, when a reader falls further behind, the oldest buffered event
// is dropped to make room. A slow reader may therefore miss intermediate
// transitions (such as a brief Lost and Acquired) but always receives the
// newest state, and always receives Released before the channel closes. For
// a fact that cannot be missed, use [Guard.Done] or [Guard.Context].
//
// Subscribing to a released guard returns a channel holding its final
// Released event; subscribing with a ctx that is already done returns a
// closed channel.
func (g *Guard) Subscribe(ctx context.Context) <-chan Event {
	ch := make(chan Event, subscriberBuffer)
	if ctx == nil || ctx.Err() != nil {
		close(ch)
		return ch
	}
	// The actor serves its mailbox at all times, so this call returns at
	// once; it must not be abandoned half-way, or nobody would know whether
	// the actor owns ch.
	_, err := actor.Call(context.Background(), g.act, func(r actor.Reply[struct{}]) guardMsg {
		return subscribeMsg{ctx: ctx, ch: ch, reply: r}
	})
	if err != nil { // the actor has exited: the guard is released
		ch <- g.final.event
		close(ch)
	}
	return ch
}

// Release releases the lock. It stops the renewals, waits for one in flight,
// deletes the lease if it still holds this acquisition's value (never another
// holder's), and waits for the actor to exit.
//
// It returns Released when the lease was held until it was deleted, and Lost
// when it had already slipped (the guard was Lost, or the key no longer held
// this acquisition's value). A Redis error is returned wrapped alongside the
// state; the lease then expires on its own within the TTL.
//
// If ctx ends before all that is done, Release returns the current state and
// an error matching ctx.Err(); the release goes on in the background and
// [Guard.Done] reports its end. Calling Release again, or after the Lock
// context was cancelled, is harmless: it waits for the same release and
// returns the same result.
func (g *Guard) Release(ctx context.Context) (State, error) {
	g.act.Stop()
	if ctx == nil {
		return g.State(), invalid("ctx", "is nil")
	}
	if err := g.act.Wait(ctx); err != nil {
		return g.State(), fmt.Errorf("distlock: releasing %s: %w", g.key, err)
	}
	return g.final.state, g.final.err
}
