// Package actor is distlock's small actor runtime: a goroutine that owns
// its state alone and is driven by messages. Every held distlock lock runs
// on it from its first renewal to its end (one actor, one goroutine, per
// held guard, which the renewal timer's goroutine becomes through
// [Actor.Run]), and so does the watcher that serves an election's
// observers.
//
// An [Actor] has four parts:
//
//   - a mailbox: [Actor.Send] delivers a message to the running loop, or
//     reports [ErrStopped] once the loop has returned;
//   - request/reply: [Call] sends a message carrying a [Reply] slot of
//     capacity one, so the actor can always answer without blocking, even when
//     the caller has given up and gone away;
//   - children: [Actor.Go] runs work that may block (a network call) in a
//     goroutine of its own, whose answer comes back to the loop as a message;
//   - stop-and-wait: an actor stops by returning from its loop, when a
//     message (or something it owns, such as a timer) tells it its work is
//     over. Its children's context is then cancelled, and [Actor.Done] and
//     [Actor.Wait] report when the loop and every child have returned, so
//     nothing it started outlives it.
//
// The loop function is written as one for/select over the mailbox and
// whatever timers and channels the actor owns, in the style of etcd's raft
// node. It must never block on anything but that select: a loop that waits
// on the network cannot answer its mailbox.
package actor

import (
	"context"
	"errors"
	"sync"
)

// ErrStopped is returned by [Actor.Send] and [Call] when the actor's loop has
// already returned and can no longer receive messages.
var ErrStopped = errors.New("actor: stopped")

// An Actor runs one loop that receives messages of type M.
//
// All methods are safe for concurrent use.
type Actor[M any] struct {
	inbox    chan M
	returned chan struct{} // closed when the loop has returned; children may still run
	done     chan struct{} // closed when the loop and every child have returned
	// ctx is the children's context, cancelled when the loop returns.
	ctx      context.Context
	cancel   context.CancelFunc
	children sync.WaitGroup
}

// Loop is the body of an actor. It receives the actor itself (to start
// children and to give them its mailbox) and the mailbox, and returns when
// its work is finished.
type Loop[M any] func(a *Actor[M], inbox <-chan M)

// New returns an actor whose loop does not run yet: [Actor.Run] runs it. A
// message sent before then waits until the loop takes it.
func New[M any]() *Actor[M] {
	ctx, cancel := context.WithCancel(context.Background())
	return &Actor[M]{
		inbox:    make(chan M),
		returned: make(chan struct{}),
		done:     make(chan struct{}),
		ctx:      ctx,
		cancel:   cancel,
	}
}

// Start starts loop in a new goroutine and returns its handle.
func Start[M any](loop Loop[M]) *Actor[M] {
	a := New[M]()
	go a.Run(loop)
	return a
}

// Run runs loop on the calling goroutine, which becomes the actor's, and
// returns when the loop and every child have returned. A goroutine that
// already exists (a timer's, say) can so become an actor without starting
// another. Run must be called once.
//
// The mailbox is unbuffered: a successful [Actor.Send] means the loop has
// taken the message. When loop returns, Run cancels the children's context,
// waits for every child started with [Actor.Go], and then closes
// [Actor.Done].
//
// Run defers nothing, so that its frame, under a loop that spends its
// life parked, stays small (a process may run 100,000 actors): if loop
// panics, the actor is never done (an unrecovered panic ends the process
// anyway).
func (a *Actor[M]) Run(loop Loop[M]) {
	loop(a, a.inbox)
	close(a.returned)
	a.cancel()
	a.children.Wait()
	close(a.done)
}

// Send delivers m to the loop. It blocks until the loop takes the message,
// the loop has returned (then it reports [ErrStopped]) or ctx is done (then it
// reports ctx.Err()). It does not wait for children still running after the
// loop has returned, so a child may call Send without deadlocking the actor.
func (a *Actor[M]) Send(ctx context.Context, m M) error {
	select {
	case a.inbox <- m:
		return nil
	case <-a.returned:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Done returns a channel that is closed once the loop and all of its children
// have returned.
func (a *Actor[M]) Done() <-chan struct{} { return a.done }

// Wait blocks until the actor is done or ctx is done. It returns nil in the
// first case and ctx.Err() in the second; the actor keeps running then.
func (a *Actor[M]) Wait(ctx context.Context) error {
	select {
	case <-a.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Go runs f in a child goroutine of the actor, with a context that is
// cancelled when the loop returns. f sends its answer to the loop with
// Send(ctx, ...), which gives up once the loop has returned. The actor does
// not report done until f has returned, so f must return soon after ctx is
// cancelled. Go must only be called from the loop goroutine or from another
// child.
func (a *Actor[M]) Go(f func(ctx context.Context)) {
	a.children.Go(func() { f(a.ctx) })
}

// StopChildren cancels the children's context and waits until every child
// has returned. A loop calls it on its way out when what it does last must
// come after its children have ended (the loop's own return does the same,
// but only after the loop's deferred calls have run). It must only be
// called from the loop goroutine.
func (a *Actor[M]) StopChildren() {
	a.cancel()
	a.children.Wait()
}

// Reply is a one-shot answer slot for a request. Its capacity of one means
// the actor's single send never blocks, whether or not the caller still waits.
type Reply[R any] chan R

// Send stores the answer. Each Reply must be answered at most once.
func (r Reply[R]) Send(v R) { r <- v }

// Call sends the message built by req, which must embed the given reply slot,
// and waits for the actor's answer. It returns [ErrStopped] if the loop has
// returned before it took or answered the request, and ctx.Err() if ctx ends
// first.
func Call[M, R any](ctx context.Context, a *Actor[M], req func(Reply[R]) M) (R, error) {
	var zero R
	reply := make(Reply[R], 1)
	if err := a.Send(ctx, req(reply)); err != nil {
		return zero, err
	}
	select {
	case v := <-reply:
		return v, nil
	case <-a.returned:
		// The loop may have answered just before it returned.
		select {
		case v := <-reply:
			return v, nil
		default:
			return zero, ErrStopped
		}
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}
