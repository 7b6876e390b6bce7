package distlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// A Guard is one held acquisition: of a [Mutex] (returned by Lock, TryLock
// and TryLockFor), of a permit of a [Semaphore] (Acquire, TryAcquire,
// TryAcquireFor), of a term of an [Election] (Campaign) or of an [RWMutex]
// (RLock and Lock, and their Try forms; see [Guard.Downgrade]). It stays
// valid until it is released.
//
// A guard that is held for a while has one goroutine, its actor, which
// renews the lease every TTL/3, watches the lease deadline and publishes
// what it learns. The actor starts when the first renewal is due, a third
// of the TTL after the acquisition, so a lock held for less than that costs
// no goroutine at all. It exits when the guard is released, by
// [Guard.Release], by [Guard.Leave] or by the cancellation of the context
// given to Lock; until then it keeps renewing, so a guard that is neither
// released nor cancelled holds the lock for as long as the process lives.
//
// All methods are safe for concurrent use. Only Release and Leave wait on
// Redis; the others answer from the guard's own memory at once.
type Guard struct {
	e        *engine
	value    string
	token    int64
	attempt  int
	void     bool            // release with Cancel: a lost call with value may still reach Redis
	lockCtx  context.Context // the context given to Lock
	acquired time.Time
	done     chan struct{} // closed by finish

	// st is the guard's published status. It changes only in publish,
	// under mu; State and Deadline read it without a lock. It starts at
	// first.
	st    atomic.Pointer[status]
	first status

	mu sync.Mutex // guards everything below, and every change of st
	// how is how the guard ends, once Release, Leave or the Lock context's
	// end has begun it (the first one decides); 0 until then. endFrom is
	// the state it was in at that moment.
	how     endHow
	endFrom State
	// The last write Redis confirmed: its send time and the TTL it set
	// (the claim window for a lease passed to a waiter, until its first
	// renewal).
	lastSent time.Time
	leaseTTL time.Duration
	// firstRenewal starts the actor; stopActor, set once the actor runs,
	// tells it that the end has begun. unwatch stops the watch on the Lock
	// context.
	firstRenewal *time.Timer
	stopActor    context.CancelFunc
	unwatch      func() bool
	// The actor's retries of renewals that failed while the lease held:
	// their pause, and the last failure (the cause of a loss at the
	// deadline, until a renewal is confirmed).
	retry    backoff
	renewErr error
	subs     subscribers
	// The guard's context is made on first use: most critical sections
	// never ask for it. cause is why it was cancelled, if it was before it
	// was made.
	ctx       context.Context
	cancelCtx context.CancelCauseFunc
	cause     error
	// final is written by finish before done is closed, and read only
	// after that.
	final outcome
	// rw is a read-write lock's hold: its mode after a Downgrade
	// (rwmutex.go).
	rw rwHold
}

// status is what a guard publishes for State and Deadline to read without
// a lock. State checks deadline against the clock itself, so a late timer
// cannot make it report a lapsed lease as held.
type status struct {
	state    State
	since    time.Time // when state was entered
	deadline time.Time // D: while Acquired, and kept while Lost; zero once Released
	err      error     // why, for Lost
}

// released is the status of every guard whose end has begun.
var released = &status{state: Released}

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
	event Event // the final Released event
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
// The guard starts without a goroutine: a timer starts its actor when the
// first renewal is due, and the Lock context is watched with
// context.AfterFunc.
func (e *engine) newGuard(lockCtx context.Context, value string, token int64, attempt int, sent time.Time, ttl time.Duration, void bool) *Guard {
	now := time.Now()
	g := &Guard{e: e, value: value, token: token, attempt: attempt, void: void, lockCtx: lockCtx, acquired: now,
		done: make(chan struct{}), lastSent: sent, leaseTTL: ttl}
	g.first = status{state: Acquired, since: now, deadline: leaseDeadline(sent, ttl)}
	g.st.Store(&g.first)
	if e.debug() {
		g.logger().Debug("distlock: acquired", "attempt", attempt)
	}
	// The timer and the watch may fire at once; they wait for mu.
	g.mu.Lock()
	defer g.mu.Unlock()
	g.firstRenewal = time.AfterFunc(sent.Add(renewAfter(ttl)).Sub(now), g.activate)
	if lockCtx.Done() != nil {
		g.unwatch = context.AfterFunc(lockCtx, g.lockCtxEnded)
	}
	return g
}

