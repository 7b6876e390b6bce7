package lease_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// Tests of a rolling upgrade to one lock per name (issue 23): the scripts
// of the version before it (copies in testdata/v0, as the binaries of that
// version send them) write keys, and the scripts of this version read them
// correctly, so that an old and a new binary never both hold one name.

// old runs the script name ("acquire", "release", "renew", "rw_acquire",
// "rw_release", "rw_renew") of the version before issue 23 with keys and
// args, as a binary of that version would.
func (e *env) old(t *testing.T, name string, keys []string, args ...string) (rueidis.RedisMessage, error) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", "v0", name+".lua"))
	require.NoError(t, err)
	cmd := append([]string{"EVAL", string(src), strconv.Itoa(len(keys))}, keys...)
	return e.srv.Do(ctxFor(t), append(cmd, args...)...)
}

// oldAcquire runs the old acquire script of k's face (a lock's, or a
// read-write lock's in k's mode) for value, not standing in line, and
// returns the token when it was granted.
func (e *env) oldAcquire(t *testing.T, k lease.Keys, value string) (token int64, granted bool) {
	t.Helper()
	script, args := "acquire", []string{ms(ttl), ""}
	if k.Mode != 0 {
		script, args[1] = "rw_acquire", string(k.Mode)
	}
	res, err := e.old(t, script, []string{k.Lease, k.Fence, k.Queue, k.Waiters, k.Wake, k.Void(value)}, args...)
	require.NoError(t, err, "old %s", script)
	n, err := res.AsInt64()
	return n, err == nil
}

// mustOldAcquire is oldAcquire for a value that must be granted; it
// returns the token.
func (e *env) mustOldAcquire(t *testing.T, k lease.Keys, value string) int64 {
	t.Helper()
	token, ok := e.oldAcquire(t, k, value)
	require.True(t, ok, "the old acquire of %q", value)
	return token
}

// oldRelease runs the old release script of k's face for value and
// returns the values it passed the lock to.
func (e *env) oldRelease(t *testing.T, k lease.Keys, value string) []string {
	t.Helper()
	script := "release"
	if k.Mode != 0 {
		script = "rw_release"
	}
	res, err := e.old(t, script, []string{k.Lease, k.Fence, k.Queue, k.Waiters, k.Wake}, value)
	require.NoError(t, err, "old %s", script)
	var passed []string
	if arr, err := res.ToArray(); err == nil {
		for i := 2; i < len(arr); i += 3 {
			v, _ := arr[i].ToString()
			passed = append(passed, v)
		}
	}
	return passed
}

// ms formats d in ms, as the scripts take it.
func ms(d interface{ Milliseconds() int64 }) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// TestUpgradeOldWriter: an old read-write lock's writer (the hash with
// "~w") excludes every new face; its old renewal and release work beside
// new waiters, its release passes to a new reader, and a new writer that
// an old release granted (in the old format) renews, and is released by
// the new scripts, passing to a lock's waiter.
func TestUpgradeOldWriter(t *testing.T) {
	e := newEnv(t)
	lock, rk, wk := faces(t)
	w := lease.NewValue("old-w")
	wt := e.mustOldAcquire(t, wk, w)
	e.refusedWhileHeld(t, w, wt, lock, lock.Election(), rk, wk)
	r := newWaiter("r", "room", liveClaim)
	e.mustQueue(t, rk, r, w, 0)
	w2 := newWaiter("w2", "room", liveClaim)
	e.mustQueue(t, wk, w2, w, 1)
	res, err := e.old(t, "rw_renew", []string{wk.Lease}, w, ms(ttl))
	require.NoError(t, err)
	assert.Equal(t, int64(1), must(res.AsInt64()), "the old writer's old renewal")

	assert.Equal(t, []string{r.value}, e.oldRelease(t, wk, w), "the old release passes to the new reader")
	assert.Equal(t, []string{w2.value}, passedTo(e.releaseAll(t, rk, r.value)))
	_, writer := e.rwHolders(t, wk)
	require.Equal(t, w2.value, writer, "the new writer holds in the hash")

	m := newWaiter("m", "room", liveClaim)
	e.mustQueue(t, lock, m, w2.value, 0)
	assert.True(t, e.renew(t, wk, w2.value, ttl).OK, "the new renewal of a writer in the old format")
	assert.Equal(t, []string{m.value}, passedTo(e.releaseAll(t, wk, w2.value)))
	assert.Equal(t, m.value, e.holder(t, lock))
}

