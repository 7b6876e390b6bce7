// Package otelmetrics reports what distlock's locks do as OpenTelemetry
// metrics. It is a module of its own, so that distlock itself does not
// depend on OpenTelemetry.
//
// Build an [Observer] and hand it to every Mutex, Semaphore and Election
// that should be measured:
//
//	obs, err := otelmetrics.New(otelmetrics.WithMeterProvider(provider))
//	if err != nil {
//		return err
//	}
//	m, err := distlock.NewMutex(client, "nightly-report", distlock.WithObserver(obs))
//	s, err := distlock.NewSemaphore(client, "encoders", 4, distlock.WithObserver(obs))
//	e, err := distlock.NewElection(client, "scheduler", distlock.WithObserver(obs))
//
// One Observer serves any number of them; it is safe for concurrent use.
// Without [WithMeterProvider] it uses the global provider
// ([otel.GetMeterProvider]).
//
// # Instruments
//
// All instruments belong to the meter named [ScopeName].
//
//	name                        kind           unit          attributes
//	distlock.acquisitions       Counter        {call}        distlock.kind, distlock.outcome
//	distlock.acquire.duration   Histogram      s             distlock.kind, distlock.outcome
//	distlock.acquire.attempts   Histogram      {attempt}     distlock.kind, distlock.outcome
//	distlock.renewals           Counter        {renewal}     distlock.kind, distlock.outcome
//	distlock.renewal.duration   Histogram      s             distlock.kind, distlock.outcome
//	distlock.lost               Counter        {event}       distlock.kind, distlock.reason
//	distlock.held               UpDownCounter  {lock}        distlock.kind
//	distlock.hold.duration      Histogram      s             distlock.kind, distlock.outcome
//
// distlock.acquisitions counts the calls that asked Redis for a lock, a
// permit or a term (Mutex.Lock, TryLock and TryLockFor; Semaphore.Acquire,
// TryAcquire and TryAcquireFor; Election.Campaign), by outcome:
// "acquired", "not_acquired" (a single try found the lock held, or every
// permit taken), "timeout" (the max wait or the try's timeout ran out),
// "canceled" (the context ended) or "error" (Redis failed).
// distlock.acquire.duration is the time each call took (for an acquired
// lock, the wait), and distlock.acquire.attempts how many times it asked
// Redis.
//
// distlock.renewals counts renewal attempts by outcome: "ok", "refused"
// (the key no longer held the acquisition's value), "timeout" (no answer
// before the call's deadline) or "error". distlock.renewal.duration is
// their latency, from sending to the answer.
//
// distlock.lost counts moves from Acquired to Lost, with the reason as
// [distlock.LostReason] names it: "refused", "renew-failed" or "deadline".
// distlock.held is the number of guards that are Acquired right now: it
// goes up at an acquisition and at a regain, and down at a loss and at the
// release of a held lease. distlock.hold.duration is how long each guard
// lived, recorded at its release, with outcome "released" or "lost" (the
// lease had slipped before the release).
//
// # Locks, permits and terms
//
// A Semaphore's permit and an Election's term are leases kept exactly as a
// Mutex's lock is, so the same instruments measure them. Every measurement
// carries distlock.kind, which is "mutex", "semaphore", "election",
// "rwmutex" or "multimutex" (the Kind of [distlock.AcquireInfo] and of the other infos),
// and an RWMutex's also distlock.mode, "read" or "write" (their Mode; a
// guard that Downgrade made a reader renews and ends as "read", while its
// acquisition and its place in distlock.held were counted as "write"), so
// that a dashboard can tell them apart:
//
//	distlock.held{distlock.kind="semaphore"}    permits held by this process
//	distlock.held{distlock.kind="election"}     terms it leads (at most 1 per election)
//	distlock.lost{distlock.kind="election"}     terms that ended in doubt
//	distlock.acquisitions{distlock.kind="semaphore", distlock.outcome="not_acquired"}
//	                                            tries that found every permit taken
//
// The two attributes have five values together, so they multiply the number
// of series by five at most. An info with an empty Kind (one that code outside distlock
// made) is counted as "mutex".
//
// # The lock key as an attribute
//
// Every lock name becomes a time series of its own if the key is an
// attribute, and a program that locks per customer or per order would
// create thousands of series. So the key is left out unless
// [WithKeyAttribute] asks for it; then every measurement also carries
// distlock.key, the lease key (such as "distlock:{nightly-report}").
package otelmetrics

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/distkit-go/distlock"
)

// ScopeName is the instrumentation scope (meter name) of the instruments.
const ScopeName = "github.com/distkit-go/distlock/otelmetrics"

// Attribute keys.
const (
	// KindKey is on every measurement: "mutex", "semaphore", "election",
	// "rwmutex" or "multimutex" (whose measurements carry the key of the
	// first name given).
	KindKey = attribute.Key("distlock.kind")
	// ModeKey is on the measurements of an RWMutex: "read" or "write".
	ModeKey    = attribute.Key("distlock.mode")
	OutcomeKey = attribute.Key("distlock.outcome")
	ReasonKey  = attribute.Key("distlock.reason")
	KeyKey     = attribute.Key("distlock.key")
)

