package distlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// The engine is what a Mutex, a Semaphore and an Election share: the
// configuration of one named lease and the calls that acquire it (see
// acquire.go and wait.go). Each held acquisition is a Guard (guard.go),
// whose actor renews it (guardactor.go).

// store is the lease protocol as the engine and its guards use it. The
// production store is *lease.Client; tests substitute fakes to drive the
// timing logic deterministically.
type store interface {
	Acquire(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Grant, error)
	AcquireOrQueue(ctx context.Context, k lease.Keys, value string, ttl time.Duration, p lease.Place) (lease.Grant, error)
	Renew(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Renewal, error)
	Release(ctx context.Context, k lease.Keys, value string) (lease.Release, error)
	Cancel(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Release, error)
	CancelDedicated(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Release, error)
	Subscribe(ctx context.Context, k lease.Keys, room string, ready func(), granted func(value string, token int64)) error
}

// The kinds of lease that the engine runs, as AcquireInfo.Kind and the
// other Observer infos name them.
const (
	kindMutex     = "mutex"
	kindSemaphore = "semaphore"
	kindElection  = "election"
	kindRWMutex   = "rwmutex"
)

// engine is the configuration of one named lease, with its store. It holds
// no state of an acquisition and is safe for concurrent use; the only state
// it keeps is the short list of abandoned values (see cleanup).
type engine struct {
	client        any    // identifies the client, for the waiting room (lease.Redis.Identity)
	kind          string // kindMutex, kindSemaphore or kindElection
	store         store
	name          string // the lock's name, as given (its key without namespace and braces)
	keys          lease.Keys
	owner         string
	ttl           time.Duration
	claim         time.Duration // the claim window of a waiter's grant
	maxWait       time.Duration
	retryInterval time.Duration
	polling       bool // WithRetryInterval was given: wait by polling
	abandoned     abandonedValues
	log           *slog.Logger // without the key: logAttrs adds it
	obs           Observer
	ack           lease.Ack // WithReplicaAck; Replicas 0 when off

	// sess is the client's session as this engine last found it, so that
	// a Lock or a guard finds it without the registry's lock (session.go).
	sess atomic.Pointer[session]
}

// init checks client, key and opts and makes e the engine of a lock of
// the given kind (a semaphore of permits permits when permits > 0). The
// engine lives inside the Mutex, Semaphore or Election it serves, so that
// making one costs few allocations: a worker may make one per job.
func (e *engine) init(client lease.Redis, key, kind string, permits int, opts []Option) error {
	if client == nil {
		return invalid("client", "is nil")
	}
	err := e.configure(key, opts, func(o *options) error {
		if kind == kindElection && o.ownerSet {
			return invalid("owner", "does not apply to an election: each candidate proclaims its own value in Campaign")
		}
		return nil
	})
	if err != nil {
		return err
	}
	e.client, e.kind = client.Identity(), kind
	switch kind {
	case kindSemaphore:
		e.keys = e.keys.Semaphore(permits)
	case kindElection:
		e.keys = e.keys.Election()
	}
	if e.store, err = lease.NewOn(client, e.ack); err != nil {
		return invalid("replica ack", "%v", err) // configure checked it
	}
	return nil
}

