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
func kind(v string) attribute.KeyValue    { return otelmetrics.KindKey.String(v) }

var mutex = kind("mutex")

const key = "distlock:{job}"

// feed makes the calls a lock of kind k would make over a few acquisitions
// (a Mutex if k is empty).
func feed(obs distlock.Observer, k string) {
	lost := func(r distlock.LostReason) error { return &distlock.LostError{Key: key, Reason: r} }
	// Acquired after a wait, lost to a deadline, regained, released.
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Kind: k, Owner: "a", Wait: 250 * time.Millisecond, Attempts: 3, Token: 10})
	obs.ObserveRenew(distlock.RenewInfo{Key: key, Kind: k, Token: 10, Latency: 2 * time.Millisecond})
	obs.ObserveRenew(distlock.RenewInfo{Key: key, Kind: k, Token: 10, Latency: 40 * time.Millisecond, Err: context.DeadlineExceeded})
	obs.ObserveTransition(distlock.TransitionInfo{Key: key, Kind: k, Token: 10, From: distlock.Acquired, To: distlock.Lost, Err: lost(distlock.LostDeadline)})
	obs.ObserveRenew(distlock.RenewInfo{Key: key, Kind: k, Token: 10, Latency: 3 * time.Millisecond})
	obs.ObserveTransition(distlock.TransitionInfo{Key: key, Kind: k, Token: 10, From: distlock.Lost, To: distlock.Acquired})
	obs.ObserveTransition(distlock.TransitionInfo{Key: key, Kind: k, Token: 10, From: distlock.Acquired, To: distlock.Released, Held: 3 * time.Second})
	// Acquired at once, refused, released while lost.
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Kind: k, Owner: "a", Wait: time.Millisecond, Attempts: 1, Token: 11})
	obs.ObserveRenew(distlock.RenewInfo{Key: key, Kind: k, Token: 11, Latency: time.Millisecond, Err: lost(distlock.LostRefused)})
	obs.ObserveTransition(distlock.TransitionInfo{Key: key, Kind: k, Token: 11, From: distlock.Acquired, To: distlock.Lost, Err: lost(distlock.LostRefused)})
	obs.ObserveRenew(distlock.RenewInfo{Key: key, Kind: k, Token: 11, Latency: 5 * time.Millisecond, Err: errors.New("connection reset")})
	obs.ObserveTransition(distlock.TransitionInfo{Key: key, Kind: k, Token: 11, From: distlock.Lost, To: distlock.Released, Held: time.Second})
	// Calls that did not acquire.
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Kind: k, Owner: "b", Attempts: 1, Err: &distlock.NotAcquiredError{Key: key, Holder: "a"}})
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Kind: k, Owner: "b", Wait: 2 * time.Second, Attempts: 40, Err: &distlock.TimeoutError{Key: key}})
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Kind: k, Owner: "b", Wait: time.Second, Attempts: 20, Err: fmt.Errorf("waiting: %w", context.Canceled)})
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Kind: k, Owner: "b", Attempts: 1, Err: errors.New("READONLY")})
}

