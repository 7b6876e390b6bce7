package distlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// Errors reported by distlock. Test for them with [errors.Is]; the concrete
// errors returned wrap them and carry details ([*OptionError],
// [*ArgumentError], [*TimeoutError], [*NoReplyError], [*NotAcquiredError],
// [*LostError]).
var (
	// ErrNotAcquired means a single attempt found the lock held by someone
	// else.
	ErrNotAcquired = errors.New("distlock: not acquired")
	// ErrTimeout means waiting for the lock ran out of time: the Mutex's
	// max wait or the timeout given to TryLockFor, not the context.
	ErrTimeout = errors.New("distlock: timed out waiting for the lock")
	// ErrLost is the cause of a lost lease: it is wrapped by [Event.Err] and
	// by the cause of [Guard.Context].
	ErrLost = errors.New("distlock: lock lost")
	// ErrReleased is the cause of [Guard.Context] once the guard has been
	// released (or left, see [Guard.Leave]).
	ErrReleased = errors.New("distlock: lock released")
	// ErrRenewFailed is matched by the [*RenewError] of an event that
	// reports a renewal that failed while the lease still held: the guard
	// stays Acquired until its deadline and retries.
	ErrRenewFailed = errors.New("distlock: renewal failed")
	// ErrInvalidOption means that distlock refused its input before it sent
	// anything to Redis: the configuration of a lock (the client, key or an
	// option given to [NewMutex], or the timeout and retry interval given to
	// [Mutex.TryLockFor], which are per-call versions of [WithMaxWait] and
	// [WithRetryInterval]), reported as an [*OptionError], or an argument
	// of a call, reported as an [*ArgumentError]. One errors.Is check with
	// it therefore catches every refused input.
	ErrInvalidOption = errors.New("distlock: invalid option")
	// ErrInvalidArgument means an argument of a call that is not part of
	// the lock's configuration was refused, such as a nil context given to
	// Lock or Release; nothing was sent to Redis, and the guard, if any, is
	// unchanged. It is reported as an [*ArgumentError], which also matches
	// [ErrInvalidOption], as it did before ErrInvalidArgument existed.
	ErrInvalidArgument = errors.New("distlock: invalid argument")
	// ErrNotReplicated means fewer replicas than [WithReplicaAck] asks for
	// acknowledged an acquisition or a renewal in time. Lock returns it
	// (wrapped) after deleting the unacknowledged lease; a renewal that
	// fails this way makes the guard Lost, and its [*LostError] unwraps to
	// it.
	ErrNotReplicated = lease.ErrNotReplicated
	// ErrWrongKind means the name is used by another kind of lease: a
	// lock (a Mutex, an Election or an RWMutex, which are one lock of a
	// name) asked for a semaphore's name, or a Semaphore for a lock's, or
	// the lease key holds something distlock did not write: a key of
	// another Redis type, or a lock's key without an expiry (set by hand,
	// or made to persist), which would never free itself. It is reported
	// as a [*WrongKindError], by TryLock and Lock alike (Lock does not
	// wait for such a key); nothing was written, and the key and the
	// holder of the other kind are not disturbed. A lock's key set by hand
	// with an expiry is an ordinary holder: TryLock reports
	// [ErrNotAcquired], and Lock waits until it expires.
	ErrWrongKind = lease.ErrWrongKind
	// ErrNoReply means that one attempt to acquire got no reply from
	// Redis in time: a stopped or overloaded server, or a dead path. An
	// attempt waits for its reply until the first of: the lease deadline
	// counted from its send time (a later reply could not be trusted),
	// [MaxReplyWait] after sending, or the client's own timeout
	// (rueidis's ConnWriteTimeout, 10 s by default; go-redis's
	// ReadTimeout, 3 s by default, after its retries). To bound an
	// attempt more tightly, use the timeout of TryLockFor or
	// [WithMaxWait], which end an attempt in flight too; the caller's
	// context does as well, but a Lock's context also bounds the hold. It
	// is reported as a [*NoReplyError] by TryLock (and
	// by Lock and TryLockFor when their wait ends on it); a waiting call
	// retries such an attempt like any other failed one, while its
	// context and its wait allow. It does not match
	// [context.DeadlineExceeded]: no deadline of the caller's has passed.
	ErrNoReply = errors.New("distlock: no reply from Redis in time")
	// ErrNotWriteLock means [Guard.Downgrade] was called on a guard that
	// does not hold an [RWMutex] for writing: a read guard (or one
	// downgraded already), or a guard of another kind. Nothing was sent to
	// Redis and the guard is unchanged.
	ErrNotWriteLock = errors.New("distlock: not a write lock of an RWMutex")
)