// configure checks key and opts and sets e up as an engine of kindMutex
// without a client or store. extra, if given, checks the options further
// before the common checks.
func (e *engine) configure(key string, opts []Option, extra ...func(*options) error) error {
	o := defaultOptions()
	for _, opt := range opts {
		if opt == nil {
			return invalid("option", "is nil")
		}
		opt.apply(&o)
	}
	for _, check := range extra {
		if err := check(&o); err != nil {
			return err
		}
	}
	if err := lease.CheckName(key); err != nil {
		return invalid("key", "%v", unwrapName(err))
	}
	keys, err := lease.NewKeys(o.namespace, key)
	if err != nil {
		return invalid("namespace", "%v", unwrapName(err))
	}
	if err := lease.CheckOwner(o.owner); err != nil {
		return invalid("owner", "%v", unwrapName(err))
	}
	switch {
	case o.ttl <= 0:
		return invalid("ttl", "%v is not positive", o.ttl)
	case o.ttl < MinTTL:
		return invalid("ttl", "%v is below the minimum of %v, too short to renew in time", o.ttl, MinTTL)
	case o.ttl > MaxTTL:
		return invalid("ttl", "%v is above the maximum of %v", o.ttl, MaxTTL)
	}
	if !o.claimSet {
		o.claim = min(o.claim, o.ttl)
	}
	switch {
	case o.claim < MinClaimWindow:
		return invalid("claim window", "%v is below the minimum of %v", o.claim, MinClaimWindow)
	case o.claim > o.ttl:
		return invalid("claim window", "%v is longer than the TTL (%v)", o.claim, o.ttl)
	case o.maxWait < 0:
		return invalid("max wait", "%v is negative", o.maxWait)
	case o.retryInterval < 0:
		return invalid("retry interval", "%v is negative", o.retryInterval)
	case o.logger == nil:
		return invalid("logger", "is nil")
	case o.observer == nil:
		return invalid("observer", "is nil")
	}
	if err := o.checkAck(); err != nil {
		return err
	}
	e.kind = kindMutex
	e.name, e.keys = key, keys
	e.owner = o.owner
	e.ttl = o.ttl.Truncate(time.Millisecond)
	e.claim = o.claim.Truncate(time.Millisecond)
	e.maxWait = o.maxWait
	e.retryInterval = o.retryInterval
	e.polling = o.polling
	e.log = o.logger
	e.obs = o.observer
	e.ack = o.ack
	return nil
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

// logger returns the engine's logger with the lease key. Logging is rare
// (failures, losses, debug messages that are checked for first), so the
// attribute is added when a message is written, not for every engine.
func (e *engine) logger() *slog.Logger { return e.log.With("key", e.keys.Lease) }

// debug reports whether debug messages are wanted; the hot paths check it
// before building any.
func (e *engine) debug() bool { return e.log.Enabled(context.Background(), slog.LevelDebug) }

// cleanup cancels value (see lease.Client.Cancel) after an acquire call
// gave up with something of value possibly in Redis: a lease written by an
// attempt whose reply it did not see, a lease passed to it while it waited,
// or its place in line. A lease it deletes goes to the next in line at once.
// The cancel also voids value, so that an attempt that reaches Redis after
// it (rueidis may send the two on different connections) is refused. It
// ignores ctx's cancellation (ctx is usually why the call gave up). Failing
// is harmless: the orphan expires within the TTL, a passed lease within the
// claim window, a place in line within the claim window.
//
// In the background (the call has returned: see acquire), the cancel goes
// on a dedicated connection, since the client's owner may close the client
// meanwhile (see lease's CancelDedicated), and may take up to a TTL: after
// that there is nothing left to clean up, and a Redis that was stopped
// meanwhile gets it when it resumes. Otherwise (a call that found its own
// orphan and clears it before it asks again) it is bounded by
// cleanupTimeout.
//
// If the clean-up itself fails, the value is remembered for one TTL: should
// a later attempt of this engine find the lock held by it, that attempt
// cancels it and tries again at once instead of waiting out the orphan.
//
// It reports whether Redis confirmed the clean-up.
func (e *engine) cleanup(ctx context.Context, value string, background bool) bool {
	bound, cancelIt := min(cleanupTimeout, e.ttl), e.store.Cancel
	if background {
		bound, cancelIt = e.ttl, e.store.CancelDedicated
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
	defer cancel()
	sent := time.Now()
	r, err := cancelIt(cctx, e.keys, value, e.ttl)
	switch {
	case err != nil:
		e.abandoned.add(value, time.Now().Add(e.ttl))
		e.logger().Warn("distlock: could not clean up after giving up; it expires on its own", "err", err)
		return false
	case r.Deleted:
		e.logger().Info("distlock: deleted a lease that a call gave up on")
	}
	deliverPasses(e, r, sent)
	return true
}

// abandonedValues remembers the values of attempts that an engine gave up
// on and could not clean up. A handful is plenty: each one needs an attempt
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
func (e *engine) ctxError(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause != nil && !errors.Is(cause, err) {
		return fmt.Errorf("distlock: acquiring %s: %w: %w", e.keys.Lease, err, cause)
	}
	return fmt.Errorf("distlock: acquiring %s: %w", e.keys.Lease, err)
}
