package distlock

import (
	"context"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/lease"
)

// A MultiMutex is a distributed lock over several names at once: Lock
// returns holding every name, or holds none. Each name is the same lock as
// a [Mutex] of that name (and as the exclusive side of an [RWMutex] of
// it): a MultiMutex on {a, b} excludes NewMutex(client, "a"), and waits
// behind it in a's line like any other waiter.
//
// # Order, deadlock and fairness
//
// Whatever order the names are given in, a request takes them in one
// order that every process agrees on: by Redis Cluster slot, then by key
// (see [lease.SortSet]). It holds the names it has taken while it waits
// for the next one, standing in that name's line, and it stands in every
// line with one ticket, taken the first time it stood in line. So:
//
//   - It cannot deadlock, with other MultiMutexes or with single locks. A
//     request holds only names that come before the one it waits for, and
//     the holder of a single lock waits for nothing; every wait therefore
//     points at the holder of a later name, or at a request ahead in the
//     same line that waits for the same holder, and no chain of waits can
//     close into a circle. Two requests on {a, b} and {b, a}, or a chain
//     {a, b}, {b, c}, {c, a}, take their shared names in the same order.
//     (This assumes what it says: a holder waits for nothing. A program
//     that holds a lock and then waits for another, a Mutex inside a
//     Mutex or a MultiMutex inside a guard, steps outside the order and
//     can deadlock as nested locks always can. Take such names in one
//     MultiMutex, or nest them in the order that [MultiMutex.Keys] gives.)
//   - Every line orders the requests in it by their ticket, the moment each
//     first stood in line, so a request that waits for a name is served
//     before every request that began to wait after it, in every line it
//     meets them in; within a line, a MultiMutex and the Mutexes of the
//     name are served first come, first served.
//   - What a waiting request costs the others: the names before the one it
//     waits for stay held while it waits (that is the price of deadlock
//     freedom without giving them back), but each with a lease of only the
//     claim window ([WithClaimWindow]), renewed while the request waits.
//     A waiter that dies frees them within its claim window. A later
//     request may take a free name that an earlier request has not reached
//     yet; it never takes one that the earlier request waits for.
//
// Once every name is held, Lock returns one [Guard] for the set: one actor
// renews every name (one script per slot, as batched renewals are), and
// the guard is Lost when any name's lease is in doubt past its deadline or
// refused; Release and Leave end every name. [Guard.Token] is the token of
// the first name given, [Guard.TokenOf] each name's.
//
// # Costs
//
// On one Redis server, or when the names share a Cluster slot (a shared
// hash tag is not possible: each name is its own tag), an acquisition
// costs one script and a release one script, whatever the number of names.
// Names over several slots cost one script per slot: one after the other,
// in the set's order, to acquire; all at once to renew and to release, so
// that a slow or unreachable node holds up no other (lease/COSTS.md).
//
// A MultiMutex is safe for concurrent use; the zero MultiMutex cannot be
// used: make one with [NewMultiMutex].
type MultiMutex struct {
	names []string
	set   *lockSet
}

// lockSet is what a MultiMutex's guard shares with it: the engines of its
// names, in the order the set takes them, and where each group (the names
// one script may serve) begins.
type lockSet struct {
	engines []engine     // a Mutex's engine for each name, in the order given
	order   []int        // order[i]: the index in engines of the set's i-th name
	keys    []lease.Keys // the names' keys, in the set's order
	groups  []int        // the first index of each group, and len(keys)
	store   setStore
}

// setStore is the lease protocol of a set, as *lease.Client serves it.
type setStore interface {
	AcquireAll(ctx context.Context, ks []lease.Keys, value string, ttl time.Duration, p *lease.Place) (lease.SetGrant, error)
	ReleaseAll(ctx context.Context, ks []lease.Keys, value string) ([]lease.Release, error)
	CancelAll(ctx context.Context, ks []lease.Keys, value string, ttl time.Duration) ([]lease.Release, error)
	CancelAllDedicated(ctx context.Context, ks []lease.Keys, value string, ttl time.Duration) ([]lease.Release, error)
	RenewBatch(ctx context.Context, items []lease.RenewItem, out []lease.Renewal) error
	BatchGroup(k lease.Keys) string
}

