package distlock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// State is what a [Guard] knows about its lease.
type State int

const (
	// Acquired: the lease is held and its deadline has not passed.
	Acquired State = iota + 1
	// Lost: ownership is in doubt. A renewal was refused or failed, or the
	// local deadline passed without a confirmed renewal. When renewals only
	// failed (no reply), the guard keeps renewing and returns to Acquired
	// if one proves the key still holds this acquisition's value. When
	// Redis refused a renewal (the key is gone or someone else's), the
	// loss is final: the guard stops renewing and stays Lost until it is
	// released.
	Lost
	// Released: the guard has ended, by [Guard.Release], by [Guard.Leave]
	// or by the cancellation of the context given to Lock. It is final.
	// State reports it from the moment the end begins; the Released event
	// comes once the release has finished.
	Released
)

func (s State) String() string {
	switch s {
	case Acquired:
		return "acquired"
	case Lost:
		return "lost"
	case Released:
		return "released"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Event is one state of a [Guard], as delivered by [Guard.Subscribe].
type Event struct {
	State State
	// Time is when the guard entered State, on the local clock.
	Time time.Time
	// Err says why: for Lost, an error matching [ErrLost] (a [*LostError]);
	// for Released, the error of the final delete if it failed (the lease then
	// expires on its own). For Acquired it is nil, except in the report of a
	// renewal that failed while the lease still held: then it matches
	// [ErrRenewFailed] (a [*RenewError], which says until when the lease
	// holds and when the next try comes), and the state has not changed.
	Err error
}

func (e Event) String() string {
	if e.Err != nil {
		return fmt.Sprintf("%s at %s: %v", e.State, e.Time.Format(time.RFC3339Nano), e.Err)
	}
	return fmt.Sprintf("%s at %s", e.State, e.Time.Format(time.RFC3339Nano))
}

// subscriberBuffer is the capacity of a subscription channel. Four events hold
// the initial state, a Lost/Acquired flap and the final Released, so a reader
// that is a little behind misses nothing; beyond that the oldest events are
// dropped (see [Guard.Subscribe]).
const subscriberBuffer = 4

// signals is what a guard shows to every goroutine: its status (read
// without a lock by State and Deadline), its context and its
// subscriptions. Only the guard's owner changes them, through
// Guard.apply; any goroutine may read the status, ask for the context or
// subscribe. mu is a leaf lock: it is held for a few non-blocking steps
// (a store, a cancel, an offer to each subscriber), never while anything
// else is called, so neither side ever waits on the other's work.
type signals struct {
	st    atomic.Pointer[status]
	first status // the status a guard starts with, without an allocation

	mu     sync.Mutex
	subs   map[chan Event]func() bool // each with the stop of its context's AfterFunc
	ctx    context.Context            // made on first use: most critical sections never ask
	cancel context.CancelCauseFunc
	cause  error // why the context is cancelled, if it is (or would be, once made)
	closed bool  // the final event was sent and every subscription closed
	final  Event // that event
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

// publish makes next the status, if it is not nil; cancels the context
// with cause, if it is not nil and the context was not cancelled before;
// and offers ev, if emit is set, to every subscriber. A final ev closes
// every subscription, and later subscribers receive it alone. All of it
// happens at once for anyone who looks: a subscriber that comes in
// between cannot see the new status and then the event a second time.
func (p *signals) publish(next *status, cause error, ev Event, emit, final bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if next != nil {
		p.st.Store(next)
	}
	if cause != nil && p.cause == nil {
		p.cause = cause
		if p.cancel != nil {
			p.cancel(cause)
		}
	}
	if emit {
		for ch := range p.subs {
			offerLatest(ch, ev)
		}
	}
	if final {
		for ch, stop := range p.subs {
			stop()
			close(ch)
		}
		p.subs, p.closed, p.final = nil, true, ev
	}
}

// context returns the guard's context, derived from parent, making it on
// first use.
func (p *signals) context(parent context.Context) context.Context {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx == nil {
		p.ctx, p.cancel = context.WithCancelCause(parent)
		if p.cause != nil {
			p.cancel(p.cause)
		}
	}
	return p.ctx
}

// subscribe registers ch until ctx is done, and sends it the current
// state: for a guard whose end has begun, nothing until the final event
// (see Guard.Subscribe); for one that has ended, the final event, and ch
// is closed.
func (p *signals) subscribe(ctx context.Context, ch chan Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		ch <- p.final
		close(ch)
		return
	}
	if s := p.st.Load(); s.state != Released {
		ch <- Event{State: s.state, Time: s.since, Err: s.err}
	}
	if p.subs == nil {
		p.subs = make(map[chan Event]func() bool)
	}
	p.subs[ch] = context.AfterFunc(ctx, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if _, ok := p.subs[ch]; ok {
			delete(p.subs, ch)
			close(ch)
		}
	})
}

// offerLatest puts v in ch without ever blocking. When ch is full it drops
// the oldest value to make room, so the newest is always delivered. It is
// only called by the single sender of ch, so once a value has been dropped
// there is room: the reader can only make more.
func offerLatest[T any](ch chan T, v T) {
	for {
		select {
		case ch <- v:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}