func TestInstruments(t *testing.T) {
	obs, reader := newObserver(t)
	feed(obs, "mutex")
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
		assert.Equal(t, want, got.sum("distlock.acquisitions", mutex, outcome(o)), "acquisitions %s", o)
	}
	n, s := got.hist("distlock.acquire.duration", mutex, outcome("acquired"))
	assert.Equal(t, uint64(2), n)
	assert.InDelta(t, 0.251, s, 1e-9)
	n, s = got.hist("distlock.acquire.attempts", mutex, outcome("acquired"))
	assert.Equal(t, uint64(2), n)
	assert.Equal(t, 4.0, s)
	n, s = got.hist("distlock.acquire.attempts", mutex, outcome("timeout"))
	assert.Equal(t, uint64(1), n)
	assert.Equal(t, 40.0, s)

	for o, want := range map[string]int64{"ok": 2, "refused": 1, "timeout": 1, "error": 1} {
		assert.Equal(t, want, got.sum("distlock.renewals", mutex, outcome(o)), "renewals %s", o)
	}
	n, s = got.hist("distlock.renewal.duration", mutex, outcome("ok"))
	assert.Equal(t, uint64(2), n)
	assert.InDelta(t, 0.005, s, 1e-9)

	assert.Equal(t, int64(1), got.sum("distlock.lost", mutex, reason("deadline")))
	assert.Equal(t, int64(1), got.sum("distlock.lost", mutex, reason("refused")))
	assert.Equal(t, int64(0), got.sum("distlock.lost", mutex, reason("renew-failed")))

	assert.Equal(t, int64(0), got.sum("distlock.held", mutex), "every guard was released")
	n, s = got.hist("distlock.hold.duration", mutex, outcome("released"))
	assert.Equal(t, uint64(1), n)
	assert.InDelta(t, 3.0, s, 1e-9)
	n, s = got.hist("distlock.hold.duration", mutex, outcome("lost"))
	assert.Equal(t, uint64(1), n)
	assert.InDelta(t, 1.0, s, 1e-9)
}

// The infos here have no Kind: they count as a Mutex's.
func TestHeldCountsAcquiredGuards(t *testing.T) {
	obs, reader := newObserver(t)
	held := func() int64 { return collect(t, reader).sum("distlock.held", mutex) }
	obs.ObserveAcquire(distlock.AcquireInfo{Key: key, Attempts: 1, Token: 1})
	obs.ObserveAcquire(distlock.AcquireInfo{Key: "distlock:{other}", Attempts: 1, Token: 2})
	assert.Equal(t, int64(2), held())
	obs.ObserveTransition(distlock.TransitionInfo{Key: key, From: distlock.Acquired, To: distlock.Lost,
		Err: &distlock.LostError{Key: key, Reason: distlock.LostRenewFailed}})
	assert.Equal(t, int64(1), held(), "a lost guard holds nothing")
	obs.ObserveTransition(distlock.TransitionInfo{Key: key, From: distlock.Lost, To: distlock.Released})
	assert.Equal(t, int64(1), held(), "releasing a lost guard changes nothing")
	assert.Equal(t, int64(1), collect(t, reader).sum("distlock.lost", mutex, reason("renew-failed")))
}

// Each kind is a series of its own on every instrument, and every data
// point says its kind, with the key or without.
func TestKindOnEveryMeasurement(t *testing.T) {
	kinds := []string{"mutex", "semaphore", "election"}
	for _, withKey := range []bool{false, true} {
		var opts []otelmetrics.Option
		var extra []attribute.KeyValue
		if withKey {
			opts = append(opts, otelmetrics.WithKeyAttribute())
			extra = append(extra, otelmetrics.KeyKey.String(key))
		}
		obs, reader := newObserver(t, opts...)
		// One round of each kind, and a second of elections.
		for _, k := range kinds {
			feed(obs, k)
		}
		feed(obs, "election")
		got := collect(t, reader)
		with := func(k string, kv ...attribute.KeyValue) []attribute.KeyValue {
			return append(append([]attribute.KeyValue{kind(k)}, extra...), kv...)
		}
		for k, rounds := range map[string]int64{"mutex": 1, "semaphore": 1, "election": 2} {
			assert.Equal(t, 2*rounds, got.sum("distlock.acquisitions", with(k, outcome("acquired"))...), "acquired %s", k)
			assert.Equal(t, rounds, got.sum("distlock.acquisitions", with(k, outcome("not_acquired"))...), "not acquired %s", k)
			assert.Equal(t, 2*rounds, got.sum("distlock.renewals", with(k, outcome("ok"))...), "renewals %s", k)
			assert.Equal(t, rounds, got.sum("distlock.lost", with(k, reason("refused"))...), "lost %s", k)
			n, _ := got.hist("distlock.hold.duration", with(k, outcome("released"))...)
			assert.Equal(t, uint64(rounds), n, "hold duration %s", k)
			n, _ = got.hist("distlock.acquire.attempts", with(k, outcome("timeout"))...)
			assert.Equal(t, uint64(rounds), n, "attempts %s", k)
		}
		points := 0
		check := func(name string, attrs attribute.Set) {
			points++
			v, ok := attrs.Value(otelmetrics.KindKey)
			assert.True(t, ok, "%s: a point without distlock.kind: %v", name, attrs.ToSlice())
			assert.Contains(t, kinds, v.AsString(), name)
			assert.Equal(t, withKey, attrs.HasValue(otelmetrics.KeyKey), name)
		}
		for name, m := range got {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					check(name, dp.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					check(name, dp.Attributes)
				}
			case metricdata.Histogram[int64]:
				for _, dp := range data.DataPoints {
					check(name, dp.Attributes)
				}
			default:
				t.Errorf("%s: unexpected data %T", name, m.Data)
			}
		}
		assert.Greater(t, points, 3*8, "points checked")
	}
}

