package distlock

import (
	"cmp"
	"context"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// The hold of a MultiMutex: what its guard holds, its renewals and its
// release.

// setHold is the holding of a MultiMutex's guard (see holding): the set,
// and the token of each of its names.
type setHold struct {
	set    *lockSet
	tokens []int64 // in the set's order
	// refused is the lease key of the name whose renewal was refused, for
	// the guard's LostError; written by the renewal that found it, read by
	// the actor once that renewal has answered.
	refused string
	// What the final delete's tries have learnt: the groups answered, and
	// whether every name answered so far was still held until deleted.
	// Only the owner of the guard's end touches them.
	answered []bool
	notHeld  bool
}

// refusal names a lease whose renewal Redis refused, and what it found
// there instead.
type refusal struct{ key, holder string }

// renew renews group gi's leases with value to ttl, in one script, and
// returns the first refusal, or nil when every one of them was extended.
func (s *lockSet) renew(ctx context.Context, gi int, value string, ttl time.Duration) (*refusal, error) {
	ks := s.group(gi)
	if s.engines[0].ack.Replicas > 0 {
		// A client that waits for replicas renews one lease at a time.
		for _, k := range ks {
			r, err := s.engines[0].store.Renew(ctx, k, value, ttl)
			switch {
			case err != nil:
				return nil, err
			case !r.OK:
				return &refusal{k.Lease, r.Holder}, nil
			}
		}
		return nil, nil
	}
	items := make([]lease.RenewItem, len(ks))
	for i, k := range ks {
		items[i] = lease.RenewItem{Keys: k, Value: value, TTL: ttl}
	}
	out := make([]lease.Renewal, len(ks))
	if err := s.store.RenewBatch(ctx, items, out); err != nil {
		return nil, err
	}
	for i, r := range out {
		if !r.OK {
			return &refusal{ks[i].Lease, r.Holder}, nil
		}
	}
	return nil, nil
}

// renew renews every name of the set with value to ttl, one script per
// group, and answers as one lease's renewal would: OK when every name was
// extended, refused (with the holder found) when any was refused, and an
// error when a group got no answer and none was refused.
func (h *setHold) renew(ctx context.Context, value string, ttl time.Duration) (lease.Renewal, error) {
	s := h.set
	refusals := make([]*refusal, s.ngroups())
	errs := make([]error, s.ngroups())
	s.eachGroup(func(gi int) { refusals[gi], errs[gi] = s.renew(ctx, gi, value, ttl) })
	for gi, refused := range refusals {
		if refused != nil && errs[gi] == nil {
			h.refused = refused.key
			return lease.Renewal{Holder: refused.holder}, nil
		}
	}
	for _, err := range errs {
		if err != nil {
			return lease.Renewal{}, err
		}
	}
	return lease.Renewal{OK: true}, nil
}

// release releases (or, with void, cancels) every name of the set, one
// script per group, and answers as one lease's release would: Deleted
// when every name still held value until it was deleted. It tells this
// process's waiters of the passes at once. A try goes on from the tries
// before it: a group already answered is not sent again.
func (h *setHold) release(ctx context.Context, value string, void bool) (lease.Release, error) {
	s := h.set
	if h.answered == nil {
		h.answered = make([]bool, s.ngroups())
	}
	results := make([][]lease.Release, s.ngroups())
	errs := make([]error, s.ngroups())
	s.eachGroup(func(gi int) {
		if h.answered[gi] {
			return // a try before this one released it
		}
		sent := time.Now()
		if void {
			results[gi], errs[gi] = s.store.CancelAll(ctx, s.group(gi), value, s.engines[0].ttl)
		} else {
			results[gi], errs[gi] = s.store.ReleaseAll(ctx, s.group(gi), value)
		}
		if errs[gi] == nil {
			s.deliver(s.groups[gi], results[gi], sent)
		}
	})
	var firstErr error
	for gi, err := range errs {
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		if results[gi] != nil {
			h.answered[gi] = true
		}
		for _, r := range results[gi] {
			h.notHeld = h.notHeld || !r.Deleted
		}
	}
	return lease.Release{Deleted: !h.notHeld && firstErr == nil}, firstErr
}

// giveUp releases, in the background, the names of a set whose loss is
// final (one of them was refused), until end at the latest: the others
// are held for nothing, and go back to their lines now rather than at the
// end of their leases. The guard is retired: nothing else sends for it,
// so the final delete's state is this goroutine's alone. A failure leaves
// the names to expire.
func (h *setHold) giveUp(value string, void bool, end time.Time) {
	proc.goWork(func() {
		defer proc.work.done()
		ctx, cancel := context.WithDeadline(context.Background(), end)
		defer cancel()
		_, _ = h.release(ctx, value, void)
	})
}

// batchable reports false: a set's renewals go as batches of their own,
// one script per group.
func (h *setHold) batchable() bool { return false }

// tokenOf returns the token of name, one of the set's.
func (h *setHold) tokenOf(name string, _ int64) int64 {
	s := h.set
	for i := range s.keys {
		if s.engine(i).name == name {
			return h.tokens[i]
		}
	}
	return 0
}

// refusedKey returns the key of the name whose renewal was refused, and
// before any was, the first name's.
func (h *setHold) refusedKey() string {
	if h.refused != "" {
		return h.refused
	}
	return h.set.first().keys.Lease
}
