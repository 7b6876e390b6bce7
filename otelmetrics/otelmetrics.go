// Package otelmetrics reports what distlock's locks do as OpenTelemetry
// metrics. It is a module of its own, so that distlock itself does not
// depend on OpenTelemetry.
//
// Build an [Observer] and hand it to every Mutex that should be measured:
//
//	obs, err := otelmetrics.New(otelmetrics.WithMeterProvider(provider))
//	if err != nil {
//		return err
//	}
//	m, err := distlock.NewMutex(client, "nightly-report", distlock.WithObserver(obs))
//
// One Observer serves any number of Mutexes; it is safe for concurrent use.
// Without [WithMeterProvider] it uses the global provider
// ([otel.GetMeterProvider]).
//
// # Instruments
//
// All instruments belong to the meter named [ScopeName].
//
//	name                        kind           unit          attributes
//	distlock.acquisitions       Counter        {call}        distlock.outcome
//	distlock.acquire.duration   Histogram      s             distlock.outcome
//	distlock.acquire.attempts   Histogram      {attempt}     distlock.outcome
//	distlock.renewals           Counter        {renewal}     distlock.outcome
//	distlock.renewal.duration   Histogram      s             distlock.outcome
//	distlock.lost               Counter        {event}       distlock.reason
//	distlock.held               UpDownCounter  {lock}        (none)
//	distlock.hold.duration      Histogram      s             distlock.outcome
//
// distlock.acquisitions counts calls to Lock, TryLock and TryLockFor that
// asked Redis, by outcome: "acquired", "not_acquired" (TryLock found the
// lock held), "timeout" (the max wait or TryLockFor's timeout ran out),
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
// distlock.held is the number of guards that are Acquired right now: it goes
// up at an acquisition and at a regain, and down at a loss and at the
// release of a held lease. distlock.hold.duration is how long each guard
// lived, recorded at its release, with outcome "released" or "lost" (the
// lease had slipped before the release).
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
)

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

// Observer records a Mutex's acquisitions, renewals and state changes as
// OpenTelemetry metrics. It implements [distlock.Observer]. Its methods do
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

	// attrs holds the attribute option of each outcome and reason, built
	// once, for measurements without the key.
	attrs map[attribute.KeyValue]metric.MeasurementOption
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
	o := &Observer{withKey: c.withKey, attrs: make(map[attribute.KeyValue]metric.MeasurementOption)}
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
		"Calls to Lock, TryLock and TryLockFor that asked Redis, by outcome.")
	o.acquireDuration = seconds("distlock.acquire.duration",
		"How long each Lock, TryLock or TryLockFor call took, by outcome.", acquireBuckets)
	o.renewals = counter("distlock.renewals", "{renewal}", "Lease renewal attempts, by outcome.")
	o.renewDuration = seconds("distlock.renewal.duration",
		"Latency of lease renewals, from sending to the answer, by outcome.", renewalBuckets)
	o.lost = counter("distlock.lost", "{event}", "Moves of a guard from Acquired to Lost, by reason.")
	o.holdDuration = seconds("distlock.hold.duration",
		"How long each guard lived, recorded at its release, by outcome.", holdBuckets)
	var err error
	o.acquireAttempts, err = meter.Int64Histogram("distlock.acquire.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("How many times each Lock, TryLock or TryLockFor call asked Redis, by outcome."),
		metric.WithExplicitBucketBoundaries(attemptBuckets...))
	errs = append(errs, err)
	o.held, err = meter.Int64UpDownCounter("distlock.held", metric.WithUnit("{lock}"),
		metric.WithDescription("Guards in the Acquired state."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, v := range append(append(append([]string(nil), acquireOutcomes...), renewOutcomes...), holdOutcomes...) {
		kv := OutcomeKey.String(v)
		o.attrs[kv] = metric.WithAttributeSet(attribute.NewSet(kv))
	}
	for _, r := range []distlock.LostReason{distlock.LostRefused, distlock.LostRenewFailed, distlock.LostDeadline} {
		kv := ReasonKey.String(r.String())
		o.attrs[kv] = metric.WithAttributeSet(attribute.NewSet(kv))
	}
	return o, nil
}

// attributes returns the measurement option for kv, plus the key when
// asked for.
func (o *Observer) attributes(kv attribute.KeyValue, key string) metric.MeasurementOption {
	if o.withKey {
		return metric.WithAttributeSet(attribute.NewSet(kv, KeyKey.String(key)))
	}
	if opt, ok := o.attrs[kv]; ok {
		return opt
	}
	return metric.WithAttributeSet(attribute.NewSet(kv))
}

// keyOnly returns the measurement option for an instrument without
// attributes of its own.
func (o *Observer) keyOnly(key string) metric.MeasurementOption {
	if o.withKey {
		return metric.WithAttributeSet(attribute.NewSet(KeyKey.String(key)))
	}
	return metric.WithAttributeSet(*attribute.EmptySet())
}

// ObserveAcquire records one call to Lock, TryLock or TryLockFor.
func (o *Observer) ObserveAcquire(info distlock.AcquireInfo) {
	ctx := context.Background()
	attrs := o.attributes(OutcomeKey.String(acquireOutcome(info.Err)), info.Key)
	o.acquisitions.Add(ctx, 1, attrs)
	o.acquireDuration.Record(ctx, info.Wait.Seconds(), attrs)
	o.acquireAttempts.Record(ctx, int64(info.Attempts), attrs)
	if info.Err == nil {
		o.held.Add(ctx, 1, o.keyOnly(info.Key))
	}
}

// ObserveRenew records one renewal attempt.
func (o *Observer) ObserveRenew(info distlock.RenewInfo) {
	ctx := context.Background()
	attrs := o.attributes(OutcomeKey.String(renewOutcome(info.Err)), info.Key)
	o.renewals.Add(ctx, 1, attrs)
	o.renewDuration.Record(ctx, info.Latency.Seconds(), attrs)
}

// ObserveTransition records a change of a guard's state.
func (o *Observer) ObserveTransition(info distlock.TransitionInfo) {
	ctx := context.Background()
	switch {
	case info.To == distlock.Lost && info.From == distlock.Acquired:
		o.lost.Add(ctx, 1, o.attributes(ReasonKey.String(lostReason(info.Err)), info.Key))
		o.held.Add(ctx, -1, o.keyOnly(info.Key))
	case info.To == distlock.Acquired && info.From == distlock.Lost:
		o.held.Add(ctx, 1, o.keyOnly(info.Key))
	case info.To == distlock.Released:
		outcome := "released"
		if info.From == distlock.Acquired {
			o.held.Add(ctx, -1, o.keyOnly(info.Key))
		} else {
			outcome = "lost"
		}
		o.holdDuration.Record(ctx, info.Held.Seconds(), o.attributes(OutcomeKey.String(outcome), info.Key))
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
