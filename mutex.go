package distlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/lease"
)

// store is the lease protocol as the Mutex and its guards use it. The
// production store is *lease.Client; tests substitute fakes to drive the
// timing logic deterministically.
type store interface {
	Acquire(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Grant, error)
	AcquireOrQueue(ctx context.Context, k lease.Keys, value string, ttl time.Duration, p lease.Place) (lease.Grant, error)
	Renew(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Renewal, error)
	Release(ctx context.Context, k lease.Keys, value string) (lease.Release, error)
	Cancel(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Release, error)
	Subscribe(ctx context.Context, k lease.Keys, room string, ready func(), granted func(value string, token int64)) error
}

// cleanupTimeout bounds the conditional delete that Lock sends when it gives
// up after an attempt whose outcome it could not see (the reply was lost or
// the context ended while the script was in flight).
const cleanupTimeout = 250 * time.Millisecond

// A Mutex is a named distributed lock. It holds the lock's configuration and
// no state: every successful Lock returns a new [Guard] that owns one
// acquisition. A Mutex is safe for concurrent use, and several goroutines may
// call Lock on the same Mutex; they contend for the lock exactly as separate
// processes would.
type Mutex struct {
	client        any    // identifies the connection, for the local wait queue
	kind          string // kindMutex, kindSemaphore or kindElection
	store         store
	keys          lease.Keys
	owner         string
	ttl           time.Duration
	claim         time.Duration // the claim window of a waiter's grant
	maxWait       time.Duration
	retryInterval time.Duration
	polling       bool // WithRetryInterval was given: wait by polling
	abandoned     abandonedValues
	log           *slog.Logger
	obs           Observer
	ack           lease.Ack // WithReplicaAck; Replicas 0 when off
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
	return newLock(client, key, kindMutex, 0, opts)
}

// The kinds of lease that the Mutex engine runs, as AcquireInfo.Kind and
// the other Observer infos name them.
const (
	kindMutex     = "mutex"
	kindSemaphore = "semaphore"
	kindElection  = "election"
)

// newLock builds the engine behind a Mutex, a Semaphore (permits > 0) or an
// Election, with its store.
func newLock(client rueidis.Client, key, kind string, permits int, opts []Option) (*Mutex, error) {
	if client == nil {
		return nil, invalid("client", "is nil")
	}
	m, err := newMutex(key, opts, func(o *options) error {
		if kind == kindElection && o.ownerSet {
			return invalid("owner", "does not apply to an election: each candidate proclaims its own value in Campaign")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	m.client, m.kind = client, kind
	switch kind {
	case kindSemaphore:
		m.keys = m.keys.Semaphore(permits)
	case kindElection:
		m.keys = m.keys.Election()
	}
	if m.store, err = lease.NewWithAck(client, m.ack); err != nil {
		return nil, invalid("replica ack", "%v", err) // newMutex checked it
	}
	return m, nil
}

// newMutex checks key and opts and builds a Mutex without a store. extra,
// if given, checks the options further before the common checks.
func newMutex(key string, opts []Option, extra ...func(*options) error) (*Mutex, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if opt == nil {
			return nil, invalid("option", "is nil")
		}
		opt.apply(&o)
	}
	for _, check := range extra {
		if err := check(&o); err != nil {
			return nil, err
		}
	}
	if err := lease.CheckName(key); err != nil {
		return nil, invalid("key", "%v", unwrapName(err))
	}
	keys, err := lease.NewKeys(o.namespace, key)
	if err != nil {
		return nil, invalid("namespace", "%v", unwrapName(err))
	}
	if err := lease.CheckOwner(o.owner); err != nil {
		return nil, invalid("owner", "%v", unwrapName(err))
	}
	switch {
	case o.ttl <= 0:
		return nil, invalid("ttl", "%v is not positive", o.ttl)
	case o.ttl < MinTTL:
		return nil, invalid("ttl", "%v is below the minimum of %v, too short to renew in time", o.ttl, MinTTL)
	case o.ttl > MaxTTL:
		return nil, invalid("ttl", "%v is above the maximum of %v", o.ttl, MaxTTL)
	}
	if !o.claimSet {
		o.claim = min(o.claim, o.ttl)
	}
	switch {
	case o.claim < MinClaimWindow:
		return nil, invalid("claim window", "%v is below the minimum of %v", o.claim, MinClaimWindow)
	case o.claim > o.ttl:
		return nil, invalid("claim window", "%v is longer than the TTL (%v)", o.claim, o.ttl)
	case o.maxWait < 0:
		return nil, invalid("max wait", "%v is negative", o.maxWait)
	case o.retryInterval < 0:
		return nil, invalid("retry interval", "%v is negative", o.retryInterval)
	case o.logger == nil:
		return nil, invalid("logger", "is nil")
	case o.observer == nil:
		return nil, invalid("observer", "is nil")
	}
	if err := o.checkAck(); err != nil {
		return nil, err
	}
	return &Mutex{
		kind:          kindMutex,
		keys:          keys,
		owner:         o.owner,
		ttl:           o.ttl.Truncate(time.Millisecond),
		claim:         o.claim.Truncate(time.Millisecond),
		maxWait:       o.maxWait,
		retryInterval: o.retryInterval,
		polling:       o.polling,
		log:           o.logger.With("key", keys.Lease),
		obs:           o.observer,
		ack:           o.ack,
	}, nil
}

// unwrapName strips lease.ErrInvalidName's prefix from a validation message,
// since the OptionError already names the field.
func unwrapName(err error) string {
	msg := err.Error()
	prefix := lease.ErrInvalidName.Error() + ": "
	if len(msg) > len(prefix) && msg[:len(prefix)] == prefix {
		return msg[len(prefix):]
	}
	return msg
}

// leaseDeadline returns the deadline D of a lease of ttl whose last
// confirmed write was sent at sent: the guard vouches for the lease only
// before it.
func leaseDeadline(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - margin(ttl))
}

// queueKey names the waiting room of this lock on this client.
func (m *Mutex) queueKey() queueKey { return queueKey{client: m.client, lease: m.keys.Lease} }

// Key returns the Redis key that holds the lease, such as "distlock:{job}".
func (m *Mutex) Key() string { return m.keys.Lease }

// Owner returns the owner id written into the lease by this Mutex's
// acquisitions.
func (m *Mutex) Owner() string { return m.owner }

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
	return m.acquire(ctx, m.owner, m.maxWait, m.retryInterval, m.polling, false)
}

