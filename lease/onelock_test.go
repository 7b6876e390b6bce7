package lease_test

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// Tests of one lock per name (issue 23): a lock's keys (a Mutex's, an
// Election's) and a read-write lock's are one lock, with one line and one
// fencing sequence, against redis-server.

// faces returns the keys of one name for a lock, its readers and its
// writers.
func faces(t *testing.T) (lock, r, w lease.Keys) {
	lock = keys(t)
	return lock, lock.RW(lease.Read), lock.RW(lease.Write)
}

// refusedWhileHeld checks that an acquire of a new value through each of
// ks is refused while holder holds the lock with the token fence, and is
// told of the holder.
func (e *env) refusedWhileHeld(t *testing.T, holder string, fence int64, ks ...lease.Keys) {
	t.Helper()
	for _, k := range ks {
		g := e.acquire(t, k, lease.NewValue("new"), ttl)
		assert.False(t, g.Acquired, "mode %q while %s holds: %+v", k.Mode, holder, g)
		assert.Equal(t, holder, g.Holder, "mode %q", k.Mode)
		assert.Positive(t, g.HolderTTL, "mode %q", k.Mode)
		assert.Equal(t, fence, g.Fence, "mode %q", k.Mode)
	}
}

// TestOneLockExcludes: a lock's hold excludes readers and writers, and
// readers and a writer exclude a lock; the refused call names the holder.
func TestOneLockExcludes(t *testing.T) {
	e := newEnv(t)
	lock, rk, wk := faces(t)
	x := lease.NewValue("x")
	xt := e.mustAcquire(t, lock, x)
	e.refusedWhileHeld(t, x, xt, rk, wk, lock, lock.Election())
	assert.Greater(t, e.pttl(t, lock.Lease), ttl/2)
	require.True(t, e.release(t, lock, x))

	r := lease.NewValue("r")
	rt := e.mustAcquire(t, rk, r)
	assert.Greater(t, rt, xt, "one fencing sequence")
	e.refusedWhileHeld(t, r, rt, lock, lock.Election(), wk)
	require.True(t, e.release(t, rk, r))
	w := lease.NewValue("w")
	wt := e.mustAcquire(t, wk, w)
	assert.Greater(t, wt, rt)
	e.refusedWhileHeld(t, w, wt, lock, lock.Election(), rk)
	require.True(t, e.release(t, wk, w))
	assert.Greater(t, e.mustAcquire(t, lock, lease.NewValue("y")), wt)
}

