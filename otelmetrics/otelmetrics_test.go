package otelmetrics_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/otelmetrics"
)

const (
	eventually = 5 * time.Second
	pollEvery  = 10 * time.Millisecond
)

// newObserver returns an Observer that records into a fresh SDK provider,
// and the reader that collects from it.
func newObserver(t *testing.T, opts ...otelmetrics.Option) (*otelmetrics.Observer, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	obs, err := otelmetrics.New(append([]otelmetrics.Option{otelmetrics.WithMeterProvider(provider)}, opts...)...)
	require.NoError(t, err)
	return obs, reader
}

// metrics is one collection, by instrument name.
type metrics map[string]metricdata.Metrics

func collect(t *testing.T, reader *sdkmetric.ManualReader) metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	got := make(metrics)
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, otelmetrics.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			got[m.Name] = m
		}
	}
	return got
}

// sum returns the value of a counter's data point with exactly attrs, or 0.
func (ms metrics) sum(name string, attrs ...attribute.KeyValue) int64 {
	s, ok := ms[name].Data.(metricdata.Sum[int64])
	if !ok {
		return 0
	}
	want := attribute.NewSet(attrs...)
	for _, dp := range s.DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp.Value
		}
	}
	return 0
}

// hist returns the count and sum of a histogram's data point with exactly
// attrs.
func (ms metrics) hist(name string, attrs ...attribute.KeyValue) (uint64, float64) {
	want := attribute.NewSet(attrs...)
	switch h := ms[name].Data.(type) {
	case metricdata.Histogram[float64]:
		for _, dp := range h.DataPoints {
			if dp.Attributes.Equals(&want) {
				return dp.Count, dp.Sum
			}
		}
	case metricdata.Histogram[int64]:
		for _, dp := range h.DataPoints {
			if dp.Attributes.Equals(&want) {
				return dp.Count, float64(dp.Sum)
			}
		}
	}
	return 0, 0
}

func outcome(v string) attribute.KeyValue { return otelmetrics.OutcomeKey.String(v) }
func reason(v string) attribute.KeyValue  { return otelmetrics.ReasonKey.String(v) }

const key = "distlock:{job}"

// feed makes the calls a Mutex would make over a few acquisitions.
func feed(obs distlock.Observer) {
	lost := func(r distlock.LostReason) error { return &distlock.LostError{Key: key, Reason: r} }
	// Acquired after a wait, lost to a deadline, regained, released.
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Owner: "a", Wait: 250 * time.Millisecond, Attempts: 3, Token: 10})
	obs.ObserveRenew(distlock.RenewInfo{Key: key, Token: 10, Latency: 2 * time.Millisecond})
	obs.ObserveRenew(distlock.RenewInfo{Key: key, Token: 10, Latency: 40 * time.Millisecond, Err: context.DeadlineExceeded})
	obs.ObserveTransition(distlock.TransitionInfo{Key: key, Token: 10, From: distlock.Acquired, To: distlock.Lost, Err: lost(distlock.LostDeadline)})
	obs.ObserveRenew(distlock.RenewInfo{Key: key, Token: 10, Latency: 3 * time.Millisecond})
	obs.ObserveTransition(distlock.TransitionInfo{Key: key, Token: 10, From: distlock.Lost, To: distlock.Acquired})
	obs.ObserveTransition(distlock.TransitionInfo{Key: key, Token: 10, From: distlock.Acquired, To: distlock.Released, Held: 3 * time.Second})
	// Acquired at once, refused, released while lost.
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Owner: "a", Wait: time.Millisecond, Attempts: 1, Token: 11})
	obs.ObserveRenew(distlock.RenewInfo{Key: key, Token: 11, Latency: time.Millisecond, Err: lost(distlock.LostRefused)})
	obs.ObserveTransition(distlock.TransitionInfo{Key: key, Token: 11, From: distlock.Acquired, To: distlock.Lost, Err: lost(distlock.LostRefused)})
	obs.ObserveRenew(distlock.RenewInfo{Key: key, Token: 11, Latency: 5 * time.Millisecond, Err: errors.New("connection reset")})
	obs.ObserveTransition(distlock.TransitionInfo{Key: key, Token: 11, From: distlock.Lost, To: distlock.Released, Held: time.Second})
	// Calls that did not acquire.
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Owner: "b", Attempts: 1, Err: &distlock.NotAcquiredError{Key: key, Holder: "a"}})
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Owner: "b", Wait: 2 * time.Second, Attempts: 40, Err: &distlock.TimeoutError{Key: key}})
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Owner: "b", Wait: time.Second, Attempts: 20, Err: fmt.Errorf("waiting: %w", context.Canceled)})
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Owner: "b", Attempts: 1, Err: errors.New("READONLY")})
}