// TryLock makes a single attempt to acquire the lock. If someone else holds
// it, TryLock returns an error matching [ErrNotAcquired] (a
// [*NotAcquiredError] that names the holder). Like [Mutex.Lock], ctx bounds
// the attempt and the hold.
func (m *Mutex) TryLock(ctx context.Context) (*Guard, error) {
	return m.acquire(ctx, m.owner, 0, 0, false, true)
}

// TryLockFor tries to acquire the lock for up to timeout, polling: it
// retries every retryInterval (0 retries at once) and does not join the
// queue that [Mutex.Lock] waits in. When timeout runs out it returns an
// error matching [ErrTimeout]; a timeout of 0 makes a single attempt, as
// [Mutex.TryLock] does. Negative durations are refused with
// [ErrInvalidOption]. Like [Mutex.Lock], ctx bounds the wait and the hold,
// and when ctx ends first the error matches ctx.Err().
func (m *Mutex) TryLockFor(ctx context.Context, timeout, retryInterval time.Duration) (*Guard, error) {
	switch {
	case timeout < 0:
		return nil, invalid("timeout", "%v is negative", timeout)
	case retryInterval < 0:
		return nil, invalid("retry interval", "%v is negative", retryInterval)
	case timeout == 0:
		return m.acquire(ctx, m.owner, 0, 0, false, true)
	}
	return m.acquire(ctx, m.owner, timeout, retryInterval, true, false)
}

// cleanup cancels value (see lease.Client.Cancel) after an acquire call
// gave up with something of value possibly in Redis: a lease written by an
// attempt whose reply it did not see, a lease passed to it while it waited,
// or its place in line. A lease it deletes goes to the next in line at once.
// The cancel also voids value, so that an attempt that reaches Redis after
// it (rueidis may send the two on different connections) is refused. It is
// bounded by cleanupTimeout and ignores ctx's cancellation (ctx is usually
// why the call gave up). Failing is harmless: the orphan expires within the
// TTL, a passed lease within the claim window, a place in line within the
// claim window.
//
// If the clean-up itself fails, the value is remembered for one TTL: should
// a later attempt of this Mutex find the lock held by it, that attempt
// cancels it and tries again at once instead of waiting out the orphan.
//
// It reports whether Redis confirmed the clean-up.
func (m *Mutex) cleanup(ctx context.Context, value string) bool {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(cleanupTimeout, m.ttl))
	defer cancel()
	sent := time.Now()
	r, err := m.store.Cancel(cctx, m.keys, value, m.ttl)
	switch {
	case err != nil:
		m.abandoned.add(value, time.Now().Add(m.ttl))
		m.log.Warn("distlock: could not clean up after giving up; it expires on its own", "err", err)
		return false
	case r.Deleted:
		m.log.Info("distlock: deleted a lease that a call gave up on")
	}
	deliverPasses(m.queueKey(), r, sent)
	return true
}

// abandonedValues remembers the values of attempts that a Mutex gave up on
// and could not clean up. A handful is plenty: each one needs an attempt
// whose outcome was not seen followed by a failed clean-up.
type abandonedValues struct {
	mu     sync.Mutex
	values []abandonedValue
}

type abandonedValue struct {
	value string
	until time.Time // after this, the lease it may have written is gone
}

const maxAbandoned = 8

// add remembers value until until, forgetting the oldest beyond
// maxAbandoned.
func (s *abandonedValues) add(value string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.values) == maxAbandoned {
		s.values = s.values[1:]
	}
	s.values = append(s.values, abandonedValue{value: value, until: until})
}

// take forgets value and reports whether it was remembered and may still
// hold a lease.
func (s *abandonedValues) take(value string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, v := range s.values {
		if v.value == value {
			s.values = append(s.values[:i], s.values[i+1:]...)
			return time.Now().Before(v.until)
		}
	}
	return false
}

// ctxError wraps ctx's error, and its cause when that differs, so that the
// result matches both under errors.Is. It says "acquiring", which fits a
// Lock that was waiting as well as a TryLock that never got to ask Redis.
func (m *Mutex) ctxError(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause != nil && !errors.Is(cause, err) {
		return fmt.Errorf("distlock: acquiring %s: %w: %w", m.keys.Lease, err, cause)
	}
	return fmt.Errorf("distlock: acquiring %s: %w", m.keys.Lease, err)
}