// TestOneLockLineInArrivalOrder: a lock's waiter stands behind the readers
// that hold, a reader that arrives behind it waits as behind a writer, and
// the grants follow the line: the last reader's release passes to the
// lock's waiter (a string, as the lock's own), whose release passes to the
// run of readers behind it and stops at the writer, whose turn comes with
// the last of them. Every grant's token is above the one before.
func TestOneLockLineInArrivalOrder(t *testing.T) {
	e := newEnv(t)
	lock, rk, wk := faces(t)
	r1 := lease.NewValue("r1")
	t1 := e.mustAcquire(t, rk, r1)
	m := newWaiter("m", "room", liveClaim)
	e.mustQueue(t, lock, m, r1, 0)
	assert.Equal(t, "room", e.entry(t, lock, m.value).room, "a lock's entry carries no mode")
	// A reader behind the lock's waiter, and a TryRLock, wait.
	assert.False(t, e.acquire(t, rk, lease.NewValue("try"), ttl).Acquired, "a TryRLock got ahead of the lock's waiter")
	r2, r3 := newWaiter("r2", "room", liveClaim), newWaiter("r3", "room", liveClaim)
	e.mustQueue(t, rk, r2, r1, 1)
	e.mustQueue(t, rk, r3, r1, 2)
	w := newWaiter("w", "room", liveClaim)
	e.mustQueue(t, wk, w, r1, 3)
	r4 := newWaiter("r4", "room", liveClaim)
	e.mustQueue(t, rk, r4, r1, 4)

	rel := e.releaseAll(t, rk, r1)
	require.True(t, rel.Deleted)
	require.Equal(t, []string{m.value}, passedTo(rel), "the last reader's release")
	assert.Greater(t, rel.Passed.Token, t1)
	assert.Equal(t, m.value, e.holder(t, lock), "the lock's waiter holds a string")
	e.assertTTL(t, lock.Lease, liveClaim)
	cg := e.queue(t, lock, m)
	require.True(t, cg.Acquired, "the lock's waiter claims its grant: %+v", cg)
	assert.Equal(t, rel.Passed.Token, cg.Token)

	rel = e.releaseAll(t, lock, m.value)
	require.True(t, rel.Deleted)
	require.Equal(t, []string{r2.value, r3.value}, passedTo(rel), "the lock's release grants the run of readers")
	assert.Greater(t, rel.Passes()[0].Token, cg.Token)
	assert.Greater(t, rel.Passes()[1].Token, rel.Passes()[0].Token)
	holders, writer := e.rwHolders(t, rk)
	assert.ElementsMatch(t, []string{r2.value, r3.value}, holders)
	assert.Empty(t, writer)
	last := rel.Passes()[1].Token

	assert.Empty(t, passedTo(e.releaseAll(t, rk, r2.value)))
	rel = e.releaseAll(t, rk, r3.value)
	require.Equal(t, []string{w.value}, passedTo(rel))
	assert.Greater(t, rel.Passed.Token, last)
	rel = e.releaseAll(t, wk, w.value)
	require.Equal(t, []string{r4.value}, passedTo(rel))
	assert.True(t, e.release(t, rk, r4.value))
	assert.False(t, e.exists(t, lock.Lease))
	e.assertNoLine(t, lock)
}

// TestOneLockGiveUpUnblocks: a lock's waiter that gives up while readers
// hold lets the readers behind it in, in its Cancel's script; a reader
// that gives up ahead of a lock's waiter while the lock is free passes it
// on.
func TestOneLockGiveUpUnblocks(t *testing.T) {
	e := newEnv(t)
	lock, rk, _ := faces(t)
	r1 := lease.NewValue("r1")
	e.mustAcquire(t, rk, r1)
	m := newWaiter("m", "room", liveClaim)
	e.mustQueue(t, lock, m, r1, 0)
	r2 := newWaiter("r2", "room", liveClaim)
	e.mustQueue(t, rk, r2, r1, 1)
	rel := e.cancel(t, lock, m.value)
	assert.False(t, rel.Deleted)
	assert.Equal(t, []string{r2.value}, passedTo(rel), "the readers behind the lock's waiter")
	holders, _ := e.rwHolders(t, rk)
	assert.ElementsMatch(t, []string{r1, r2.value}, holders)
}

// TestOneLockAskAgainKeepsTheWay: a value that holds and asks again is
// granted in the way it holds, with its token, whichever face asks; the
// lock's renewal renews a reader's hold, and a read-write lock's release a
// lock's string.
func TestOneLockAskAgainKeepsTheWay(t *testing.T) {
	e := newEnv(t)
	lock, rk, _ := faces(t)
	x := lease.NewValue("x")
	xt := e.mustAcquire(t, lock, x)
	assert.Equal(t, xt, e.mustAcquire(t, rk, x), "a lock's holder asking as a reader")
	assert.Equal(t, x, e.holder(t, lock), "still a string")
	assert.True(t, e.renew(t, rk, x, ttl).OK)
	assert.True(t, e.release(t, rk, x), "a read-write lock's release of a string")
	assert.False(t, e.exists(t, lock.Lease))

	r := lease.NewValue("r")
	rt := e.mustAcquire(t, rk, r)
	assert.Equal(t, rt, e.mustAcquire(t, lock, r), "a reader asking as a lock")
	holders, writer := e.rwHolders(t, rk)
	assert.Equal(t, []string{r}, holders, "still a reader")
	assert.Empty(t, writer)
	assert.True(t, e.renew(t, lock, r, ttl).OK, "the lock's renewal of a reader")
	assert.True(t, e.release(t, lock, r), "the lock's release of a reader")
	assert.False(t, e.exists(t, lock.Lease))
}

