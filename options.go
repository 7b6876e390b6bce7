package distlock

import (
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// Defaults and limits of the options.
const (
	// DefaultNamespace prefixes every key unless [WithNamespace] says
	// otherwise.
	DefaultNamespace = "distlock"
	// DefaultTTL is the lease length unless [WithTTL] says otherwise.
	DefaultTTL = 30 * time.Second
	// DefaultRetryInterval is the polling interval when polling is needed:
	// while Lock cannot receive release announcements (pub/sub refused by
	// the server, or its subscription is being re-established). Set
	// [WithRetryInterval] to make Lock poll at an interval of your choice
	// instead of waiting for announcements.
	DefaultRetryInterval = 50 * time.Millisecond
	// DefaultClaimWindow is the claim window unless [WithClaimWindow] says
	// otherwise: how long a lock passed to a waiter that died stays out of
	// reach before the next waiter gets it. A live waiter answers within a
	// round trip and a scheduling delay (tens of milliseconds on a loaded
	// machine); half a second leaves ten times that, and waiters refresh
	// their place in line every half window, four commands a second.
	DefaultClaimWindow = 500 * time.Millisecond
	// MaxReplyWait bounds how long one attempt to acquire a lease (one
	// call of Lock, TryLock or TryLockFor to Redis) waits for its reply,
	// whatever the TTL: an attempt waits until the lease deadline
	// counted from its send time (a little under the TTL) or
	// MaxReplyWait, whichever comes first, unless ctx or the client's own
	// timeout ends it sooner. An attempt without a reply ends in
	// [ErrNoReply]. It is as long as rueidis's default ConnWriteTimeout.
	MaxReplyWait = 10 * time.Second
	// MinClaimWindow is the shortest claim window distlock accepts: the
	// lease a waiter is handed must outlast the safety margin (1% plus
	// 30ms) with room for a renewal.
	MinClaimWindow = 100 * time.Millisecond

	// MinTTL is the shortest lease distlock accepts. A lease is renewed every
	// TTL/3 and given up at TTL minus the safety margin (TTL/100 + 30ms), so
	// below this the margin eats the time a renewal needs.
	MinTTL = 100 * time.Millisecond
	// MaxTTL is the longest lease distlock accepts. Redis would take far
	// longer expiries, but a lease that long means a holder that crashes
	// blocks every waiter for that long; renewal already lets a lock be held
	// for as long as needed with a short TTL.
	MaxTTL = 24 * time.Hour
)

// An Option configures a [Mutex]. Options are applied in order by
// [NewMutex], which then checks the result as a whole.
type Option interface {
	apply(*options)
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

type options struct {
	namespace     string
	ttl           time.Duration
	owner         string
	ownerSet      bool // WithOwner was given
	maxWait       time.Duration
	claim         time.Duration
	claimSet      bool // WithClaimWindow was given
	retryInterval time.Duration
	polling       bool
	logger        *slog.Logger
	observer      Observer
	ack           lease.Ack
	ackSet        bool // WithReplicaAck was given
}

func defaultOptions() options {
	return options{
		namespace:     DefaultNamespace,
		ttl:           DefaultTTL,
		retryInterval: DefaultRetryInterval,
		claim:         DefaultClaimWindow,
		owner:         defaultOwner(),
		logger:        discard,
		observer:      nopObserver{},
	}
}

// discard is the default logger, which writes nothing.
var discard = slog.New(slog.DiscardHandler)

// defaultOwner is the owner id of a Mutex made without [WithOwner]: the
// host name and the process id, "host:pid", which tells an operator where a
// holder runs. Every acquisition still writes a value of its own, the owner
// id followed by a unique suffix, so two acquisitions with one owner id never
// renew or release each other's lease.
var defaultOwner = sync.OnceValue(func() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	owner := host + ":" + strconv.Itoa(os.Getpid())
	if lease.CheckOwner(owner) != nil {
		// A host name that is not printable UTF-8, or absurdly long.
		owner = "pid:" + strconv.Itoa(os.Getpid())
	}
	return owner
})

// WithNamespace sets the prefix of the lock's Redis keys (default
// [DefaultNamespace]). It follows the same character rules as the key; see
// [NewMutex].
func WithNamespace(ns string) Option {
	return optionFunc(func(o *options) { o.namespace = ns })
}

// WithTTL sets the lease length (default [DefaultTTL]), between [MinTTL] and
// [MaxTTL], counted in whole milliseconds (Redis's unit; anything finer is
// dropped). The lease is renewed every TTL/3. A longer TTL rides out longer
// Redis outages without losing the lock; a shorter one frees the lock sooner
// when a holder dies without releasing it.
func WithTTL(ttl time.Duration) Option {
	return optionFunc(func(o *options) { o.ttl = ttl })
}

// WithOwner sets the owner id stored in the lease value (default: the host
// name and process id, "host:pid"). Use something an operator recognises,
// such as the name of the job or the pod. Two acquisitions with the same
// owner id are still told apart: each writes a value of its own.
func WithOwner(id string) Option {
	return optionFunc(func(o *options) { o.owner, o.ownerSet = id, true })
}

// WithMaxWait bounds how long [Mutex.Lock] waits before it returns an error
// matching [ErrTimeout]. The default, 0, waits until the context is done.
func WithMaxWait(d time.Duration) Option {
	return optionFunc(func(o *options) { o.maxWait = d })
}

// WithRetryInterval makes [Mutex.Lock] wait by plain polling: it tries, and
// while the lock is held tries again every d (0: at once, a spin), the way
// most Redis locks wait (such as the Go library redsync, or distkit, the Rust
// library whose Mutex this package's API follows). By default, without this
// option, Lock does not poll: it stands in the lock's line in Redis until
// a release passes the lock to it, or the holder's lease runs out (see the
// section "Waiting" of the package documentation). A poller never stands in
// line, and does not take a free lock from a waiter first in line. Polling is for servers
// or proxies without pub/sub, or to bound the wait between attempts
// explicitly.
func WithRetryInterval(d time.Duration) Option {
	return optionFunc(func(o *options) { o.retryInterval, o.polling = d, true })
}

// WithClaimWindow sets the claim window of [Mutex.Lock]'s waiting (default
// [DefaultClaimWindow], or the TTL when that is shorter), from
// [MinClaimWindow] up to the TTL, in whole milliseconds.
//
// Waiters stand in one line in Redis, and a release passes the lock to the
// first of them. The lease it is handed lasts the claim window, counted from
// the release: the waiter renews it to the full TTL if it holds the lock
// that long, and if the waiter has died the lease lapses and the next waiter
// gets the lock then. A waiter also refreshes its place in line every half
// window; a place that is not refreshed for a whole window (its process died
// or lost Redis) is skipped. So the window bounds how long a dead waiter can
// keep the lock from the living. Too short a window makes a live waiter that
// is slow to answer (a stopped process, a very busy machine) lose its turn:
// it then asks again and keeps its place in line.
func WithClaimWindow(d time.Duration) Option {
	return optionFunc(func(o *options) { o.claim, o.claimSet = d, true })
}

// WithLogger sets where the Mutex and its guards log acquisitions, renewal
// failures, losses and releases (default: nowhere).
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) { o.logger = l })
}

