package distlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/actor"
	"github.com/distkit-go/distlock/lease"
)

// An RWMutex is a named distributed read-write lock kept in Redis: many
// readers at once, or one writer. It holds configuration only and is safe
// for concurrent use; every successful RLock, Lock and their Try forms
// returns a new [Guard], the same type a [Mutex] returns, renewed,
// released and watched the same way. Make one with [NewRWMutex]; the
// methods of the zero RWMutex return an error matching [ErrInvalidOption].
//
// # Order
//
// Readers and writers stand in one line per lock in Redis, in the order
// they arrive, across processes. A reader is granted when no writer holds
// the lock and no writer stands ahead of it; a writer when nobody holds it
// and nobody stands ahead. So a reader that arrives while a writer waits
// queues behind that writer (writers do not starve), and a writer never
// waits for readers that came after it (nor do readers starve). A writer's
// release grants the whole run of readers at the head of the line in the
// same script, each woken in its process at once; the release of the last
// reader of a run grants the writer behind it. [RWMutex.TryRLock] and
// [RWMutex.TryLock] never stand in line and never get ahead of someone who
// does: a TryRLock while readers hold and a writer waits is refused.
//
// # Leases
//
// Every hold, read or write, is a lease of its own in Redis, renewed by
// its own guard, under the contract of a [Mutex] guard: a guard says
// Acquired only while Redis cannot have expired its lease. A reader that
// crashes, is paused or cut off stops counting when its own lease ends,
// whatever the other readers do, and the waiter first in line takes the
// lock at that moment.
//
// # Fencing
//
// Every grant, read or write, has a token ([Guard.Token]) above the token
// of every earlier grant of the lock: a writer's token is above that of
// every reader granted before it. A store can therefore refuse a stale
// writer's write (a token below the highest it has seen from a writer),
// and a reader can tell whether it has seen the latest writer's write
// (whose token is below its own).
//
// # Downgrade, and no upgrade
//
// [Guard.Downgrade] turns a write hold into a read hold of the same guard,
// in one script: the guard stays Acquired, with its token, and the readers
// waiting at the head of the line are granted at once. There is no
// upgrade: two readers that both wait to become the writer would wait for
// each other forever. To write after reading, release the read guard and
// call Lock, then check again what was read, since another writer may have
// come in between:
//
//	g.Release(ctx)
//	w, err := rw.Lock(ctx)
//	// read again under w before writing
//
// # One name, one lock
//
// A [Mutex] (or an [Election]) of the same name and namespace is the same
// lock, held the way Lock holds it: any hold that excludes excludes every
// other hold, whichever type took it, and only readers share. They stand
// in the one line, in arrival order: a Mutex that arrives while readers
// hold waits behind them, and readers that arrive behind a waiting Mutex
// wait for it as behind a writer. The hand-offs between them are made in
// the releasing script, as between readers and writers: a Mutex's release
// grants the run of readers at the head of the line, and the last
// reader's release grants a Mutex first in line. Their grants share one
// fencing sequence. So a service that guards a job with a Mutex and a
// cron line "distlock run" of the same name (which takes an RWMutex, for
// writing unless -s) exclude each other.
//
// A [Semaphore] of the same name refuses the lock, and the lock refuses
// it, with an error matching [ErrWrongKind]; nothing is written and the
// other's holders are not disturbed.
//
// In Redis, readers are fields of a hash at "namespace:{key}", a writer
// the hash's field "~w", and a Mutex's hold the string that a Mutex has
// always written; the scripts of every type read both.
type RWMutex struct {
	r, w engine // the engines of RLock and of Lock: one lock, two modes
}

// NewRWMutex returns an RWMutex for the lock named key, reached through
// client. The key, the namespace and every option follow the rules of
// [NewMutex]; [WithMaxWait], [WithClaimWindow] and [WithRetryInterval]
// apply to RLock and Lock as to [Mutex.Lock]. Bad input returns an error
// matching [ErrInvalidOption], and nothing is sent to Redis.
func NewRWMutex(client rueidis.Client, key string, opts ...Option) (*RWMutex, error) {
	return NewRWMutexOn(lease.FromRueidis(client), key, opts...)
}

// NewRWMutexOn is [NewRWMutex] on any client that implements the seam
// [lease.Redis], as [NewMutexOn] is for a Mutex.
func NewRWMutexOn(client lease.Redis, key string, opts ...Option) (*RWMutex, error) {
	rw := new(RWMutex)
	for _, e := range []*engine{&rw.r, &rw.w} {
		if err := e.init(client, key, kindRWMutex, 0, opts); err != nil {
			return nil, err
		}
	}
	rw.r.keys, rw.w.keys = rw.r.keys.RW(lease.Read), rw.w.keys.RW(lease.Write)
	return rw, nil
}

// Key returns the Redis key that holds the lock's holders, such as
// "distlock:{config}".
func (rw *RWMutex) Key() string { return rw.w.keys.Lease }

// Owner returns the owner id written into the lock's holder values.
func (rw *RWMutex) Owner() string { return rw.w.owner }

// RLock acquires the lock for reading, waiting in line while a writer
// holds it or stands ahead (see "Order" on [RWMutex]). ctx bounds the
// wait and the hold, and the errors are those of [Mutex.Lock].
func (rw *RWMutex) RLock(ctx context.Context) (*Guard, error) { return rw.r.lock(ctx, "RWMutex") }