// TestOneLockElectionAndReaders: an election's release that passes the
// lock to readers announces that nobody leads, not the readers; its
// release that passes to a lock's waiter announces that waiter.
func TestOneLockElectionAndReaders(t *testing.T) {
	e := newEnv(t)
	lock, rk, _ := faces(t)
	el := lock.Election()
	heard := subscribeLeader(t, e.lc, el)
	x := lease.NewValue("x")
	xt := e.mustAcquire(t, el, x)
	assertHeard(t, heard, announcement{x, xt})
	r := newWaiter("r", "room", liveClaim)
	e.mustQueue(t, rk, r, x, 0)
	rel := e.releaseAll(t, el, x)
	require.Equal(t, []string{r.value}, passedTo(rel))
	assertHeard(t, heard, announcement{"", xt}, "the end of the term, not the reader")

	y := newWaiter("y", "room", liveClaim)
	e.mustQueue(t, el, y, r.value, 0)
	rel = e.releaseAll(t, rk, r.value)
	require.Equal(t, []string{y.value}, passedTo(rel))
	yt := e.mustAcquire(t, el, y.value)
	assert.Equal(t, rel.Passed.Token, yt)
	// The reader's release does not announce (a lock's does not either):
	// the next thing heard is the candidate's end of term.
	require.True(t, e.release(t, el, y.value))
	assertHeard(t, heard, announcement{"", yt})
}

// TestReadLineAndHolders: ReadLine names those in line with their
// entries, whichever face stands there, and the fencing key; ReadRW the
// live holders of the hash, the first to end first, and its writer.
func TestReadLineAndHolders(t *testing.T) {
	e := newEnv(t)
	lock, rk, wk := faces(t)
	r1, r2 := lease.NewValue("r1"), lease.NewValue("r2")
	e.mustAcquire(t, rk, r1)
	last := e.mustAcquire(t, rk, r2)
	m, w := newWaiter("m", "room", liveClaim), newWaiter("w", "room", liveClaim)
	// (Either reader may be named: their leases end in the same ms.)
	for i, q := range []struct {
		k  lease.Keys
		wt *waiter
	}{{lock, m}, {wk, w}} {
		g := e.queue(t, q.k, q.wt)
		require.False(t, g.Acquired)
		require.Equal(t, i, g.Rank)
		assert.Contains(t, []string{r1, r2}, g.Holder)
	}

	l, err := e.lc.ReadLine(ctxFor(t), lock, 1)
	require.NoError(t, err)
	assert.Equal(t, 2, l.Waiting)
	assert.Equal(t, []string{m.value}, l.Values, "the first one named")
	require.Len(t, l.Entries, 1)
	assert.Regexp(t, `^\d+ \d+ room$`, l.Entries[0], "a lock's entry has no mode")
	assert.True(t, l.FenceSet)
	assert.Equal(t, strconv.FormatInt(last, 10), l.Fence)
	l, err = e.lc.ReadLine(ctxFor(t), lock, 10)
	require.NoError(t, err)
	require.Len(t, l.Entries, 2)
	assert.Regexp(t, `^\d+ \d+ w room$`, l.Entries[1], "a writer's entry has its mode")

	h, err := e.lc.ReadRW(ctxFor(t), rk)
	require.NoError(t, err)
	assert.True(t, h.Marked)
	assert.Empty(t, h.Writer)
	require.Len(t, h.Holders, 2)
	assert.ElementsMatch(t, []string{r1, r2}, []string{h.Holders[0].Value, h.Holders[1].Value})
	assert.LessOrEqual(t, h.Holders[0].TTL, h.Holders[1].TTL, "the first to end first")
	assert.Positive(t, h.Holders[0].TTL)

	e.srv.MustDo("FLUSHDB")
	l, err = e.lc.ReadLine(ctxFor(t), lock, 10)
	require.NoError(t, err)
	assert.Equal(t, lease.Line{Values: []string{}, Entries: []string{}}, l, "nothing")
}
