package goredis_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/goredis"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// TestMultiMutexMixed runs a MultiMutex on go-redis against a Mutex on
// rueidis of one of its names: each name of the set is that Mutex's lock.
// While the Mutex holds the shared name, the set's TryLock is refused and
// leaves every name as it found it, and its Lock waits in the name's line;
// the Mutex's release passes the name on and Lock returns holding every
// name, each with its own fencing token; while the set is held the Mutex
// is refused; and the set's release frees every name.
func TestMultiMutexMixed(t *testing.T) {
	srv := redistest.Start(t)
	gr := newClient(t, srv.Addr())
	ctx := ctxFor(t, 2*time.Minute)
	names := []string{"multi-a", "multi-b", "multi-c"}
	const shared = "multi-b"
	keysOf := make(map[string]lease.Keys)
	for _, name := range names {
		k, err := lease.NewKeys(distlock.DefaultNamespace, name)
		require.NoError(t, err)
		keysOf[name] = k
	}

	mm, err := goredis.NewMultiMutex(gr, names, distlock.WithOwner("go-redis"))
	require.NoError(t, err)
	assert.Equal(t, names, mm.Names())
	mx, err := distlock.NewMutex(srv.Client(), shared, distlock.WithOwner("rueidis"))
	require.NoError(t, err)

	single, err := mx.TryLock(ctx)
	require.NoError(t, err)
	_, err = mm.TryLock(ctx)
	var na *distlock.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("MultiMutex.TryLock while a Mutex holds %s: err = %v, want a *distlock.NotAcquiredError", shared, err)
	}
	assert.ErrorIs(t, err, distlock.ErrNotAcquired)
	assert.Equal(t, keysOf[shared].Lease, na.Key, "NotAcquiredError.Key names the held name, not the first of the set")
	assert.Equal(t, "rueidis", na.Holder)
	for _, name := range names {
		if name == shared {
			continue
		}
		n, err := gr.Exists(ctx, keysOf[name].Lease).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "a refused TryLock left %s held", name)
	}

	type outcome struct {
		g   *distlock.Guard
		err error
	}
	locked := make(chan outcome, 1)
	go func() {
		g, err := mm.Lock(ctx)
		locked <- outcome{g, err}
	}()
	eventually(t, settleTimeout, func() (bool, string) {
		line, err := gr.ZRange(ctx, keysOf[shared].Queue, 0, -1).Result()
		if err != nil || len(line) != 1 || lease.Owner(line[0]) != "go-redis" {
			return false, "the line of " + shared + " is " + itoa64(int64(len(line))) + " long, want the MultiMutex alone in it"
		}
		return true, ""
	})
	select {
	case o := <-locked:
		t.Fatalf("MultiMutex.Lock returned while a Mutex held %s: %v", shared, o.err)
	default:
	}

	_, err = single.Release(ctx)
	require.NoError(t, err)
	var o outcome
	select {
	case o = <-locked:
	case <-time.After(settleTimeout):
		t.Fatalf("MultiMutex.Lock did not return within %v of the Mutex's release", settleTimeout)
	}
	require.NoError(t, o.err)
	g := o.g
	assert.Equal(t, distlock.Acquired, g.State())
	assert.Greater(t, g.TokenOf(shared), single.Token(), "the shared name's fencing sequence goes on")
	assert.Equal(t, g.TokenOf(names[0]), g.Token(), "Token is the first name's")
	for _, name := range names {
		assert.Positive(t, g.TokenOf(name), "the token of %s", name)
		v, err := gr.Get(ctx, keysOf[name].Lease).Result()
		require.NoError(t, err, "%s is not held", name)
		assert.Equal(t, "go-redis", lease.Owner(v), "the holder of %s", name)
	}

	_, err = mx.TryLock(ctx)
	require.ErrorAs(t, err, &na, "Mutex.TryLock while the MultiMutex holds %s", shared)
	assert.Equal(t, "go-redis", na.Holder)

	st, err := g.Release(ctx)
	require.NoError(t, err)
	assert.Equal(t, distlock.Released, st)
	for _, name := range names {
		n, err := gr.Exists(ctx, keysOf[name].Lease).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "%s is still held after the release", name)
	}
	after, err := mx.TryLock(ctx)
	require.NoError(t, err, "the Mutex after the MultiMutex's release")
	assert.Greater(t, after.Token(), g.TokenOf(shared))
	_, err = after.Release(ctx)
	require.NoError(t, err)
}