// kindMultiMutex names a MultiMutex in the Observer's infos.
const kindMultiMutex = "multimutex"

// NewMultiMutex returns a MultiMutex over names, reached through client.
// Each name follows the rules of [NewMutex]'s key; there must be 1 to 64
// ([lease.MaxSet]) of them, none twice. The options are a Mutex's, and
// apply to every name. Like NewMutex it sends nothing to Redis, and
// returns an error matching [ErrInvalidOption] for a bad name or option.
func NewMultiMutex(client rueidis.Client, names []string, opts ...Option) (*MultiMutex, error) {
	return NewMultiMutexOn(lease.FromRueidis(client), names, opts...)
}

// NewMultiMutexOn is [NewMultiMutex] on any client that implements the
// seam [lease.Redis]; the module github.com/distkit-go/distlock/goredis
// calls it for a go-redis client.
func NewMultiMutexOn(client lease.Redis, names []string, opts ...Option) (*MultiMutex, error) {
	switch {
	case len(names) == 0:
		return nil, invalid("names", "is empty")
	case len(names) > lease.MaxSet:
		return nil, invalid("names", "has %d names, more than %d", len(names), lease.MaxSet)
	}
	s := &lockSet{engines: make([]engine, len(names)), order: make([]int, len(names)), keys: make([]lease.Keys, len(names))}
	for i, name := range names {
		for _, other := range names[:i] {
			if other == name {
				return nil, invalid("names", "has %q twice", name)
			}
		}
		e := &s.engines[i]
		if err := e.init(client, name, kindMutex, 0, opts); err != nil {
			return nil, err
		}
		e.kind = kindMultiMutex
		s.keys[i] = e.keys
	}
	st, ok := s.engines[0].store.(setStore)
	if !ok {
		return nil, invalid("client", "cannot serve a set of locks")
	}
	s.store = st
	// The set's order: the keys sorted, and where each name was given.
	if err := lease.SortSet(s.keys); err != nil {
		return nil, invalid("names", "%v", err)
	}
	for i, k := range s.keys {
		for j := range s.engines {
			if s.engines[j].keys.Lease == k.Lease {
				s.order[i] = j
			}
		}
		if i == 0 || st.BatchGroup(k) != st.BatchGroup(s.keys[i-1]) {
			s.groups = append(s.groups, i)
		}
	}
	s.groups = append(s.groups, len(s.keys))
	return &MultiMutex{names: append([]string(nil), names...), set: s}, nil
}

// Names returns the names, in the order they were given.
func (m *MultiMutex) Names() []string { return append([]string(nil), m.names...) }

// Keys returns the Redis keys that hold the names' leases, in the order
// the set takes them.
func (m *MultiMutex) Keys() []string {
	keys := make([]string, len(m.set.keys))
	for i, k := range m.set.keys {
		keys[i] = k.Lease
	}
	return keys
}

// Lock acquires every name, waiting while any is held, as [Mutex.Lock]
// waits for one: in the names' lines in Redis, without polling, one name
// after the other in the set's order (see "Order, deadlock and fairness"
// above). It returns a [Guard] that holds them all, or an error and holds
// none.
//
// ctx bounds the wait and the hold, as for Mutex.Lock. When ctx ends, or
// the max wait ([WithMaxWait]) runs out, Lock returns at once with an
// error matching ctx.Err() (or [ErrTimeout]); in the background it gives
// back every name it held and leaves every line it stood in (the names
// that a release was passing to it at that moment are passed on within
// their claim window at worst). On each name that a call of it reached
// it leaves the void marker of its value, the key
// "<lease key>:void:<value>", for one TTL, so that a call still on its
// way cannot take the name or stand in its line after Lock gave up (see
// [Mutex.Lock]); the names after the one it waited for, which no call
// reached, it does not touch. It is safe for concurrent use.
func (m *MultiMutex) Lock(ctx context.Context) (*Guard, error) {
	if m.set == nil {
		return nil, zeroValue("MultiMutex")
	}
	e := m.set.first()
	return m.acquire(ctx, e.lockMode(), e.maxWait, e.retryInterval)
}