// Bucket boundaries, in seconds or counts. Lock waits range from
// milliseconds (a free lock) to hours (a queue behind a long job); renewals
// take a round trip; holds last as long as the work.
var (
	acquireBuckets  = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
	attemptBuckets  = []float64{1, 2, 3, 5, 10, 20, 50, 100, 500, 1000}
	renewalBuckets  = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	holdBuckets     = []float64{0.01, 0.1, 1, 10, 60, 300, 900, 3600, 14400, 86400}
	acquireOutcomes = []string{"acquired", "not_acquired", "timeout", "canceled", "error"}
	renewOutcomes   = []string{"ok", "refused", "timeout", "error"}
	holdOutcomes    = []string{"released", "lost"}
	// kinds are the values of distlock.kind, as distlock's infos name
	// them, with the values of distlock.mode that go with each.
	kinds = []kindMode{{"mutex", ""}, {"semaphore", ""}, {"election", ""}, {"rwmutex", "read"}, {"rwmutex", "write"}}
)

// kindMode is what an info says of the kind of its lease: Kind, and Mode
// for an RWMutex.
type kindMode struct{ kind, mode string }

// set returns the attributes of km (the kind, and the mode if there is
// one) with kvs.
func (km kindMode) set(kvs ...attribute.KeyValue) attribute.Set {
	kvs = append(kvs, KindKey.String(km.kind))
	if km.mode != "" {
		kvs = append(kvs, ModeKey.String(km.mode))
	}
	return attribute.NewSet(kvs...)
}

// defaultKind stands for an info whose Kind is empty: infos made before
// Kind existed described a Mutex.
const defaultKind = "mutex"

// An Option configures [New].
type Option func(*config)

type config struct {
	provider metric.MeterProvider
	withKey  bool
}

// WithMeterProvider sets the MeterProvider that creates the instruments
// (default: the global one, [otel.GetMeterProvider]).
func WithMeterProvider(p metric.MeterProvider) Option {
	return func(c *config) { c.provider = p }
}

// WithKeyAttribute adds the lease key to every measurement as the attribute
// distlock.key. Use it only when the program locks a small, fixed set of
// names: each key is a separate time series.
func WithKeyAttribute() Option {
	return func(c *config) { c.withKey = true }
}

// Observer records the acquisitions, renewals and state changes of Mutexes,
// Semaphores and Elections as OpenTelemetry metrics. It implements [distlock.Observer]. Its methods do
// not block and are safe for concurrent use.
type Observer struct {
	withKey bool

	acquisitions    metric.Int64Counter
	acquireDuration metric.Float64Histogram
	acquireAttempts metric.Int64Histogram
	renewals        metric.Int64Counter
	renewDuration   metric.Float64Histogram
	lost            metric.Int64Counter
	held            metric.Int64UpDownCounter
	holdDuration    metric.Float64Histogram

	// attrs holds the attribute option of each kind with each outcome and
	// reason, built once, for measurements without the key; kindOnly that
	// of each kind alone. Both are only read after New.
	attrs    map[attrKey]metric.MeasurementOption
	kindOnly map[kindMode]metric.MeasurementOption
}

type attrKey struct {
	km kindMode
	kv attribute.KeyValue
}

var _ distlock.Observer = (*Observer)(nil)

