package distlock

import (
	"context"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// holding is what a guard holds in Redis and how it keeps and ends it:
// the lease of one lock, held through its engine (*engine), or the leases
// of every name of a MultiMutex (*setHold, multi_hold.go). The guard and
// its actor reach either through it alone. Its dynamic type is a pointer
// the guard holds anyway (its engine, or the set's hold that the set's
// acquisition made), so it costs a guard no allocation of its own.
type holding interface {
	// renew renews what value holds to ttl, and answers as one lease's
	// renewal would: OK, refused (with the holder found), or an error
	// when nothing was confirmed.
	renew(ctx context.Context, value string, ttl time.Duration) (lease.Renewal, error)
	// release deletes what value holds (void: cancels value, which also
	// refuses a call of it still on its way), tells this process's
	// waiters of the passes it made, and answers as one lease's release
	// would. It is the final delete, sent by the owner of the guard's
	// end, and a try goes on from the tries before it.
	release(ctx context.Context, value string, void bool) (lease.Release, error)
	// giveUp gives back, in the background and until end at the latest,
	// what value still holds after a final loss, if anything.
	giveUp(value string, void bool, end time.Time)
	// batchable reports whether its renewals may share the client's
	// renewal batches (batcher.go).
	batchable() bool
	// tokenOf returns the fencing token of name, given the guard's token,
	// and 0 for a name it does not hold.
	tokenOf(name string, token int64) int64
	// refusedKey returns the lease key to name in the LostError of a
	// refused renewal.
	refusedKey() string
}

// An engine is the holding of a guard of one lease, and a set's hold that
// of a MultiMutex's guard.
var (
	_ holding = (*engine)(nil)
	_ holding = (*setHold)(nil)
)

func (e *engine) renew(ctx context.Context, value string, ttl time.Duration) (lease.Renewal, error) {
	return e.store.Renew(ctx, e.keys, value, ttl)
}

func (e *engine) release(ctx context.Context, value string, void bool) (lease.Release, error) {
	sent := time.Now()
	var r lease.Release
	var err error
	if void {
		r, err = e.store.Cancel(ctx, e.keys, value, e.ttl)
	} else {
		r, err = e.store.Release(ctx, e.keys, value)
	}
	// The release passed the lock to the next in line; if that waiter is
	// in this process, it wakes now rather than at the announcement.
	deliverPasses(e, r, sent)
	return r, err
}

// giveUp cancels value when the acquisition left a call of it whose
// outcome it never saw (void): that call may still reach Redis and grant
// the value anew, so a void marker refuses it and a grant it made already
// is deleted, as a Lock that gives up does. Otherwise a refused lease has
// nothing left to give back.
func (e *engine) giveUp(value string, void bool, _ time.Time) {
	if !void {
		return
	}
	proc.goWork(func() {
		defer proc.work.done()
		e.cleanup(context.Background(), value, true)
	})
}

func (e *engine) batchable() bool { return true }

func (e *engine) tokenOf(name string, token int64) int64 {
	if name == e.name {
		return token
	}
	return 0
}

func (e *engine) refusedKey() string { return e.keys.Lease }
