package otelmetrics_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/otelmetrics"
)

func mode(v string) attribute.KeyValue { return otelmetrics.ModeKey.String(v) }

// An RWMutex's measurements carry distlock.kind=rwmutex and the mode; a
// downgraded guard renews as a reader and leaves distlock.held as the
// writer it was counted as.
func TestRWMutexWithRedis(t *testing.T) {
	srv := redistest.Start(t)
	obs, reader := newObserver(t)
	rw, err := distlock.NewRWMutex(srv.Client(), "metered-rw", distlock.WithTTL(300*time.Millisecond), distlock.WithObserver(obs))
	require.NoError(t, err)
	rwKind := kind("rwmutex")
	read, write := mode("read"), mode("write")
	ctx := t.Context()

	r1, err := rw.RLock(ctx)
	require.NoError(t, err)
	r2, err := rw.RLock(ctx)
	require.NoError(t, err)
	_, err = rw.TryLock(ctx)
	require.ErrorIs(t, err, distlock.ErrNotAcquired)
	got := collect(t, reader)
	assert.Equal(t, int64(2), got.sum("distlock.acquisitions", rwKind, read, outcome("acquired")))
	assert.Equal(t, int64(1), got.sum("distlock.acquisitions", rwKind, write, outcome("not_acquired")))
	assert.Equal(t, int64(2), got.sum("distlock.held", rwKind, read))
	for _, g := range []*distlock.Guard{r1, r2} {
		st, err := g.Release(ctx)
		require.NoError(t, err)
		assert.Equal(t, distlock.Released, st)
	}

	w, err := rw.Lock(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), collect(t, reader).sum("distlock.held", rwKind, write))
	require.NoError(t, w.Downgrade(ctx))
	require.Eventually(t, func() bool {
		return collect(t, reader).sum("distlock.renewals", rwKind, read, outcome("ok")) >= 1
	}, eventually, pollEvery, "the downgraded guard renews as a reader")
	st, err := w.Release(ctx)
	require.NoError(t, err)
	assert.Equal(t, distlock.Released, st)
	got = collect(t, reader)
	assert.Equal(t, [2]int64{0, 0}, [2]int64{got.sum("distlock.held", rwKind, read), got.sum("distlock.held", rwKind, write)}, "held at the end: read, write")
	n, _ := got.hist("distlock.hold.duration", rwKind, write, outcome("released"))
	assert.Equal(t, uint64(1), n, "the writer's hold")
}