// New creates the instruments and returns an Observer that records into
// them. It returns an error if the provider refuses an instrument.
func New(opts ...Option) (*Observer, error) {
	var c config
	for _, opt := range opts {
		opt(&c)
	}
	if c.provider == nil {
		c.provider = otel.GetMeterProvider()
	}
	meter := c.provider.Meter(ScopeName)
	o := &Observer{
		withKey:  c.withKey,
		attrs:    make(map[attrKey]metric.MeasurementOption),
		kindOnly: make(map[kindMode]metric.MeasurementOption),
	}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	seconds := func(name, desc string, buckets []float64) metric.Float64Histogram {
		h, err := meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	o.acquisitions = counter("distlock.acquisitions", "{call}",
		"Calls that asked Redis for a lock, a permit or a term, by kind and outcome.")
	o.acquireDuration = seconds("distlock.acquire.duration",
		"How long each call for a lock, a permit or a term took, by kind and outcome.", acquireBuckets)
	o.renewals = counter("distlock.renewals", "{renewal}", "Lease renewal attempts, by kind and outcome.")
	o.renewDuration = seconds("distlock.renewal.duration",
		"Latency of lease renewals, from sending to the answer, by kind and outcome.", renewalBuckets)
	o.lost = counter("distlock.lost", "{event}", "Moves of a guard from Acquired to Lost, by kind and reason.")
	o.holdDuration = seconds("distlock.hold.duration",
		"How long each guard lived, recorded at its release, by kind and outcome.", holdBuckets)
	var err error
	o.acquireAttempts, err = meter.Int64Histogram("distlock.acquire.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("How many times each call for a lock, a permit or a term asked Redis, by kind and outcome."),
		metric.WithExplicitBucketBoundaries(attemptBuckets...))
	errs = append(errs, err)
	o.held, err = meter.Int64UpDownCounter("distlock.held", metric.WithUnit("{lock}"),
		metric.WithDescription("Guards in the Acquired state: locks, permits and terms held, by kind."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var kvs []attribute.KeyValue
	for _, v := range append(append(append([]string(nil), acquireOutcomes...), renewOutcomes...), holdOutcomes...) {
		kvs = append(kvs, OutcomeKey.String(v))
	}
	for _, r := range []distlock.LostReason{distlock.LostRefused, distlock.LostRenewFailed, distlock.LostDeadline} {
		kvs = append(kvs, ReasonKey.String(r.String()))
	}
	for _, km := range kinds {
		o.kindOnly[km] = metric.WithAttributeSet(km.set())
		for _, kv := range kvs {
			o.attrs[attrKey{km, kv}] = metric.WithAttributeSet(km.set(kv))
		}
	}
	return o, nil
}

// kindOf returns an info's kind and mode.
func kindOf(kind, mode string) kindMode {
	if kind == "" {
		kind = defaultKind
	}
	return kindMode{kind, mode}
}

// attributes returns the measurement option for km and kv, plus the key
// when asked for.
func (o *Observer) attributes(km kindMode, kv attribute.KeyValue, key string) metric.MeasurementOption {
	if o.withKey {
		return metric.WithAttributeSet(km.set(kv, KeyKey.String(key)))
	}
	if opt, ok := o.attrs[attrKey{km, kv}]; ok {
		return opt
	}
	return metric.WithAttributeSet(km.set(kv))
}

// kindAttr returns the measurement option for an instrument without
// attributes of its own: the kind (and mode), plus the key when asked for.
func (o *Observer) kindAttr(km kindMode, key string) metric.MeasurementOption {
	if o.withKey {
		return metric.WithAttributeSet(km.set(KeyKey.String(key)))
	}
	if opt, ok := o.kindOnly[km]; ok {
		return opt
	}
	return metric.WithAttributeSet(km.set())
}

// ObserveAcquire records one call for a lock, a permit or a term.
func (o *Observer) ObserveAcquire(info distlock.AcquireInfo) {
	ctx := context.Background()
	km := kindOf(info.Kind, info.Mode)
	attrs := o.attributes(km, OutcomeKey.String(acquireOutcome(info.Err)), info.Key)
	o.acquisitions.Add(ctx, 1, attrs)
	o.acquireDuration.Record(ctx, info.Wait.Seconds(), attrs)
	o.acquireAttempts.Record(ctx, int64(info.Attempts), attrs)
	if info.Err == nil {
		o.held.Add(ctx, 1, o.kindAttr(km, info.Key))
	}
}

// ObserveRenew records one renewal attempt.
func (o *Observer) ObserveRenew(info distlock.RenewInfo) {
	ctx := context.Background()
	attrs := o.attributes(kindOf(info.Kind, info.Mode), OutcomeKey.String(renewOutcome(info.Err)), info.Key)
	o.renewals.Add(ctx, 1, attrs)
	o.renewDuration.Record(ctx, info.Latency.Seconds(), attrs)
}

// ObserveTransition records a change of a guard's state.
func (o *Observer) ObserveTransition(info distlock.TransitionInfo) {
	ctx := context.Background()
	km := kindOf(info.Kind, info.Mode)
	switch {
	case info.To == distlock.Lost && info.From == distlock.Acquired:
		o.lost.Add(ctx, 1, o.attributes(km, ReasonKey.String(lostReason(info.Err)), info.Key))
		o.held.Add(ctx, -1, o.kindAttr(km, info.Key))
	case info.To == distlock.Acquired && info.From == distlock.Lost:
		o.held.Add(ctx, 1, o.kindAttr(km, info.Key))
	case info.To == distlock.Released:
		outcome := "released"
		if info.From == distlock.Acquired {
			o.held.Add(ctx, -1, o.kindAttr(km, info.Key))
		} else {
			outcome = "lost"
		}
		o.holdDuration.Record(ctx, info.Held.Seconds(), o.attributes(km, OutcomeKey.String(outcome), info.Key))
	}
}

func acquireOutcome(err error) string {
	switch {
	case err == nil:
		return "acquired"
	case errors.Is(err, distlock.ErrNotAcquired):
		return "not_acquired"
	case errors.Is(err, distlock.ErrTimeout):
		return "timeout"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "error"
}

func renewOutcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, distlock.ErrLost):
		return "refused"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "error"
}

// lostReason names the reason of a loss as [distlock.LostReason.String]
// does, or "unknown" for an error that does not say.
func lostReason(err error) string {
	var le *distlock.LostError
	if errors.As(err, &le) {
		return le.Reason.String()
	}
	return "unknown"
}