// TryLock makes a single attempt to take every name: it takes all of them,
// or none and leaves every name as it found it. Within a group (one
// server, or one Cluster slot) it grants no name before it knows that
// none is held, so a refused attempt issues no fencing token for the
// free names; over several groups, the groups before the one with a held
// name are taken and given back again, and their tokens have moved on.
// When a name is held it returns an
// error matching [ErrNotAcquired], a [*NotAcquiredError] that names that
// name's key and its holder. Like [MultiMutex.Lock], ctx bounds the
// attempt and the hold.
func (m *MultiMutex) TryLock(ctx context.Context) (*Guard, error) {
	if m.set == nil {
		return nil, zeroValue("MultiMutex")
	}
	return m.acquire(ctx, once, 0, 0)
}

// TryLockFor tries to take every name for up to timeout, polling as
// [Mutex.TryLockFor] does: each try is a [MultiMutex.TryLock], all or
// nothing, and retryInterval apart (0: at once). It never stands in line.
func (m *MultiMutex) TryLockFor(ctx context.Context, timeout, retryInterval time.Duration) (*Guard, error) {
	if m.set == nil {
		return nil, zeroValue("MultiMutex")
	}
	switch {
	case timeout < 0:
		return nil, invalid("timeout", "%v is negative", timeout)
	case retryInterval < 0:
		return nil, invalid("retry interval", "%v is negative", retryInterval)
	case timeout == 0:
		return m.acquire(ctx, once, 0, 0)
	}
	return m.acquire(ctx, polling, timeout, retryInterval)
}

// first returns the engine of the first name given: the guard's, whose
// key and token it reports.
func (s *lockSet) first() *engine { return &s.engines[0] }

// engine returns the engine of the set's i-th name.
func (s *lockSet) engine(i int) *engine { return &s.engines[s.order[i]] }

// posOf returns where in the set's order the j-th name given is.
func (s *lockSet) posOf(j int) int {
	for i, o := range s.order {
		if o == j {
			return i
		}
	}
	return -1
}

// group returns the keys of group gi.
func (s *lockSet) group(gi int) []lease.Keys { return s.keys[s.groups[gi]:s.groups[gi+1]] }

// reachedOf returns the keys of group gi that a request's calls reached:
// the first reached[gi].
func (s *lockSet) reachedOf(gi int, reached []int) []lease.Keys {
	return s.keys[s.groups[gi] : s.groups[gi]+reached[gi]]
}

// ngroups returns the number of groups.
func (s *lockSet) ngroups() int { return len(s.groups) - 1 }

// deliver tells the waiters of this process of the passes that the
// releases rs of the names from index at on made.
func (s *lockSet) deliver(at int, rs []lease.Release, sent time.Time) {
	for i, r := range rs {
		deliverPasses(s.engine(at+i), r, sent)
	}
}

// eachGroup calls f for every group of s, at once when there are several
// (so that a slow or unreachable node holds up no other), and returns once
// every call has.
func (s *lockSet) eachGroup(f func(gi int)) {
	if s.ngroups() == 1 {
		f(0)
		return
	}
	var wg sync.WaitGroup
	for gi := range s.ngroups() {
		wg.Go(func() { f(gi) })
	}
	wg.Wait()
}

// TokenOf returns the fencing token of name, one of a [MultiMutex]'s
// names, drawn from that name's own sequence (as a [Mutex] of the name
// would have drawn it): guard each name's resource with its own token. On
// the guard of a single lock it returns [Guard.Token] for that lock's name.
// For a name the guard does not hold it returns 0.
func (g *Guard) TokenOf(name string) int64 {
	if g == nil {
		return 0
	}
	return g.hold.tokenOf(name, g.token)
}
