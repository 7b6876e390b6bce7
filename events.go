package distlock

import (
	"context"
	"fmt"
	"time"
)

// State is what a [Guard] knows about its lease.
type State int

const (
	// Acquired: the lease is held and its deadline has not passed.
	Acquired State = iota + 1
	// Lost: ownership is in doubt. A renewal was refused or failed, or the
	// local deadline passed without a confirmed renewal. The guard keeps
	// renewing and may return to Acquired if a renewal proves the key still
	// holds this acquisition's value.
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

// subscriber is one channel returned by Subscribe. It is sent on and
// closed only under the guard's mutex.
type subscriber struct {
	ch   chan Event
	stop func() bool // stops the context.AfterFunc that unsubscribes
}

// subscribers is a guard's set of subscriptions, guarded by the guard's
// mutex. The zero value is an empty set.
type subscribers map[chan Event]subscriber

// add registers ch, whose context is ctx, and sends it the current state,
// if there is one to send. unsubscribe is called once ctx is done.
func (s *subscribers) add(ctx context.Context, ch chan Event, current *Event, unsubscribe func()) {
	if current != nil {
		offer(ch, *current)
	}
	if *s == nil {
		*s = make(subscribers)
	}
	(*s)[ch] = subscriber{ch: ch, stop: context.AfterFunc(ctx, unsubscribe)}
}

// remove closes ch and forgets it, if it is still registered.
func (s subscribers) remove(ch chan Event) {
	sub, ok := s[ch]
	if !ok {
		return
	}
	sub.stop()
	close(sub.ch)
	delete(s, ch)
}

// publish offers ev to every subscriber without blocking.
func (s subscribers) publish(ev Event) {
	for _, sub := range s {
		offer(sub.ch, ev)
	}
}

// closeAll closes every subscription; the final event must already have been
// published.
func (s subscribers) closeAll() {
	for ch := range s {
		s.remove(ch)
	}
}

// offer puts ev in ch without ever blocking. When ch is full it drops the
// oldest event to make room, so the newest state is always delivered. It is
// only called by the single sender of ch, so once an event has been dropped
// there is room: the reader can only make more.
func offer(ch chan Event, ev Event) {
	for {
		select {
		case ch <- ev:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}