// WrongKindError reports a name used by another kind of lease: Key is the
// lease key, Want the kind asked for ("lock", "rwmutex" or "semaphore"),
// Found what the key holds ("semaphore"; "lock" or "rwmutex" for a lock's
// string or hash; the Redis type of a key distlock did not write; or
// "string without expiry" and the value, for a lock's key that never
// expires). It matches [ErrWrongKind].
type WrongKindError = lease.WrongKindError

// ReplicaAckError reports that fewer replicas than [WithReplicaAck] asks for
// acknowledged a write in time: Op is "acquire" or "renew", Want and Got
// count replicas, Timeout is how long Redis waited, and Err, if set, is why
// the wait itself failed. It matches [ErrNotReplicated].
type ReplicaAckError = lease.AckError

// OptionError reports a part of a lock's configuration that distlock
// refused: the client, key or an option given to [NewMutex], or the timeout
// or retry interval given to [Mutex.TryLockFor]. It matches
// [ErrInvalidOption].
type OptionError struct {
	Field  string // what was refused, e.g. "ttl", "key" or "client"
	Reason string // what is wrong with it
}

func (e *OptionError) Error() string { return inputMessage(e.Field, e.Reason) }

// Is reports whether target is [ErrInvalidOption].
func (e *OptionError) Is(target error) bool { return target == ErrInvalidOption }

// ArgumentError reports an argument of a call that distlock refused, such
// as a nil context. It matches [ErrInvalidArgument] and, for compatibility,
// [ErrInvalidOption].
type ArgumentError struct {
	Arg    string // the argument, e.g. "ctx"
	Reason string // what is wrong with it, e.g. "is nil"
}

func (e *ArgumentError) Error() string { return inputMessage(e.Arg, e.Reason) }

// Is reports whether target is [ErrInvalidArgument] or [ErrInvalidOption].
func (e *ArgumentError) Is(target error) bool {
	return target == ErrInvalidArgument || target == ErrInvalidOption
}

// inputMessage words the refusal of name for reason: "distlock: ctx is
// nil", "distlock: key is empty", "distlock: invalid ttl: 0s is not
// positive".
func inputMessage(name, reason string) string {
	switch {
	case strings.HasPrefix(reason, name+" "): // it names what it is about
		return "distlock: " + reason
	case strings.HasPrefix(reason, "is "): // a predicate
		return "distlock: " + name + " " + reason
	}
	return fmt.Sprintf("distlock: invalid %s: %s", name, reason)
}

// argumentNames are the names that invalid reports as an [*ArgumentError]
// rather than an [*OptionError]: arguments that are not part of a lock's
// configuration.
var argumentNames = map[string]bool{"ctx": true}

