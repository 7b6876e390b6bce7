package distlock

import (
	"context"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/lease"
)

// MaxPermits is the largest number of permits a [Semaphore] may have.
const MaxPermits = 1 << 20

// A Semaphore is a named distributed counting semaphore kept in Redis: up
// to a fixed number of holders at once, each with a lease of its own that
// its [Guard] renews, exactly as a [Mutex] guard renews its lock. It holds
// configuration only and is safe for concurrent use. Make one with
// [NewSemaphore]; the methods of the zero Semaphore return an error matching
// [ErrInvalidOption].
//
// A permit is a lease: the guard says Acquired only while Redis cannot yet
// have expired it (the same contract as a Mutex guard), a holder that
// crashes gives its permit back when its lease ends, without anyone
// running anything first, and every grant carries a fencing token that is
// strictly greater than every earlier grant's token of the same semaphore.
//
// Waiting works as for a Mutex: [Semaphore.Acquire] stands in the
// semaphore's line in Redis, first come first served across processes, and
// a release hands the freed permit to the oldest live waiter within the
// same script and wakes it. The first in line also takes a permit whose
// holder died, the moment its lease ends.
//
// # Changing the number of permits
//
// The number of permits is not stored as a rule in Redis: each call uses
// the number its Semaphore was made with. A grant is made only while fewer
// holders than the caller's number hold a permit, and a release passes
// freed permits on only while fewer holders than the releaser's number
// remain. So, when a deployment lowers the number from 8 to 4:
//
//   - holders above the new number keep their permits (a guard is never
//     told it lost a lease that Redis still holds for it) until they
//     release them or lose them;
//   - no new permit is granted, by a caller with the new number, until
//     fewer than 4 are held;
//   - while old and new callers run side by side, at most 8 are held, and
//     the old ones may still be granted permits 5 to 8.
//
// Raising the number takes effect at the next acquire or release made
// with it: free permits go to the waiters in line at once. `distlock
// inspect` shows the number that the last grant was made under.
//
// A Semaphore and a [Mutex], an [Election] or an [RWMutex] of the same
// name and namespace share their keys, and refuse each other: a call of
// one on the other's lease returns an error matching [ErrWrongKind],
// writes nothing and leaves the other's holder alone.
type Semaphore struct {
	e engine
}

// NewSemaphore returns a Semaphore of permits permits (1 to [MaxPermits])
// named key, reached through client. The key, the namespace and every
// option follow the rules of [NewMutex]; [WithClaimWindow] and
// [WithMaxWait] apply to [Semaphore.Acquire] as they apply to
// [Mutex.Lock]. Bad input returns an error matching [ErrInvalidOption],
// and nothing is sent to Redis.
//
// The holders are kept in a sorted set at "namespace:{key}", scored by the
// end of each one's lease; the other keys share the "{key}" hash tag, so
// in Redis Cluster the whole semaphore lives in one slot.
func NewSemaphore(client rueidis.Client, key string, permits int, opts ...Option) (*Semaphore, error) {
	return NewSemaphoreOn(lease.FromRueidis(client), key, permits, opts...)
}

// NewSemaphoreOn is [NewSemaphore] on any client that implements the seam
// [lease.Redis], as [NewMutexOn] is for a Mutex.
func NewSemaphoreOn(client lease.Redis, key string, permits int, opts ...Option) (*Semaphore, error) {
	switch {
	case permits < 1:
		return nil, invalid("permits", "%d is less than 1", permits)
	case permits > MaxPermits:
		return nil, invalid("permits", "%d is more than the maximum of %d", permits, MaxPermits)
	}
	s := new(Semaphore)
	if err := s.e.init(client, key, kindSemaphore, permits, opts); err != nil {
		return nil, err
	}
	return s, nil
}

// Key returns the Redis key that holds the semaphore's holders, such as
// "distlock:{workers}".
func (s *Semaphore) Key() string { return s.e.keys.Lease }

// Permits returns the number of permits the Semaphore grants up to.
func (s *Semaphore) Permits() int { return s.e.keys.Permits }

// Owner returns the owner id written into the semaphore's holder values.
func (s *Semaphore) Owner() string { return s.e.owner }

// Acquire takes a permit, waiting in line while all are held, as
// [Mutex.Lock] waits for a lock. It returns a [Guard] whose lease is
// renewed in the background; releasing the guard gives the permit back.
// ctx bounds the wait and the hold, and the errors are those of
// [Mutex.Lock].
func (s *Semaphore) Acquire(ctx context.Context) (*Guard, error) {
	return s.e.lock(ctx, "Semaphore")
}

// TryAcquire makes a single attempt to take a permit. When all are held,
// or others wait in line for the one that is free, it returns an error
// matching [ErrNotAcquired] (a [*NotAcquiredError] whose Permits is set).
func (s *Semaphore) TryAcquire(ctx context.Context) (*Guard, error) {
	return s.e.try(ctx, "Semaphore")
}

// TryAcquireFor tries to take a permit for up to timeout, retrying every
// retryInterval, as [Mutex.TryLockFor] does: it never stands in line, nor
// takes a permit ahead of those who do.
func (s *Semaphore) TryAcquireFor(ctx context.Context, timeout, retryInterval time.Duration) (*Guard, error) {
	return s.e.tryFor(ctx, "Semaphore", timeout, retryInterval)
}
