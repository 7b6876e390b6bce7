// Package actor is the small runtime behind every held distlock lock: a
// goroutine that owns its state alone and is driven by messages.
//
// An [Actor] has three parts:
//
//   - a mailbox: [Actor.Send] delivers a message to the running loop, or
//     reports [ErrStopped] once the loop has returned;
//   - request/reply: [Call] sends a message carrying a [Reply] slot of
//     capacity one, so the actor can always answer without blocking, even when
//     the caller has given up and gone away;
//   - stop-and-wait: [Actor.Stop] asks the loop to finish (it is safe to call
//     any number of times, from any goroutine), and [Actor.Done] and
//     [Actor.Wait] report that it has returned.
//
// The loop function is written as one for/select over the mailbox, the stop
// channel and whatever timers and result channels the actor owns, in the style
// of etcd's raft node. Work that may block (a network call) belongs in a child
// goroutine started with [Actor.Go], whose result comes back to the loop on a
// channel; the actor waits for every child before it reports done, so nothing
// it started outlives it.
package actor

import (
	"context"
	"errors"
	"sync"
)

// ErrStopped is returned by [Actor.Send] and [Call] when the actor's loop has
// already returned and can no longer receive messages.
var ErrStopped = errors.New("actor: stopped")

// An Actor runs one loop goroutine that receives messages of type M.
//
// All methods are safe for concurrent use.
type Actor[M any] struct {
	inbox    chan M
	stop     chan struct{}
	stopOnce sync.Once
	returned chan struct{} // closed when loop has returned; children may still run
	done     chan struct{} // closed when loop and every child have returned
	children sync.WaitGroup
}

// Loop is the body of an actor. It receives the actor itself (to start child
// goroutines), the mailbox and the stop channel, and returns when its work is
// finished. It should return soon after stop is closed; it may first finish
// what it has in hand, such as a release in flight.
type Loop[M any] func(a *Actor[M], inbox <-chan M, stop <-chan struct{})

// Start starts loop in a new goroutine and returns its handle.
//
// The mailbox is unbuffered: a successful [Actor.Send] means the loop has
// taken the message. When loop returns, the actor waits for every child
// started with [Actor.Go] and then closes [Actor.Done].
func Start[M any](loop Loop[M]) *Actor[M] {
	a := &Actor[M]{
		inbox:    make(chan M),
		stop:     make(chan struct{}),
		returned: make(chan struct{}),
		done:     make(chan struct{}),
	}
	go func() {
		defer close(a.done)
		defer a.children.Wait()
		defer close(a.returned)
		loop(a, a.inbox, a.stop)
	}()
	return a
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

// Stop asks the loop to finish by closing its stop channel. It does not wait;
// use [Actor.Done] or [Actor.Wait] for that. Calling Stop more than once, or
// after the loop has returned, does nothing.
func (a *Actor[M]) Stop() {
	a.stopOnce.Do(func() { close(a.stop) })
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

// Go runs f in a child goroutine of the actor. The actor does not report done
// until f has returned, so f must itself return in bounded time (give it a
// context with a deadline, or a channel the loop closes on the way out).
// Go must only be called from the loop goroutine or from another child.
func (a *Actor[M]) Go(f func()) {
	a.children.Go(f)
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
	case <-a.done:
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
