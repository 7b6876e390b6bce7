package lease_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// Tests of the read-write lock's scripts (scripts.go) against redis-server.

// rwKeys returns the keys of a read-write lock unique to the test, for
// readers and for writers.
func rwKeys(t *testing.T) (r, w lease.Keys) {
	k := keys(t)
	return k.RW(lease.Read), k.RW(lease.Write)
}

// rwHolders returns the fields of the lock's hash that name holders (not
// the mark, not "~w"), and the writer.
func (e *env) rwHolders(t *testing.T, k lease.Keys) (holders []string, writer string) {
	t.Helper()
	all, err := e.srv.MustDo("HGETALL", k.Lease).AsStrMap()
	require.NoError(t, err)
	for f, v := range all {
		switch f {
		case "~":
			assert.Equal(t, "rw", v, "the mark")
		case "~w":
			writer = v
		default:
			holders = append(holders, f)
		}
	}
	return holders, writer
}

// passedTo returns the values of r's passes, in order.
func passedTo(r lease.Release) []string {
	var vs []string
	for _, p := range r.Passes() {
		vs = append(vs, p.Value)
	}
	return vs
}

func TestRWReadersShareWritersExclude(t *testing.T) {
	e := newEnv(t)
	rk, wk := rwKeys(t)
	r1, r2 := lease.NewValue("r1"), lease.NewValue("r2")
	t1 := e.mustAcquire(t, rk, r1)
	t2 := e.mustAcquire(t, rk, r2)
	assert.Greater(t, t2, t1, "tokens of two readers")
	holders, writer := e.rwHolders(t, rk)
	assert.ElementsMatch(t, []string{r1, r2}, holders)
	assert.Empty(t, writer)
	e.assertTTL(t, rk.Lease, ttl)

	w := lease.NewValue("w")
	g := e.acquire(t, wk, w, ttl)
	assert.False(t, g.Acquired, "a writer while readers hold: %+v", g)
	assert.Contains(t, []string{r1, r2}, g.Holder)
	assert.Equal(t, -1, g.Rank)

	// A writer in line: a reader that arrives queues behind it, and a
	// TryRLock (no place) is refused.
	ww := newWaiter("ww", "room", liveClaim)
	e.mustQueue(t, wk, ww, g.Holder, 0)
	g = e.acquire(t, rk, lease.NewValue("r3"), ttl)
	assert.False(t, g.Acquired, "a reader behind a waiting writer: %+v", g)
	rw := newWaiter("rw", "room", liveClaim)
	qg := e.queue(t, rk, rw)
	assert.False(t, qg.Acquired)
	assert.Equal(t, 1, qg.Rank, "the reader stands behind the writer")
	assert.Equal(t, "r room", e.entry(t, rk, rw.value).room, "the entry carries the mode before the room")

	// The first reader's release passes nothing; the last one's passes to
	// the writer, whose token is above both readers'.
	r := e.releaseAll(t, rk, r1)
	assert.True(t, r.Deleted)
	assert.Empty(t, r.Passes())
	r = e.releaseAll(t, rk, r2)
	assert.True(t, r.Deleted)
	require.Equal(t, []string{ww.value}, passedTo(r), "the last reader's release")
	assert.Greater(t, r.Passed.Token, t2)
	_, writer = e.rwHolders(t, rk)
	assert.Equal(t, ww.value, writer)
	e.assertTTL(t, rk.Lease, liveClaim)

	// The writer claims it (full TTL, same token); its release passes to
	// the reader.
	cg := e.queue(t, wk, ww)
	require.True(t, cg.Acquired, "the writer claims its grant: %+v", cg)
	assert.Equal(t, r.Passed.Token, cg.Token, "a writer keeps its token")
	r = e.releaseAll(t, wk, ww.value)
	assert.True(t, r.Deleted)
	assert.Equal(t, []string{rw.value}, passedTo(r))
	assert.True(t, e.release(t, rk, rw.value))
	assert.False(t, e.exists(t, rk.Lease), "the hash outlived its last holder")
	e.assertNoLine(t, rk)
}