func TestInstruments(t *testing.T) {
	obs, reader := newObserver(t)
	feed(obs)
	got := collect(t, reader)

	// The documented names, kinds and units.
	for name, want := range map[string]struct {
		unit string
		kind string
	}{
		"distlock.acquisitions":     {"{call}", "counter"},
		"distlock.acquire.duration": {"s", "histogram"},
		"distlock.acquire.attempts": {"{attempt}", "histogram"},
		"distlock.renewals":         {"{renewal}", "counter"},
		"distlock.renewal.duration": {"s", "histogram"},
		"distlock.lost":             {"{event}", "counter"},
		"distlock.held":             {"{lock}", "updowncounter"},
		"distlock.hold.duration":    {"s", "histogram"},
	} {
		m, ok := got[name]
		if !assert.True(t, ok, "no instrument %s", name) {
			continue
		}
		assert.Equal(t, want.unit, m.Unit, name)
		assert.NotEmpty(t, m.Description, name)
		kind := "histogram"
		if s, ok := m.Data.(metricdata.Sum[int64]); ok {
			kind = "updowncounter"
			if s.IsMonotonic {
				kind = "counter"
			}
		}
		assert.Equal(t, want.kind, kind, name)
	}
	assert.Len(t, got, 8, "undocumented instruments")

	for o, want := range map[string]int64{"acquired": 2, "not_acquired": 1, "timeout": 1, "canceled": 1, "error": 1} {
		assert.Equal(t, want, got.sum("distlock.acquisitions", outcome(o)), "acquisitions %s", o)
	}
	n, s := got.hist("distlock.acquire.duration", outcome("acquired"))
	assert.Equal(t, uint64(2), n)
	assert.InDelta(t, 0.251, s, 1e-9)
	n, s = got.hist("distlock.acquire.attempts", outcome("acquired"))
	assert.Equal(t, uint64(2), n)
	assert.Equal(t, 4.0, s)
	n, s = got.hist("distlock.acquire.attempts", outcome("timeout"))
	assert.Equal(t, uint64(1), n)
	assert.Equal(t, 40.0, s)

	for o, want := range map[string]int64{"ok": 2, "refused": 1, "timeout": 1, "error": 1} {
		assert.Equal(t, want, got.sum("distlock.renewals", outcome(o)), "renewals %s", o)
	}
	n, s = got.hist("distlock.renewal.duration", outcome("ok"))
	assert.Equal(t, uint64(2), n)
	assert.InDelta(t, 0.005, s, 1e-9)

	assert.Equal(t, int64(1), got.sum("distlock.lost", reason("deadline")))
	assert.Equal(t, int64(1), got.sum("distlock.lost", reason("refused")))
	assert.Equal(t, int64(0), got.sum("distlock.lost", reason("renew-failed")))

	assert.Equal(t, int64(0), got.sum("distlock.held"), "every guard was released")
	n, s = got.hist("distlock.hold.duration", outcome("released"))
	assert.Equal(t, uint64(1), n)
	assert.InDelta(t, 3.0, s, 1e-9)
	n, s = got.hist("distlock.hold.duration", outcome("lost"))
	assert.Equal(t, uint64(1), n)
	assert.InDelta(t, 1.0, s, 1e-9)
}

func TestHeldCountsAcquiredGuards(t *testing.T) {
	obs, reader := newObserver(t)
	held := func() int64 { return collect(t, reader).sum("distlock.held") }
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Attempts: 1, Token: 1})
	obs.ObserveAcquire(distlock.AcquireInfo{Key: "distlock:{other}", Attempts: 1, Token: 2})
	assert.Equal(t, int64(2), held())
	obs.ObserveTransition(distlock.TransitionInfo{Key: key, From: distlock.Acquired, To: distlock.Lost,
		Err: &distlock.LostError{Key: key, Reason: distlock.LostRenewFailed}})
	assert.Equal(t, int64(1), held(), "a lost guard holds nothing")
	obs.ObserveTransition(distlock.TransitionInfo{Key: key, From: distlock.Lost, To: distlock.Released})
	assert.Equal(t, int64(1), held(), "releasing a lost guard changes nothing")
	assert.Equal(t, int64(1), collect(t, reader).sum("distlock.lost", reason("renew-failed")))
}