// Key returns the Redis key that holds the lease.
func (g *Guard) Key() string { return g.e.keys.Lease }

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
// so it reports Lost as soon as the deadline has passed, even if no timer
// has fired yet. It reports Released from the moment the guard's end begins
// (Release or Leave is called, or the Lock context is cancelled), before any
// delete is sent: once the delete reaches Redis another client may acquire
// the lock at once, and the guard must not still claim it. After that it
// never reports Acquired again.
func (g *Guard) State() State {
	s := g.st.Load()
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
	s := g.st.Load()
	if s.state != Acquired || !time.Now().Before(s.deadline) {
		return time.Time{}
	}
	return s.deadline
}

// Done returns a channel that is closed once the guard has ended (released
// or left), its final delete, if any, has its answer, and its actor, if it
// had one, has stopped renewing.
func (g *Guard) Done() <-chan struct{} { return g.done }

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
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ctx == nil {
		g.ctx, g.cancelCtx = context.WithCancelCause(g.lockCtx)
		if g.cause != nil {
			g.cancelCtx(g.cause)
		}
	}
	return g.ctx
}

// Subscribe returns a channel of the guard's states. The first event is the
// state at the time of the call; each later event is a transition, or the
// report of a renewal that failed while the lease still held (State
// Acquired, Err a [*RenewError]: nothing has changed yet, and the guard
// retries; see the package documentation, "Renewal and loss"). After the
// Released event, or once ctx is done, the channel is closed.
//
// Subscribe does not wait on Redis: it answers at once, even while a
// renewal or the final delete is in flight.
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
// a ctx that is already done, or nil, returns a closed channel.
func (g *Guard) Subscribe(ctx context.Context) <-chan Event {
	ch := make(chan Event, subscriberBuffer)
	if ctx == nil || ctx.Err() != nil {
		close(ch)
		return ch
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.done:
		ch <- g.final.event
		close(ch)
		return ch
	default:
	}
	unsubscribe := func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.subs.remove(ch)
	}
	if g.how != 0 {
		// The first event is the final Released, published by finish.
		g.subs.add(ctx, ch, nil, unsubscribe)
		return ch
	}
	g.checkDeadlineLocked()
	s := g.st.Load()
	g.subs.add(ctx, ch, &Event{State: s.state, Time: s.since, Err: s.err}, unsubscribe)
	return ch
}

// Release ends the guard and deletes its lease. It stops the renewals,
// waits for one in flight, and deletes the lease if it still holds this
// acquisition's value (never another holder's). From the moment it is
// called, State reports Released and the guard's context is cancelled with
// cause [ErrReleased]. When the context is one that cannot be cancelled,
// such as context.WithoutCancel(ctx), and the guard has no actor yet, the
// delete is sent from the calling goroutine; otherwise another goroutine
// sends it and Release waits for it.
//
// It returns Released when the lease was held until it was deleted, and Lost
// when it had already slipped (the guard was Lost, or the key no longer held
// this acquisition's value). A delete that gets no reply (a reset
// connection, a refused dial) may not have run, so it is sent again after a
// pause that grows from 10 ms to 200 ms, while the wait and the lease last;
// Release returns Released and no error as soon as one is confirmed. An
// error that Redis answered with is returned wrapped alongside the state,
// as is the last failure when no try was confirmed in time; the lease then
// expires on its own within the TTL.
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
// ReleaseTimeout even when Redis is unreachable (unless rueidis is, at that
// moment, establishing the connection for another call: then the delete
// waits for that attempt, which rueidis bounds by its dial timeout).
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
	bound := waitBound(ctx)
	if _, last := g.beginEnd(endRelease); last {
		if ctx.Done() == nil {
			g.release(ctx, bound)
		} else {
			go g.release(context.WithoutCancel(ctx), time.Time{})
		}
	}
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
	if ctx == nil {
		return g.State(), badArgument("ctx", "is nil")
	}
	bound := waitBound(ctx)
	if _, last := g.beginEnd(endLeave); last {
		g.finish(releaseResult{})
	}
	return g.wait(ctx, bound, "leaving")
}

// lockCtxEnded is the watch on the Lock context: its end releases the
// guard, as Release would. It runs in a goroutine of its own
// (context.AfterFunc's), which sends the delete if the guard has no actor.
//
// A deadline that ends the hold is logged at Warn: it is usually a timeout
// meant for the wait alone (the habit of libraries whose lock outlives the
// context it was taken with), and the work under the lock is cut short.
func (g *Guard) lockCtxEnded() {
	began, last := g.beginEnd(endRelease)
	if began && errors.Is(g.lockCtx.Err(), context.DeadlineExceeded) {
		g.logger().Warn("distlock: the deadline of the context given to Lock has ended the hold; releasing the lock "+
			"(to bound only the wait, use WithMaxWait or TryLockFor)", "held", time.Since(g.acquired))
	}
	if last {
		g.release(context.WithoutCancel(g.lockCtx), time.Time{})
	}
}