func TestKeyAttribute(t *testing.T) {
	obs, reader := newObserver(t, otelmetrics.WithKeyAttribute())
	feed(obs, "mutex")
	got := collect(t, reader)
	k := otelmetrics.KeyKey.String(key)
	assert.Equal(t, int64(2), got.sum("distlock.acquisitions", mutex, outcome("acquired"), k))
	assert.Equal(t, int64(0), got.sum("distlock.acquisitions", mutex, outcome("acquired")), "a point without the key")
	assert.Equal(t, int64(1), got.sum("distlock.lost", mutex, reason("refused"), k))
	assert.Equal(t, int64(2), got.sum("distlock.renewals", mutex, outcome("ok"), k))
	n, _ := got.hist("distlock.hold.duration", mutex, outcome("released"), k)
	assert.Equal(t, uint64(1), n)
	held, ok := got["distlock.held"].Data.(metricdata.Sum[int64])
	require.True(t, ok)
	require.Len(t, held.DataPoints, 1)
	assert.Equal(t, attribute.NewSet(mutex, k), held.DataPoints[0].Attributes)

	// Without the option, no measurement names the key.
	obs, reader = newObserver(t)
	feed(obs, "")
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
	assert.Equal(t, int64(1), collect(t, reader).sum("distlock.acquisitions", mutex, outcome("acquired")))
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
	assert.Equal(t, int64(1), collect(t, reader).sum("distlock.held", mutex))
	_, err = two.TryLock(ctx)
	require.ErrorIs(t, err, distlock.ErrNotAcquired)
	require.Eventually(t, func() bool { return collect(t, reader).sum("distlock.renewals", mutex, outcome("ok")) >= 1 },
		eventually, pollEvery, "no renewal recorded")

	srv.MustDo("DEL", one.Key())
	require.Eventually(t, func() bool { return collect(t, reader).sum("distlock.lost", mutex, reason("refused")) == 1 },
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
	assert.Equal(t, int64(2), got.sum("distlock.acquisitions", mutex, outcome("acquired")))
	assert.Equal(t, int64(1), got.sum("distlock.acquisitions", mutex, outcome("not_acquired")))
	assert.GreaterOrEqual(t, got.sum("distlock.renewals", mutex, outcome("refused")), int64(1))
	assert.Equal(t, int64(0), got.sum("distlock.held", mutex))
	n, _ := got.hist("distlock.hold.duration", mutex, outcome("lost"))
	assert.Equal(t, uint64(1), n)
	n, _ = got.hist("distlock.hold.duration", mutex, outcome("released"))
	assert.Equal(t, uint64(1), n)
	n, s := got.hist("distlock.renewal.duration", mutex, outcome("ok"))
	assert.Positive(t, n)
	assert.Positive(t, s)
}

// A Mutex, a Semaphore and an Election against redis-server, with one
// Observer: the held gauge counts locks, permits and terms apart, and a
// term that an operator ends is counted as an election's loss, not a
// semaphore's or a mutex's.
func TestKindsWithRedis(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	obs, reader := newObserver(t)
	opts := []distlock.Option{distlock.WithTTL(time.Second), distlock.WithObserver(obs)}
	m, err := distlock.NewMutex(client, "metered-lock", opts...)
	require.NoError(t, err)
	s, err := distlock.NewSemaphore(client, "metered-pool", 3, opts...)
	require.NoError(t, err)
	e, err := distlock.NewElection(client, "metered-leader", opts...)
	require.NoError(t, err)
	// ctx bounds the holds too: it lives as long as the test.
	ctx := t.Context()
	semaphore, election := kind("semaphore"), kind("election")
	held := func(got metrics) [3]int64 {
		return [3]int64{got.sum("distlock.held", mutex), got.sum("distlock.held", semaphore), got.sum("distlock.held", election)}
	}

	lock, err := m.Lock(ctx)
	require.NoError(t, err)
	var permits []*distlock.Guard
	for range 3 {
		g, err := s.Acquire(ctx)
		require.NoError(t, err)
		permits = append(permits, g)
	}
	_, err = s.TryAcquire(ctx)
	require.ErrorIs(t, err, distlock.ErrNotAcquired)
	term, err := e.Campaign(ctx, "node-1")
	require.NoError(t, err)

	got := collect(t, reader)
	assert.Equal(t, [3]int64{1, 3, 1}, held(got), "held: mutex, semaphore, election")
	assert.Equal(t, int64(1), got.sum("distlock.acquisitions", mutex, outcome("acquired")))
	assert.Equal(t, int64(3), got.sum("distlock.acquisitions", semaphore, outcome("acquired")))
	assert.Equal(t, int64(1), got.sum("distlock.acquisitions", semaphore, outcome("not_acquired")))
	assert.Equal(t, int64(1), got.sum("distlock.acquisitions", election, outcome("acquired")))
	// Each kind renews through the same instrument.
	require.Eventually(t, func() bool {
		got := collect(t, reader)
		return got.sum("distlock.renewals", mutex, outcome("ok")) >= 1 &&
			got.sum("distlock.renewals", semaphore, outcome("ok")) >= 3 &&
			got.sum("distlock.renewals", election, outcome("ok")) >= 1
	}, eventually, pollEvery, "renewals of every kind")

	// An operator deletes the leader's lease: the term ends at the next
	// renewal, as a loss of kind "election".
	srv.MustDo("DEL", e.Key())
	require.Eventually(t, func() bool { return collect(t, reader).sum("distlock.lost", election, reason("refused")) == 1 },
		eventually, pollEvery, "the end of the term was not recorded")
	<-term.Context().Done()
	got = collect(t, reader)
	assert.Equal(t, [3]int64{1, 3, 0}, held(got), "held after the term was lost: mutex, semaphore, election")
	assert.Equal(t, int64(0), got.sum("distlock.lost", mutex, reason("refused")))
	assert.Equal(t, int64(0), got.sum("distlock.lost", semaphore, reason("refused")))

	for _, g := range append(permits, lock) {
		st, err := g.Release(ctx)
		require.NoError(t, err)
		assert.Equal(t, distlock.Released, st)
	}
	st, err := term.Release(ctx)
	require.NoError(t, err)
	assert.Equal(t, distlock.Lost, st)

	got = collect(t, reader)
	assert.Equal(t, [3]int64{0, 0, 0}, held(got), "held at the end: mutex, semaphore, election")
	n, _ := got.hist("distlock.hold.duration", semaphore, outcome("released"))
	assert.Equal(t, uint64(3), n, "permits released")
	n, _ = got.hist("distlock.hold.duration", mutex, outcome("released"))
	assert.Equal(t, uint64(1), n, "locks released")
	n, _ = got.hist("distlock.hold.duration", election, outcome("lost"))
	assert.Equal(t, uint64(1), n, "terms ended lost")
	n, _ = got.hist("distlock.hold.duration", election, outcome("released"))
	assert.Equal(t, uint64(0), n, "terms ended released")
}
