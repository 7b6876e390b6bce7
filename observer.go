package distlock

import "time"

// An Observer is told what a Mutex and its guards do, for metrics and
// tracing. Set one with [WithObserver]; the package
// github.com/distkit-go/distlock/otelmetrics turns these calls into
// OpenTelemetry instruments.
//
// Methods are called synchronously from the goroutine that did the work:
// the caller of Lock for ObserveAcquire; for the others, whoever owns the
// guard at that moment (see "How it works" in the package documentation):
// its actor, or, for a guard that has none, the goroutine that ends it
// (the caller of Release or Leave, or the watch on the Lock context). No
// lock of the guard is held while they run, and the calls for one guard
// never overlap and come in order. They must be safe for concurrent use
// (different guards call them at once) and must return quickly: an
// Observer that blocks delays renewals, and with them the lease.
type Observer interface {
	// ObserveAcquire is called once per Lock, TryLock or TryLockFor call
	// that got as far as asking Redis, when it returns.
	ObserveAcquire(AcquireInfo)
	// ObserveRenew is called after each renewal attempt, on the guard's own
	// goroutine; a batched confirmation may reach it a renewal period late
	// (see RenewInfo.Sent).
	ObserveRenew(RenewInfo)
	// ObserveTransition is called at each change of a guard's state, after
	// the acquisition: Acquired to Lost, Lost to Acquired, and to Released.
	ObserveTransition(TransitionInfo)
}

// AcquireInfo describes one call to Lock, TryLock or TryLockFor (or a
// Semaphore's Acquire, TryAcquire or TryAcquireFor, or an Election's
// Campaign).
type AcquireInfo struct {
	Key      string        // the lease key
	Kind     string        // "mutex", "semaphore", "election", "rwmutex" or "multimutex"
	Mode     string        // for an RWMutex, "read" or "write"; empty for the other kinds
	Owner    string        // the owner id in the value (an election's candidate value)
	Wait     time.Duration // from the call to its outcome
	Attempts int           // how many times Redis was asked
	Token    int64         // the fencing token, when acquired
	// Err is nil when the lock was acquired; otherwise the error the call
	// returned (matching ErrNotAcquired, ErrTimeout, a context error or a
	// Redis error).
	Err error
}

// RenewInfo describes one renewal attempt.
type RenewInfo struct {
	Key     string
	Kind    string // "mutex", "semaphore", "election", "rwmutex" or "multimutex"
	Mode    string // for an RWMutex, "read" or "write" (a downgraded guard's renewals: "read"); empty otherwise
	Token   int64
	Latency time.Duration // from sending the renewal to its outcome
	// Sent is when the renewal was sent, so Sent+Latency is when its
	// answer came. A renewal confirmed in time through the client's
	// renewal batch is reported when the guard's actor next wakes (at its
	// next renewal at the latest), not when the answer came: an Observer
	// that cares when it happened reads these, not its own clock.
	Sent time.Time
	// Err is nil when Redis confirmed the lease; a *LostError with reason
	// LostRefused when the key no longer held this acquisition's value;
	// otherwise the Redis or deadline error, or a *ReplicaAckError when too
	// few replicas acknowledged the renewal (see WithReplicaAck). A failed
	// renewal does not by itself make the guard Lost: it is retried while
	// the lease deadline holds.
	Err error
}

// TransitionInfo describes one change of a guard's state.
type TransitionInfo struct {
	Key   string
	Kind  string // "mutex", "semaphore", "election", "rwmutex" or "multimutex"
	Mode  string // for an RWMutex, the mode the guard was acquired in ("read" or "write", also after a Downgrade); empty otherwise
	Token int64
	From  State
	To    State
	// Err is, for a move to Lost, the *LostError that says why; for a move
	// to Released, the release's error if the final delete failed.
	Err error
	// Held is how long the guard had existed, for a move to Released.
	Held time.Duration
}

// nopObserver is the default Observer.
type nopObserver struct{}

func (nopObserver) ObserveAcquire(AcquireInfo)       {}
func (nopObserver) ObserveRenew(RenewInfo)           {}
func (nopObserver) ObserveTransition(TransitionInfo) {}