func TestRWWriterReleaseGrantsTheRunOfReaders(t *testing.T) {
	e := newEnv(t)
	rk, wk := rwKeys(t)
	w := lease.NewValue("w")
	e.mustAcquire(t, wk, w)
	a, b := newWaiter("a", "room", liveClaim), newWaiter("b", "room", liveClaim)
	w2 := newWaiter("w2", "room", liveClaim)
	c := newWaiter("c", "room", liveClaim)
	for i, q := range []struct {
		k lease.Keys
		w *waiter
	}{{rk, a}, {rk, b}, {wk, w2}, {rk, c}} {
		e.mustQueue(t, q.k, q.w, w, i)
	}
	heard := subscribe(t, e.lc, rk, "room")

	r := e.releaseAll(t, wk, w)
	assert.True(t, r.Deleted)
	require.Equal(t, []string{a.value, b.value}, passedTo(r), "a writer's release grants the run of readers, up to the next writer")
	assert.Greater(t, r.More[0].Token, r.Passed.Token)
	for _, p := range r.Passes() {
		assertAnnounced(t, heard, "room", announcement{p.Value, p.Token})
	}
	assert.False(t, e.inLine(t, rk, a.value))
	assert.True(t, e.inLine(t, rk, w2.value))
	assert.True(t, e.inLine(t, rk, c.value), "the reader behind the writer still waits")

	// c asks again: w2 is ahead, so it still waits.
	g := e.queue(t, rk, c)
	assert.False(t, g.Acquired, "a reader behind a waiting writer asks again: %+v", g)
	assert.Equal(t, 1, g.Rank)

	assert.Empty(t, passedTo(e.releaseAll(t, rk, a.value)))
	r = e.releaseAll(t, rk, b.value)
	require.Equal(t, []string{w2.value}, passedTo(r))
	r = e.releaseAll(t, wk, w2.value)
	require.Equal(t, []string{c.value}, passedTo(r))
}

// TestRWDeadReaderStopsCounting: a reader whose lease ends stops counting,
// whatever the others do: the writer first in line is told when the first
// lease ends, and is granted once every reader's has.
func TestRWDeadReaderStopsCounting(t *testing.T) {
	e := newEnv(t)
	rk, wk := rwKeys(t)
	dead := lease.NewValue("dead")
	g := e.acquire(t, rk, dead, shortClaim)
	require.True(t, g.Acquired)
	w := newWaiter("w", "room", liveClaim)
	qg := e.queue(t, wk, w)
	require.False(t, qg.Acquired)
	assert.Equal(t, dead, qg.Holder)
	assert.LessOrEqual(t, qg.HolderTTL, shortClaim+time.Millisecond, "the writer is told when the reader's lease ends (rounded up to the ms)")

	e.waitEndedRW(t, rk, dead)
	qg = e.queue(t, wk, w)
	require.True(t, qg.Acquired, "the writer after the dead reader's lease: %+v", qg)
	holders, writer := e.rwHolders(t, rk)
	assert.Equal(t, []string{w.value}, holders, "the dead reader's field was dropped")
	assert.Equal(t, w.value, writer)
	assert.False(t, e.renew(t, rk, dead, ttl).OK, "a renewal never brings back an ended lease")
	assert.False(t, e.release(t, rk, dead), "a release of an ended lease deletes nothing")
}

// waitEndedRW waits until value's lease in k's hash has ended on the
// server's clock.
func (e *env) waitEndedRW(t *testing.T, k lease.Keys, value string) {
	t.Helper()
	field, err := e.srv.MustDo("HGET", k.Lease, value).ToString()
	require.NoError(t, err)
	end, err := strconv.ParseInt(strings.Fields(field)[0], 10, 64)
	require.NoError(t, err, "the field %q", field)
	require.Eventually(t, func() bool { return e.serverTime(t)/1000 >= end }, lapseWait, pollEvery)
}

func TestRWRenew(t *testing.T) {
	e := newEnv(t)
	rk, wk := rwKeys(t)
	r1 := lease.NewValue("r1")
	e.acquire(t, rk, r1, time.Second)
	assert.True(t, e.renew(t, rk, r1, ttl).OK)
	assert.True(t, e.renew(t, wk, r1, ttl).OK, "renew does not depend on the mode of the keys")
	e.assertTTL(t, rk.Lease, ttl)
	assert.True(t, e.release(t, rk, r1))

	w := lease.NewValue("w")
	e.acquire(t, wk, w, time.Second)
	assert.True(t, e.renew(t, wk, w, ttl).OK)
	e.assertTTL(t, wk.Lease, ttl)
	other := e.renew(t, wk, lease.NewValue("x"), ttl)
	assert.False(t, other.OK)
	assert.Equal(t, w, other.Holder, "a refused renewal names the writer")
}