func TestKeyAttribute(t *testing.T) {
	obs, reader := newObserver(t, otelmetrics.WithKeyAttribute())
	feed(obs)
	got := collect(t, reader)
	k := otelmetrics.KeyKey.String(key)
	assert.Equal(t, int64(2), got.sum("distlock.acquisitions", outcome("acquired"), k))
	assert.Equal(t, int64(0), got.sum("distlock.acquisitions", outcome("acquired")), "a point without the key")
	assert.Equal(t, int64(1), got.sum("distlock.lost", reason("refused"), k))
	assert.Equal(t, int64(2), got.sum("distlock.renewals", outcome("ok"), k))
	n, _ := got.hist("distlock.hold.duration", outcome("released"), k)
	assert.Equal(t, uint64(1), n)
	held, ok := got["distlock.held"].Data.(metricdata.Sum[int64])
	require.True(t, ok)
	require.Len(t, held.DataPoints, 1)
	assert.Equal(t, attribute.NewSet(k), held.DataPoints[0].Attributes)

	// Without the option, no measurement names the key.
	obs, reader = newObserver(t)
	feed(obs)
	for name, m := range collect(t, reader) {
		switch data := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, dp := range data.DataPoints {
				assert.False(t, dp.Attributes.HasValue(otelmetrics.KeyKey), name)
			}
		case metricdata.Histogram[float64]:
			for _, dp := range data.DataPoints {
				assert.False(t, dp.Attributes.HasValue(otelmetrics.KeyKey), name)
			}
		}
	}
}

func TestGlobalProvider(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	// The global provider cannot be reset once set; no other test uses it.
	otel.SetMeterProvider(provider)

	obs, err := otelmetrics.New()
	require.NoError(t, err)
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Attempts: 1, Token: 1})
	assert.Equal(t, int64(1), collect(t, reader).sum("distlock.acquisitions", outcome("acquired")))
}

// A real lock against redis-server: acquisitions, renewals, a loss caused by
// an operator deleting the key, and the releases.
func TestWithRedis(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	obs, reader := newObserver(t)
	newMutex := func(owner string) *distlock.Mutex {
		m, err := distlock.NewMutex(client, "metered", distlock.WithTTL(time.Second),
			distlock.WithOwner(owner), distlock.WithObserver(obs))
		require.NoError(t, err)
		return m
	}
	one, two := newMutex("one"), newMutex("two")
	ctx, cancel := context.WithTimeout(t.Context(), eventually)
	defer cancel()

	g, err := one.Lock(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), collect(t, reader).sum("distlock.held"))
	_, err = two.TryLock(ctx)
	require.ErrorIs(t, err, distlock.ErrNotAcquired)
	require.Eventually(t, func() bool { return collect(t, reader).sum("distlock.renewals", outcome("ok")) >= 1 },
		eventually, pollEvery, "no renewal recorded")

	srv.MustDo("DEL", one.Key())
	require.Eventually(t, func() bool { return collect(t, reader).sum("distlock.lost", reason("refused")) == 1 },
		eventually, pollEvery, "the loss was not recorded")
	st, err := g.Release(ctx)
	require.NoError(t, err)
	assert.Equal(t, distlock.Lost, st)

	g, err = two.Lock(ctx)
	require.NoError(t, err)
	st, err = g.Release(ctx)
	require.NoError(t, err)
	assert.Equal(t, distlock.Released, st)

	got := collect(t, reader)
	assert.Equal(t, int64(2), got.sum("distlock.acquisitions", outcome("acquired")))
	assert.Equal(t, int64(1), got.sum("distlock.acquisitions", outcome("not_acquired")))
	assert.GreaterOrEqual(t, got.sum("distlock.renewals", outcome("refused")), int64(1))
	assert.Equal(t, int64(0), got.sum("distlock.held"))
	n, _ := got.hist("distlock.hold.duration", outcome("lost"))
	assert.Equal(t, uint64(1), n)
	n, _ = got.hist("distlock.hold.duration", outcome("released"))
	assert.Equal(t, uint64(1), n)
	n, s := got.hist("distlock.renewal.duration", outcome("ok"))
	assert.Positive(t, n)
	assert.Positive(t, s)
}
