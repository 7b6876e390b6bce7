package distlock

import (
	"log/slog"
	"time"

	"github.com/google/uuid"
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

// Timing of the lease, all derived from the TTL T.
const (
	// driftDivisor bounds the relative rate error between our clock and
	// Redis's: 1/100 of the TTL.
	driftDivisor = 100
	// schedulingSlack is added to the margin so that a timer that fires late
	// on a busy machine still reports Lost before Redis can expire the key.
	schedulingSlack = 30 * time.Millisecond
)

// margin returns how long before the end of the lease (counted from the send
// time of the last confirmed write) the guard stops reporting Acquired.
func margin(ttl time.Duration) time.Duration {
	return ttl/driftDivisor + schedulingSlack
}

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
	maxWait       time.Duration
	retryInterval time.Duration
	polling       bool
	logger        *slog.Logger
	observer      Observer
}

func defaultOptions() options {
	return options{
		namespace:     DefaultNamespace,
		ttl:           DefaultTTL,
		retryInterval: DefaultRetryInterval,
		owner:         uuid.NewString(),
		logger:        slog.New(slog.DiscardHandler),
		observer:      nopObserver{},
	}
}

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

// WithOwner sets the owner id stored in the lease value (default: a random
// UUID per Mutex). Use something an operator recognises, such as a host name
// and process id. Two acquisitions with the same owner id are still told
// apart: each writes a value of its own.
func WithOwner(id string) Option {
	return optionFunc(func(o *options) { o.owner = id })
}

// WithMaxWait bounds how long [Mutex.Lock] waits before it returns an error
// matching [ErrTimeout]. The default, 0, waits until the context is done.
func WithMaxWait(d time.Duration) Option {
	return optionFunc(func(o *options) { o.maxWait = d })
}

// WithRetryInterval makes [Mutex.Lock] wait by plain polling: it tries, and
// while the lock is held tries again every d (0: at once, a spin), the way
// distkit and redsync wait. By default, without this option, Lock does not
// poll: it waits in a local queue for the holder's release to be announced,
// or for the holder's lease to run out (see the package documentation,
// "Waiting"). Polling is for servers or proxies without pub/sub, or to bound
// the wait between attempts explicitly.
func WithRetryInterval(d time.Duration) Option {
	return optionFunc(func(o *options) { o.retryInterval, o.polling = d, true })
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