// beginEnd begins the guard's end as how says, unless it has begun
// already. From this moment State reports Released and the guard's context
// is cancelled; the timer of the first renewal and the watch on the Lock
// context stop, and an actor is told to stop. It reports whether the
// caller began the end, and whether it must take the end's last step (the
// delete for a release; nothing to send for Leave, but the end to record):
// it must when it began the end and the guard has no actor, which takes the
// step itself otherwise.
func (g *Guard) beginEnd(how endHow) (began, last bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.how != 0 {
		return false, false
	}
	// A lease that lapsed before the end began, though no timer has said
	// so yet, was lost first.
	g.checkDeadlineLocked()
	g.how, g.endFrom = how, g.st.Load().state
	g.publish(released)
	if g.firstRenewal != nil {
		g.firstRenewal.Stop()
	}
	if g.unwatch != nil {
		g.unwatch()
	}
	if e := g.e; e.debug() {
		g.logger().Debug("distlock: ending", "leave", how == endLeave)
	}
	if g.stopActor != nil {
		g.stopActor()
		return true, false
	}
	return true, true
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
	select {
	case <-g.done:
		return g.final.state, g.final.err
	default:
	}
	var err, cause error
	if _, ok := ctx.Deadline(); ok {
		select {
		case <-g.done:
			return g.final.state, g.final.err
		case <-ctx.Done():
			err, cause = ctx.Err(), context.Cause(ctx)
		}
	} else {
		t := time.NewTimer(time.Until(bound))
		defer t.Stop()
		select {
		case <-g.done:
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

// releaseResult is the answer to the final delete.
type releaseResult struct {
	deleted bool
	err     error
	// unanswered: an earlier try got no reply, so it may be the one that
	// deleted the lease, and a later "not deleted" says nothing.
	unanswered bool
}

// release sends the final delete: the conditional delete (or, for a guard
// whose acquisition left a call with its value unaccounted for, the cancel
// that also voids the value), which passes the lock to the next waiter in
// line. It runs on the goroutine that takes the end's last step (see
// beginEnd) and records the end.
//
// A delete that fails without a reply may not have run, so it is sent
// again after a pause that grows from firstRetry (L1b): a reset connection
// or a proxy that restarts does not leave the lock held for the rest of
// its lease. Waiting past the end of the lease would be pointless, since
// the key is gone by then either way; minReleaseWait still gives a lapsed
// lease one try. When until is set (the Release that sends it waits only
// that long) and passes first, the delete goes on in a goroutine of its own
// until the end of the lease, and the guard ends when it has its answer.
func (g *Guard) release(ctx context.Context, until time.Time) {
	e := g.e
	g.mu.Lock()
	leaseEnd := g.lastSent.Add(g.leaseTTL)
	g.mu.Unlock()
	if floor := time.Now().Add(minReleaseWait); leaseEnd.Before(floor) {
		leaseEnd = floor
	}
	dl := leaseEnd
	if !until.IsZero() && until.Before(dl) {
		dl = until
	}
	pause := backoff{first: firstRetry, most: maxReleaseRetry}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	unanswered := false // an attempt got no reply: it may have deleted the lease
	var lastErr error   // the last failure that was not the attempt's deadline
	for {
		cctx, cancel := context.WithDeadline(ctx, dl)
		sent := time.Now()
		var r lease.Release
		var err error
		if g.void {
			r, err = e.store.Cancel(cctx, e.keys, g.value, e.ttl)
		} else {
			r, err = e.store.Release(cctx, e.keys, g.value)
		}
		cancel()
		// The release passed the lock to the next in line; if that waiter
		// is in this process, it wakes now rather than at the announcement.
		deliverPasses(e.queueKey(), r, sent)
		if err == nil || lease.IsReply(err) {
			g.finish(releaseResult{deleted: r.Deleted, err: err, unanswered: unanswered})
			return
		}
		unanswered = true
		if !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			lastErr = err
		}
		wait := pause.next()
		if time.Now().Add(wait).Before(dl) {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			<-timer.C
			continue
		}
		if dl.Before(leaseEnd) {
			// The caller's wait is over, the lease is not.
			go g.release(ctx, time.Time{})
			return
		}
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			// The attempt ran out of the lease, not the caller out of
			// time: say why it got no answer, not that a context ended.
			err = &noAnswerError{last: lastErr}
		}
		g.finish(releaseResult{err: err})
		return
	}
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

// finish records how the guard ended, publishes Released and closes every
// subscription and Done. After Leave, r is empty: nothing was sent, and
// the lease stays until it expires.
func (g *Guard) finish(r releaseResult) {
	g.mu.Lock()
	defer g.mu.Unlock()
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
		g.tell(Acquired, Lost, time.Now(), cause, 0)
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
	ev := Event{State: Released, Time: time.Now(), Err: err}
	g.tell(from, Released, ev.Time, err, ev.Time.Sub(g.acquired))
	g.final = outcome{state: final, err: err, event: ev}
	g.subs.closeAll()
	close(g.done)
}

// The guard's state machine. Every change of the published status goes
// through publish, under mu, from whichever goroutine learnt it: the actor
// (a renewal's answer, the deadline), the caller (Release, Leave,
// Subscribe's look at the clock) or the watch on the Lock context.

// publish makes next the guard's status. When the state changes (other
// than to Released, whose event comes with the release's answer, in
// finish), it tells everyone who watches, in a fixed order: State and
// Deadline first; for a loss, the guard's context next (whoever sees it
// cancelled then reads Lost from State); then the Observer and the
// subscribers, who thus find the context cancelled. A move to Released
// cancels the guard's context, unless a loss did already.
func (g *Guard) publish(next *status) {
	prev := g.st.Load()
	g.st.Store(next)
	switch {
	case next.state == Released:
		g.cancelLocked(ErrReleased)
	case next.state != prev.state:
		if next.state == Lost {
			g.cancelLocked(next.err)
		}
		g.tell(prev.state, next.state, next.since, next.err, 0)
	}
}

// tell reports a transition to the Observer and to the subscribers; held
// is how long the guard existed, for a move to Released.
func (g *Guard) tell(from, to State, at time.Time, err error, held time.Duration) {
	e := g.e
	e.obs.ObserveTransition(TransitionInfo{Key: e.keys.Lease, Kind: e.kind, Mode: e.keys.Mode.String(), Token: g.token, From: from, To: to, Err: err, Held: held})
	g.subs.publish(Event{State: to, Time: at, Err: err})
}

// confirmLocked records a write of ttl, sent at sent, that Redis
// confirmed: the deadline moves on, and a Lost guard is Acquired again.
func (g *Guard) confirmLocked(sent time.Time, ttl time.Duration) {
	g.lastSent, g.leaseTTL = sent, ttl
	g.renewErr = nil
	g.retry.reset()
	prev := g.st.Load()
	next := &status{state: Acquired, since: prev.since, deadline: leaseDeadline(sent, ttl)}
	if prev.state == Lost {
		next.since = time.Now()
	}
	g.publish(next)
	if prev.state == Lost {
		g.logger().Info("distlock: lock regained")
	}
}

// loseLocked moves an Acquired guard to Lost for cause; the deadline it
// had is kept. The first loss cancels the guard's context.
func (g *Guard) loseLocked(cause *LostError) {
	prev := g.st.Load()
	if prev.state != Acquired {
		return
	}
	g.publish(&status{state: Lost, since: time.Now(), deadline: prev.deadline, err: cause})
	g.logger().Warn("distlock: lock lost", "reason", cause.Reason.String(), "err", cause)
}

// checkDeadlineLocked marks the guard Lost if its deadline has passed:
// because renewals failed up to it (the last failure says why), or because
// none was confirmed in time.
func (g *Guard) checkDeadlineLocked() {
	if s := g.st.Load(); s.state == Acquired && !time.Now().Before(s.deadline) {
		cause := &LostError{Key: g.e.keys.Lease, Reason: LostDeadline}
		if g.renewErr != nil {
			cause.Reason, cause.Err = LostRenewFailed, g.renewErr
		}
		g.loseLocked(cause)
	}
}

// cancelLocked cancels the guard's context with cause, or records cause for
// when the context is made. Only the first cause counts.
func (g *Guard) cancelLocked(cause error) {
	if g.cause != nil {
		return
	}
	g.cause = cause
	if g.cancelCtx != nil {
		g.cancelCtx(cause)
	}
}

// logger returns the engine's logger with this guard's attributes.
func (g *Guard) logger() *slog.Logger {
	return g.e.logger().With("owner", lease.Owner(g.value), "token", g.token)
}