// WithObserver sets an [Observer] that is told about acquisitions, renewals
// and state changes, for metrics (default: none).
func WithObserver(o Observer) Option {
	return optionFunc(func(opts *options) { opts.observer = o })
}

// WithReplicaAck makes every acquisition and every renewal wait until
// replicas replicas have acknowledged the write, for up to timeout (Redis's
// WAIT, sent right after the write on the same connection). By default
// nothing waits for replicas.
//
// Redis replicates asynchronously, so without this option a failover can
// promote a replica that never received a lease, and grant the lock a second
// time. With it, [Mutex.Lock] returns a lock only once that many replicas
// hold it: an acquisition that is not acknowledged in time is deleted again
// and Lock returns an error matching [ErrNotReplicated] (a
// [*ReplicaAckError]); it does not retry. A renewal that is not acknowledged
// in time does not count: the lease deadline is not extended. Like any
// renewal that failed without proving the lease gone, it is reported (a
// [*RenewError] that unwraps to the *ReplicaAckError) and retried, and the
// guard stays [Acquired] until the deadline of its last acknowledged write
// (the replicas hold that one); if no renewal is acknowledged by then, it
// becomes [Lost], with a [*LostError] that unwraps to the
// *ReplicaAckError. It regains the lock at the next renewal that is
// acknowledged. The section "Redis Cluster and Sentinel"
// of the package documentation, and TOPOLOGIES.md in the repository, say
// what this does and does not protect against.
//
// Each acquisition and renewal then borrows a connection from rueidis's
// pool for blocking commands (rueidis.ClientOption.BlockingPoolSize) for one
// round trip plus the wait. A waiting Lock that a release passes the lock
// to (a write the replicas were not asked to acknowledge) claims it with an
// acquisition of its own, which waits for them, before it returns.
// replicas 0 turns the wait off. A negative count,
// a timeout under one millisecond (WAIT's unit), or one longer than a third
// of the TTL (a renewal and its wait must end before the next renewal is
// due) is refused by [NewMutex] with [ErrInvalidOption].
func WithReplicaAck(replicas int, timeout time.Duration) Option {
	return optionFunc(func(o *options) {
		o.ack, o.ackSet = lease.Ack{Replicas: replicas, Timeout: timeout}, true
	})
}

// checkAck checks the settings of WithReplicaAck against the TTL.
func (o *options) checkAck() error {
	if !o.ackSet {
		return nil
	}
	switch t := o.ack.Timeout; {
	case o.ack.Replicas < 0:
		return invalid("replica ack", "%d replicas is negative", o.ack.Replicas)
	case t <= 0:
		return invalid("replica ack", "timeout %v is not positive", t)
	case t < time.Millisecond:
		return invalid("replica ack", "timeout %v is under one millisecond, the unit of Redis's WAIT", t)
	case t > o.ttl/3:
		return invalid("replica ack", "timeout %v does not fit in the lease: it must be at most a third of the TTL (%v), the renewal period", t, o.ttl/3)
	}
	return nil
}