// invalid returns the error for the refused input field: an
// [*ArgumentError] for a name in argumentNames, an [*OptionError]
// otherwise.
func invalid(field, format string, args ...any) error {
	if argumentNames[field] {
		return badArgument(field, format, args...)
	}
	return &OptionError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// zeroValue returns the error of a method called on a typ (Mutex,
// Semaphore, Election) that its constructor did not make, such as a
// "var m distlock.Mutex": it has no client to talk to.
func zeroValue(typ string) error {
	return &OptionError{Field: "receiver", Reason: fmt.Sprintf("is a zero %s; make one with New%s", typ, typ)}
}

// errNilGuard returns the error of a method called on a nil *Guard: what
// Lock (or any call that returns a guard) returns along with its error,
// reached by a "defer g.Release(ctx)" written before the error check.
func errNilGuard() error {
	return badArgument("guard", "is nil: the call that should have returned it failed; check its error before using the guard")
}

// refusedSubscription is the error of the one event that Subscribe sends
// when it refuses: on a nil guard g, or with a nil ctx.
func refusedSubscription(g *Guard) error {
	if g == nil {
		return errNilGuard()
	}
	return badArgument("ctx", "is nil")
}

// nilGuardContext returns the Context of a nil *Guard: cancelled, with
// the nil guard's error as its cause, since no lock protects its work.
func nilGuardContext() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errNilGuard())
	return ctx
}

// badArgument returns an [*ArgumentError] for arg.
func badArgument(arg, format string, args ...any) error {
	return &ArgumentError{Arg: arg, Reason: fmt.Sprintf(format, args...)}
}

// TimeoutError reports that waiting for a lock ran out of time. It matches
// [ErrTimeout].
type TimeoutError struct {
	Key      string        // the lease key
	Waited   time.Duration // how long the caller waited
	Attempts int           // how many times Redis was asked
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("distlock: timed out waiting for %s after %v and %d attempts",
		e.Key, e.Waited.Round(time.Millisecond), e.Attempts)
}

// Is reports whether target is [ErrTimeout].
func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }

// NoReplyError reports a call to Redis that got no reply in time: before
// the deadline distlock gave it, or before the client's own timeout, which
// Err then holds. It matches [ErrNoReply]; the outcome of the call is
// unknown, and distlock cancels what it may have written.
type NoReplyError struct {
	Key   string        // the lease key
	After time.Duration // how long the call waited
	// Err is the client's error when the client gave up by a timeout of
	// its own (such as "read tcp ...: i/o timeout"), and nil when
	// distlock's deadline for the call passed first.
	Err error
}

func (e *NoReplyError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("distlock: acquiring %s: no reply from Redis within %v: %v", e.Key, e.After.Round(time.Millisecond), e.Err)
	}
	return fmt.Sprintf("distlock: acquiring %s: no reply from Redis within %v", e.Key, e.After.Round(time.Millisecond))
}

// Is reports whether target is [ErrNoReply].
func (e *NoReplyError) Is(target error) bool { return target == ErrNoReply }

// Unwrap returns the client's error, if the client's own timeout ended the
// call.
func (e *NoReplyError) Unwrap() error { return e.Err }

// NotAcquiredError reports that a single attempt found the lock held. It
// matches [ErrNotAcquired].
type NotAcquiredError struct {
	Key string // the lease key
	// Holder is the owner id of the current holder (the whole value if
	// distlock did not write it).
	Holder string
	// Remaining is how long the holder's lease has left, as Redis saw it.
	// (A lock's key without an expiry is refused with [ErrWrongKind]
	// instead.)
	Remaining time.Duration
	// Permits is, for a [Semaphore], its number of permits, all of which
	// are held: Holder is then the holder whose lease ends first, and
	// Remaining how long that lease has left. It is 0 for a lock.
	Permits int
}

func (e *NotAcquiredError) Error() string {
	if e.Permits > 0 {
		if e.Holder == "" {
			return fmt.Sprintf("distlock: not acquired: all %d permits of %s are taken", e.Permits, e.Key)
		}
		return fmt.Sprintf("distlock: not acquired: all %d permits of %s are held; the first lease to end is %q's, in %v",
			e.Permits, e.Key, e.Holder, e.Remaining)
	}
	if e.Remaining < 0 {
		return fmt.Sprintf("distlock: not acquired: %s is held by %q with no expiry", e.Key, e.Holder)
	}
	return fmt.Sprintf("distlock: not acquired: %s is held by %q for another %v",
		e.Key, e.Holder, e.Remaining)
}