func TestRWDowngrade(t *testing.T) {
	e := newEnv(t)
	rk, wk := rwKeys(t)
	w := lease.NewValue("w")
	tok := e.mustAcquire(t, wk, w)
	a, b := newWaiter("a", "room", liveClaim), newWaiter("b", "room", liveClaim)
	w2 := newWaiter("w2", "room", liveClaim)
	e.mustQueue(t, rk, a, w, 0)
	e.mustQueue(t, rk, b, w, 1)
	e.mustQueue(t, wk, w2, w, 2)

	ok, r, err := e.lc.Downgrade(ctxFor(t), wk, w, ttl)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, []string{a.value, b.value}, passedTo(r), "the readers at the head are granted")
	assert.Greater(t, r.Passed.Token, tok)
	holders, writer := e.rwHolders(t, rk)
	assert.ElementsMatch(t, []string{w, a.value, b.value}, holders)
	assert.Empty(t, writer, "no writer after the downgrade")
	assert.True(t, e.renew(t, rk, w, ttl).OK, "the downgraded hold renews as a reader")

	// Again (a lost reply): it is a reader already.
	ok, r, err = e.lc.Downgrade(ctxFor(t), wk, w, ttl)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Empty(t, r.Passes())
	// Not a holder: refused.
	ok, _, err = e.lc.Downgrade(ctxFor(t), wk, lease.NewValue("x"), ttl)
	require.NoError(t, err)
	assert.False(t, ok)

	// The writer in line is granted once all three readers release.
	for _, v := range []string{w, a.value} {
		assert.Empty(t, passedTo(e.releaseAll(t, rk, v)))
	}
	assert.Equal(t, []string{w2.value}, passedTo(e.releaseAll(t, rk, b.value)))

	_, _, err = e.lc.Downgrade(ctxFor(t), keys(t), w, ttl)
	assert.ErrorIs(t, err, lease.ErrBadMode, "a lock's keys")
}

func TestRWAskAgain(t *testing.T) {
	e := newEnv(t)
	rk, wk := rwKeys(t)
	r1 := lease.NewValue("r1")
	t1 := e.mustAcquire(t, rk, r1)
	assert.Equal(t, t1, e.mustAcquire(t, rk, r1), "a reader that asks again keeps its token")
	assert.True(t, e.release(t, rk, r1))
	w := lease.NewValue("w")
	t3 := e.mustAcquire(t, wk, w)
	assert.Equal(t, t3, e.mustAcquire(t, wk, w), "a writer that asks again keeps its token")
}

// TestRWAndSemaphoreRefuseEachOther: a lock, in every face, and a
// semaphore refuse each other's lease key with a *WrongKindError that
// names what they found, and write nothing; so do all of them a hash that
// distlock did not write.
func TestRWAndSemaphoreRefuseEachOther(t *testing.T) {
	refused := func(t *testing.T, e *env, k lease.Keys, want, found string) {
		t.Helper()
		before := e.state(t, k)
		for _, place := range []*lease.Place{nil, {Claim: liveClaim, Room: "room"}} {
			var err error
			if place == nil {
				_, err = e.lc.Acquire(ctxFor(t), k, lease.NewValue("v"), ttl)
			} else {
				_, err = e.lc.AcquireOrQueue(ctxFor(t), k, lease.NewValue("v"), ttl, *place)
			}
			require.ErrorIs(t, err, lease.ErrWrongKind)
			var wk *lease.WrongKindError
			require.ErrorAs(t, err, &wk)
			assert.Equal(t, [2]string{want, found}, [2]string{wk.Want, wk.Found}, "%v", err)
		}
		assert.Equal(t, before, e.state(t, k), "a refused call wrote something")
	}
	t.Run("a semaphore on a read-write lock", func(t *testing.T) {
		e := newEnv(t)
		rk, wk := rwKeys(t)
		r := lease.NewValue("r")
		e.mustAcquire(t, rk, r)
		sem := keys(t).Semaphore(3)
		refused(t, e, sem, "semaphore", "rwmutex")
		// A writer in line, and the reader's field gone: the mark keeps the
		// hash.
		e.mustQueue(t, wk, newWaiter("w", "room", liveClaim), r, 0)
		e.srv.MustDo("HDEL", rk.Lease, r)
		refused(t, e, sem, "semaphore", "rwmutex")
		e.srv.MustDo("FLUSHDB")
		e.mustAcquire(t, wk, lease.NewValue("w"))
		refused(t, e, sem, "semaphore", "rwmutex")
		e.srv.MustDo("FLUSHDB")
		e.mustAcquire(t, keys(t), lease.NewValue("x"))
		refused(t, e, sem, "semaphore", "lock")
	})
	t.Run("a lock on a semaphore", func(t *testing.T) {
		e := newEnv(t)
		rk, wk := rwKeys(t)
		lock := keys(t)
		e.mustAcquire(t, lock.Semaphore(2), lease.NewValue("x"))
		refused(t, e, rk, "rwmutex", "semaphore")
		refused(t, e, wk, "rwmutex", "semaphore")
		refused(t, e, lock, "lock", "semaphore")
		refused(t, e, lock.Election(), "lock", "semaphore")
	})
	t.Run("a hash distlock did not write", func(t *testing.T) {
		e := newEnv(t)
		rk, wk := rwKeys(t)
		lock := keys(t)
		e.srv.MustDo("HSET", lock.Lease, "f", "v")
		refused(t, e, rk, "rwmutex", "hash")
		refused(t, e, wk, "rwmutex", "hash")
		refused(t, e, lock, "lock", "hash")
	})
}