// TestUpgradeOldReaders: old readers exclude a new lock and writer, and
// their new release passes to the lock's waiter; an old release that
// finds a lock's entry in line (which it cannot read) stops without
// passing, and the waiter takes the free lock when it asks again.
func TestUpgradeOldReaders(t *testing.T) {
	e := newEnv(t)
	lock, rk, _ := faces(t)
	r1, r2 := lease.NewValue("old-r1"), lease.NewValue("old-r2")
	e.mustOldAcquire(t, rk, r1)
	e.mustOldAcquire(t, rk, r2)
	m := newWaiter("m", "room", liveClaim)
	g := e.queue(t, lock, m)
	require.False(t, g.Acquired, "a lock while old readers hold: %+v", g)
	assert.Contains(t, []string{r1, r2}, g.Holder)
	assert.Empty(t, e.oldRelease(t, rk, r1), "the old release of one reader")
	assert.False(t, e.queue(t, lock, m).Acquired, "a lock while an old reader holds")
	assert.Equal(t, []string{m.value}, passedTo(e.releaseAll(t, rk, r2)), "the new release of the last old reader")
	require.True(t, e.release(t, lock, m.value))

	e.mustOldAcquire(t, rk, r1)
	e.mustQueue(t, lock, m, r1, 0)
	assert.Empty(t, e.oldRelease(t, rk, r1), "an old release cannot read a lock's entry")
	assert.True(t, e.queue(t, lock, m).Acquired, "the lock's waiter asks again")
}

// TestUpgradeOldLock: an old lock's string excludes every new face; its
// old release passes to a lock's new waiter as before; when it finds a
// read-write lock's entry (which it reads as one without a mode, in a room
// nobody listens to), the value it writes is taken by the new scripts as
// that waiter's exclusive hold: granted when it asks again, renewed,
// downgraded and released.
func TestUpgradeOldLock(t *testing.T) {
	e := newEnv(t)
	lock, rk, wk := faces(t)
	x := lease.NewValue("old-x")
	xt := e.mustOldAcquire(t, lock, x)
	e.refusedWhileHeld(t, x, xt, rk, wk, lock)
	m := newWaiter("m", "room", liveClaim)
	e.mustQueue(t, lock, m, x, 0)
	assert.Equal(t, []string{m.value}, e.oldRelease(t, lock, x), "the old release passes to the new lock's waiter")
	assert.True(t, e.queue(t, lock, m).Acquired)

	w := newWaiter("w", "room", liveClaim)
	e.mustQueue(t, wk, w, m.value, 0)
	r := newWaiter("r", "room", liveClaim)
	e.mustQueue(t, rk, r, m.value, 1)
	_, ok := e.oldAcquire(t, lock, lease.NewValue("old-y"))
	assert.False(t, ok, "an old lock's acquire while a new lock holds")
	require.True(t, e.release(t, lock, m.value))
	// m's release passed to w; an old binary's lock acquire cannot get in.
	_, writer := e.rwHolders(t, wk)
	require.Equal(t, w.value, writer)
	res, err := e.old(t, "acquire", []string{lock.Lease, lock.Fence, lock.Queue, lock.Waiters, lock.Wake, lock.Void("old-z")}, ms(ttl))
	assert.Error(t, err, "an old lock's acquire on the hash: %v", res)
	require.True(t, e.release(t, wk, w.value))
	require.True(t, e.release(t, rk, r.value))

	// An old release that reads a read-write lock's entry as a lock's.
	x2 := lease.NewValue("old-x2")
	e.mustOldAcquire(t, lock, x2)
	w3 := newWaiter("w3", "room", liveClaim)
	e.mustQueue(t, wk, w3, x2, 0)
	assert.Equal(t, []string{w3.value}, e.oldRelease(t, lock, x2))
	assert.Equal(t, w3.value, e.holder(t, lock), "the old release wrote a string")
	assert.False(t, e.acquire(t, rk, lease.NewValue("new"), ttl).Acquired, "a reader while the string holds")
	g := e.queue(t, wk, w3)
	require.True(t, g.Acquired, "the writer asks again: %+v", g)
	assert.Equal(t, e.fence(t, wk), g.Token)
	assert.True(t, e.renew(t, wk, w3.value, ttl).OK)
	ok, _, err = e.lc.Downgrade(ctxFor(t), wk, w3.value, ttl)
	require.NoError(t, err)
	assert.True(t, ok, "a downgrade of the string")
	holders, writer := e.rwHolders(t, rk)
	assert.Equal(t, []string{w3.value}, holders)
	assert.Empty(t, writer)
	assert.Equal(t, g.Token, e.mustAcquire(t, rk, w3.value), "the reader keeps the writer's token")
	require.True(t, e.release(t, rk, w3.value))
	assert.False(t, e.exists(t, lock.Lease))
}