// Is reports whether target is [ErrNotAcquired].
func (e *NotAcquiredError) Is(target error) bool { return target == ErrNotAcquired }

// RenewError reports a renewal that failed without telling anything about
// the lease: no reply came (a reset connection, a refused dial, a
// timeout), Redis answered with an error, or too few replicas acknowledged
// it ([WithReplicaAck]). Such a renewal can only have extended the lease, so
// the guard stays [Acquired] until Deadline and retries after Retry; it is
// [Lost] only if no renewal is confirmed before Deadline. It comes as the
// Err of an [Event] whose State is Acquired, and it matches
// [ErrRenewFailed]. A program that wants to act before the lease is in
// doubt (checkpoint its work, say) can watch for it.
type RenewError struct {
	Key      string
	Err      error         // why the renewal failed
	Deadline time.Time     // until when the guard still vouches for the lease
	Retry    time.Duration // when the next renewal is sent
}

func (e *RenewError) Error() string {
	return fmt.Sprintf("distlock: renewing %s failed: %v; the lease holds for another %v, retrying in %v",
		e.Key, e.Err, time.Until(e.Deadline).Round(time.Millisecond), e.Retry.Round(time.Millisecond))
}

// Is reports whether target is [ErrRenewFailed].
func (e *RenewError) Is(target error) bool { return target == ErrRenewFailed }

// Unwrap returns why the renewal failed.
func (e *RenewError) Unwrap() error { return e.Err }

// LostReason says why a lease was lost.
type LostReason int

const (
	// LostRefused: a renewal found that the key no longer holds this
	// acquisition's value (it expired, was deleted or was overwritten).
	LostRefused LostReason = iota + 1
	// LostRenewFailed: renewals kept failing (Redis unreachable or
	// answering with an error, or fewer replicas than [WithReplicaAck] asks
	// for acknowledging them) until the lease deadline passed; Err is the
	// last failure. Each failure before the deadline was reported as a
	// [*RenewError] while the guard stayed Acquired.
	LostRenewFailed
	// LostDeadline: the local lease deadline passed without a confirmed
	// renewal, with a renewal still waiting for its reply (or with none
	// sent in time); Redis may expire the key at any moment after it.
	LostDeadline
)

func (r LostReason) String() string {
	switch r {
	case LostRefused:
		return "refused"
	case LostRenewFailed:
		return "renew-failed"
	case LostDeadline:
		return "deadline"
	}
	return fmt.Sprintf("LostReason(%d)", int(r))
}

// LostError describes why a lease was lost. It matches [ErrLost] and unwraps
// to the Redis error, if one caused it.
type LostError struct {
	Key    string
	Reason LostReason
	// Holder is the owner id found in the key when a renewal was refused
	// (the whole value if distlock did not write it); empty when the key was
	// missing.
	Holder string
	Err    error // the underlying error, for LostRenewFailed
}

func (e *LostError) Error() string {
	switch e.Reason {
	case LostRefused:
		if e.Holder == "" {
			return fmt.Sprintf("distlock: lock lost: %s expired or was deleted", e.Key)
		}
		return fmt.Sprintf("distlock: lock lost: %s now holds %q", e.Key, e.Holder)
	case LostRenewFailed:
		return fmt.Sprintf("distlock: lock lost: renewing %s failed until the lease deadline passed: %v", e.Key, e.Err)
	case LostDeadline:
		return fmt.Sprintf("distlock: lock lost: lease deadline of %s passed without a confirmed renewal", e.Key)
	}
	return "distlock: lock lost: " + e.Key
}

// Is reports whether target is [ErrLost].
func (e *LostError) Is(target error) bool { return target == ErrLost }

// Unwrap returns the underlying error, if any.
func (e *LostError) Unwrap() error { return e.Err }
