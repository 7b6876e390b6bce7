package distlock

import (
	"context"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/lease"
)

// A Mutex is a named distributed lock. It holds the lock's configuration and
// no state: every successful Lock returns a new [Guard] that owns one
// acquisition. A Mutex is safe for concurrent use, and several goroutines may
// call Lock on the same Mutex; they contend for the lock exactly as separate
// processes would. Unlike a sync.Mutex, the zero Mutex cannot be used, since
// it has no Redis client: make one with [NewMutex]. Its methods return an
// error matching [ErrInvalidOption].
//
// An [RWMutex] or an [Election] of the same name and namespace is the same
// lock: a Mutex's hold excludes an RWMutex's readers and writer (and
// `distlock run` of the name, with -s or without), and they wait in one
// line in arrival order (see "One name, one lock" on [RWMutex]). A
// [Semaphore] of the same name is refused with [ErrWrongKind].
type Mutex struct {
	e engine
}

// NewMutex returns a Mutex for the lock named key, reached through client.
//
// The client is shared, not owned: the Mutex and its guards never close it,
// and rueidis multiplexes all their commands over its connections. A
// standalone, Sentinel or Cluster client works the same way.
//
// The key and namespace (see [WithNamespace]) are each 1 to 512 (namespace:
// 128) bytes of printable UTF-8 (letters, digits, punctuation, symbols and
// the ASCII space) and must not contain '{' or '}'. The lease is stored at
// "namespace:{key}", and the lock's other keys share the "{key}" hash tag so
// that they land in one Redis Cluster slot.
//
// NewMutex checks its arguments and options and returns an error matching
// [ErrInvalidOption] (a [*OptionError] naming the field) for the first one
// that is wrong; it sends nothing to Redis.
func NewMutex(client rueidis.Client, key string, opts ...Option) (*Mutex, error) {
	return NewMutexOn(lease.FromRueidis(client), key, opts...)
}

// NewMutexOn is [NewMutex] on any client that implements the seam
// [lease.Redis]. The module github.com/distkit-go/distlock/goredis calls
// it for a go-redis client; a Mutex made either way is the same, and
// processes on either client share one lock of a name.
func NewMutexOn(client lease.Redis, key string, opts ...Option) (*Mutex, error) {
	m := new(Mutex)
	if err := m.e.init(client, key, kindMutex, 0, opts); err != nil {
		return nil, err
	}
	return m, nil
}

// Key returns the Redis key that holds the lease, such as "distlock:{job}".
func (m *Mutex) Key() string { return m.e.keys.Lease }

// Owner returns the owner id written into the lease by this Mutex's
// acquisitions.
func (m *Mutex) Owner() string { return m.e.owner }

// Lock acquires the lock, waiting while someone else holds it.
//
// It tries at once. While the lock is held it waits without polling: it
// stands in the lock's line in Redis, first come first served across
// processes, and the holder's release passes the lock straight to the first
// waiter in line and wakes it (through Redis pub/sub, or from the release's
// reply when the holder is in the same process). The first in line also
// takes over when the holder's lease runs out, in case the holder died; a
// waiter refreshes its place every half claim window ([WithClaimWindow]).
// [WithRetryInterval] selects plain polling instead. Lock waits until it acquires the lock, the max wait
// ([WithMaxWait]) runs out, or ctx is done. On success it returns a [Guard]
// whose lease is renewed in the background.
//
// ctx bounds both the wait and the hold: if ctx is cancelled after the lock
// was acquired, the guard releases it, just as [Guard.Release] would. To
// bound only the wait, use [WithMaxWait] or [Mutex.TryLockFor] and pass a
// context that lives as long as the critical section.
//
// When ctx ends first, the error matches ctx.Err() under [errors.Is]; when
// the max wait runs out, it matches [ErrTimeout] and is a [*TimeoutError].
// A Redis error ends the wait at once and is returned wrapped. If an attempt
// was in flight when Lock gave up, Lock deletes whatever that attempt may
// have written before it returns, and voids the attempt's value for one TTL
// so that the attempt cannot write it later (best effort: if that clean-up
// does not reach Redis, an orphan expires within the TTL). Lock is safe for
// concurrent use.
func (m *Mutex) Lock(ctx context.Context) (*Guard, error) {
	return m.e.lock(ctx, "Mutex")
}

// TryLock makes a single attempt to acquire the lock. If someone else holds
// it, TryLock returns an error matching [ErrNotAcquired] (a
// [*NotAcquiredError] that names the holder). Like [Mutex.Lock], ctx bounds
// the attempt and the hold. The attempt waits for Redis's reply at most
// [MaxReplyWait] or a little under the TTL, whichever is shorter, then
// returns an error matching [ErrNoReply] (see there); to bound it more
// tightly without bounding the hold, use [Mutex.TryLockFor], whose timeout
// also ends an attempt in flight.
func (m *Mutex) TryLock(ctx context.Context) (*Guard, error) {
	return m.e.try(ctx, "Mutex")
}

// TryLockFor tries to acquire the lock for up to timeout, polling: it
// retries every retryInterval (0 retries at once) and does not join the
// queue that [Mutex.Lock] waits in. When timeout runs out it returns an
// error matching [ErrTimeout]; a timeout of 0 makes a single attempt, as
// [Mutex.TryLock] does. Negative durations are refused with
// [ErrInvalidOption]. Like [Mutex.Lock], ctx bounds the wait and the hold,
// and when ctx ends first the error matches ctx.Err().
func (m *Mutex) TryLockFor(ctx context.Context, timeout, retryInterval time.Duration) (*Guard, error) {
	return m.e.tryFor(ctx, "Mutex", timeout, retryInterval)
}