// TryRLock makes a single attempt to acquire the lock for reading. When a
// writer holds it, or anyone stands in line, it returns an error matching
// [ErrNotAcquired]. Like [RWMutex.RLock], ctx bounds the attempt and the
// hold.
func (rw *RWMutex) TryRLock(ctx context.Context) (*Guard, error) { return rw.r.try(ctx, "RWMutex") }

// TryRLockFor tries to acquire the lock for reading for up to timeout,
// polling every retryInterval, as [Mutex.TryLockFor] does: it never stands
// in line, nor gets ahead of those who do.
func (rw *RWMutex) TryRLockFor(ctx context.Context, timeout, retryInterval time.Duration) (*Guard, error) {
	return rw.r.tryFor(ctx, "RWMutex", timeout, retryInterval)
}

// Lock acquires the lock for writing, waiting in line while anyone holds
// it or stands ahead. ctx bounds the wait and the hold, and the errors are
// those of [Mutex.Lock].
func (rw *RWMutex) Lock(ctx context.Context) (*Guard, error) { return rw.w.lock(ctx, "RWMutex") }

// TryLock makes a single attempt to acquire the lock for writing. When
// anyone holds it or stands in line, it returns an error matching
// [ErrNotAcquired].
func (rw *RWMutex) TryLock(ctx context.Context) (*Guard, error) { return rw.w.try(ctx, "RWMutex") }

// TryLockFor tries to acquire the lock for writing for up to timeout,
// polling every retryInterval, as [Mutex.TryLockFor] does.
func (rw *RWMutex) TryLockFor(ctx context.Context, timeout, retryInterval time.Duration) (*Guard, error) {
	return rw.w.tryFor(ctx, "RWMutex", timeout, retryInterval)
}

// mode returns how g holds its lock: lease.Read or lease.Write for an
// RWMutex's guard, 0 for the other kinds.
func (g *Guard) mode() lease.Mode {
	if m := g.e.keys.Mode; m != lease.Write || !g.downgraded.Load() {
		return m
	}
	return lease.Read
}

// downgrader is the part of the store that only read-write locks use;
// *lease.Client has it.
type downgrader interface {
	Downgrade(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (bool, lease.Release, error)
}

// Downgrade turns a write hold of an [RWMutex] into a read hold of the
// same guard, in one script: the guard stays Acquired, with its token and
// deadline, and renews from then on as a reader; the readers waiting at
// the head of the line (up to the next writer) are granted at once.
//
// It returns an error matching [ErrNotWriteLock] and changes nothing for a
// read guard (or one downgraded already) and for a guard of another kind;
// one matching [ErrReleased] or [ErrLost] when the guard's end has begun
// or its lease is in doubt, without sending anything. A Downgrade that
// gets no reply (a reset connection) may or may not have run; it is sent
// again with back-off, as [Guard.Release] is (the script is idempotent),
// while ctx and the lease deadline allow, and the error of the last try is
// returned if none was answered: the guard then still renews whatever
// hold it has. When Redis finds that the guard no longer holds the lock,
// the guard becomes Lost and the error matches [ErrLost].
//
// The guard's actor sends the script (Downgrade starts the actor if the
// guard has none yet, and it then runs until the guard ends) and Downgrade waits for its answer: one round trip.
// When ctx ends first, Downgrade returns ctx's error and the script, if it
// was sent, is cancelled. It is safe for concurrent use: Downgrades of one
// guard run one after the other, and a Release that comes meanwhile
// cancels the one in flight.
func (g *Guard) Downgrade(ctx context.Context) error {
	if g == nil {
		return errNilGuard()
	}
	e := g.e
	if ctx == nil {
		return badArgument("ctx", "is nil")
	}
	if _, ok := e.store.(downgrader); e.kind != kindRWMutex || !ok {
		return fmt.Errorf("%w: the guard of %s is a %s's", ErrNotWriteLock, e.keys.Lease, e.kind)
	}
	if g.mode() != lease.Write {
		return fmt.Errorf("%w: the guard of %s holds it for reading", ErrNotWriteLock, e.keys.Lease)
	}
	// The owner moves one way only (see Guard.end): read it at most
	// three times.
	a := g.owner.Load()
	if a == nil {
		act := newGuardActor(g)
		if g.owner.CompareAndSwap(nil, act) {
			go act.run()
		}
		a = g.owner.Load()
	}
	if a != ending && a != retired {
		err, cerr := actor.Call(ctx, a.a, func(r actor.Reply[error]) guardMsg { return downgradeMsg{ctx: ctx, reply: r} })
		switch {
		case cerr == nil:
			return err
		case !errors.Is(cerr, actor.ErrStopped):
			return fmt.Errorf("distlock: downgrading %s: %w", e.keys.Lease, cerr)
		}
		a = g.owner.Load() // it stopped: ending, or retired
	}
	if a == retired {
		return fmt.Errorf("distlock: downgrading %s: %w", e.keys.Lease, g.pub.st.Load().err)
	}
	return fmt.Errorf("distlock: downgrading %s: %w", e.keys.Lease, ErrReleased)
}