// TestUpgradeOldScriptsRefuseWhatTheyCannotRead: where an old binary's
// scripts cannot read what a new binary wrote, they refuse with an error
// and write no hold: an old read-write lock on a new lock's string or on
// a line with a lock's entry, an old lock on new readers' hash.
func TestUpgradeOldScriptsRefuseWhatTheyCannotRead(t *testing.T) {
	e := newEnv(t)
	lock, rk, wk := faces(t)
	x := lease.NewValue("x")
	e.mustAcquire(t, lock, x)
	for _, k := range []lease.Keys{rk, wk} {
		v := lease.NewValue("old")
		_, err := e.old(t, "rw_acquire", []string{k.Lease, k.Fence, k.Queue, k.Waiters, k.Wake, k.Void(v)}, ms(ttl), string(k.Mode))
		assert.Error(t, err, "an old %s on a new lock", k.Mode)
	}
	assert.Equal(t, x, e.holder(t, lock))
	require.True(t, e.release(t, lock, x))

	r := lease.NewValue("r")
	e.mustAcquire(t, rk, r)
	v := lease.NewValue("old")
	_, err := e.old(t, "acquire", []string{lock.Lease, lock.Fence, lock.Queue, lock.Waiters, lock.Wake, lock.Void(v)}, ms(ttl))
	assert.Error(t, err, "an old lock on new readers")
	m := newWaiter("m", "room", liveClaim)
	e.mustQueue(t, lock, m, r, 0)
	require.True(t, e.release(t, rk, r))
	assert.Equal(t, m.value, e.holder(t, lock))
	require.True(t, e.release(t, lock, m.value))
	// The lock is free, with a lock's waiter in line.
	e.mustAcquire(t, lock, x)
	m2 := newWaiter("m2", "room", liveClaim)
	e.mustQueue(t, lock, m2, x, 0)
	e.srv.MustDo("DEL", lock.Lease)
	v = lease.NewValue("old-r")
	_, err = e.old(t, "rw_acquire", []string{rk.Lease, rk.Fence, rk.Queue, rk.Waiters, rk.Wake, rk.Void(v)}, ms(ttl), "r")
	assert.Error(t, err, "an old reader on a line with a lock's entry")
	assert.False(t, e.exists(t, lock.Lease), "the old reader wrote a hold")
}

// must returns v, for a call whose error the test has no use for.
func must[T any](v T, _ error) T { return v }
