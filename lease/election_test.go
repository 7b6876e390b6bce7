package lease_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// Tests of the announcements that the lock's scripts make on Keys.Leader
// for an election (Keys.Election), against redis-server.
//
// Announcements on one channel arrive in the order they were published, so
// a test shows that a step published nothing by making a step that does
// publish (a marker) and checking that it is the next thing heard.

// subscribeLeader listens to k's leader channel until the test ends, and
// returns the changes heard: the new holder's value and token, or an empty
// value and the token of a holder that left without a successor. It
// returns once the subscription is confirmed.
func subscribeLeader(t *testing.T, lc *lease.Client, k lease.Keys) <-chan announcement {
	t.Helper()
	return listen(t, "SubscribeLeader("+k.Leader+")", func(ctx context.Context, ready func(), heard func(string, int64)) error {
		return lc.SubscribeLeader(ctx, k, ready, heard)
	})
}

// assertHeard checks that the next change heard on the leader channel is
// want.
func assertHeard(t *testing.T, heard <-chan announcement, want announcement, msgAndArgs ...any) {
	t.Helper()
	assertAnnounced(t, heard, "leader", want, msgAndArgs...)
}

// TestElectionAnnouncesGrants: every grant of an election is announced
// with the holder's value and token, but not a grant again to the holder;
// a release with nobody in line announces the end of the released term,
// with its token; a refused acquire, a release by a non-holder and a
// lease that runs out announce nothing.
func TestElectionAnnouncesGrants(t *testing.T) {
	e := newEnv(t)
	k := keys(t).Election()
	heard := subscribeLeader(t, e.lc, k)

	x := lease.NewValue("x")
	xt := e.mustAcquire(t, k, x)
	assertHeard(t, heard, announcement{x, xt}, "grant")
	// A grant again to the holder keeps its token: the same term, nothing
	// to announce (the release below is the next thing heard).
	xt2 := e.mustAcquire(t, k, x)
	require.Equal(t, xt, xt2, "a grant again to the holder keeps its token")

	y := lease.NewValue("y")
	require.False(t, e.acquire(t, k, y, queueTTL).Acquired)
	assert.False(t, e.release(t, k, y), "release by a non-holder")
	require.True(t, e.release(t, k, x))
	assertHeard(t, heard, announcement{"", xt2}, "release with nobody in line: want the end of x's term")
	assert.False(t, e.release(t, k, x), "second release")

	// A term that runs out is not announced.
	require.True(t, e.acquire(t, k, y, endTTL).Acquired)
	yt := e.fence(t, k)
	assertHeard(t, heard, announcement{y, yt}, "grant")
	e.waitGone(t, k.Lease)
	z := lease.NewValue("z")
	zt := e.mustAcquire(t, k, z)
	assertHeard(t, heard, announcement{z, zt}, "the grant after y's lease ran out: want nothing before it")

	// Cancel of the holder ends its term as Release does.
	r := e.cancel(t, k, z)
	require.True(t, r.Deleted)
	assertHeard(t, heard, announcement{"", zt}, "Cancel of the holder")
	assert.Empty(t, heard)
}

// TestElectionAnnouncesPasses: a lease passed to a waiter, by a release, a
// Cancel or an Acquire that finds the lease free, is announced with the
// waiter's value and the pass's token; the waiter's claim keeps that token
// and is not announced; the end of a term after passes carries the last token.
func TestElectionAnnouncesPasses(t *testing.T) {
	e := newEnv(t)
	k := keys(t).Election()
	heard := subscribeLeader(t, e.lc, k)
	x := lease.NewValue("x")
	xt := e.mustAcquire(t, k, x)
	assertHeard(t, heard, announcement{x, xt})
	a := newWaiter("a", "room", liveClaim)
	b := newWaiter("b", "room", liveClaim)
	e.mustQueue(t, k, a, x, 0)
	e.mustQueue(t, k, b, x, 1)

	p := e.mustRelease(t, k, x)
	require.Equal(t, a.value, p.Value)
	assertHeard(t, heard, announcement{a.value, p.Token}, "release with a in line")
	g := e.queue(t, k, a)
	require.True(t, g.Acquired, "a's claim: %+v", g)
	require.Equal(t, p.Token, g.Token, "a's claim keeps the pass's token, and is not announced")

	r := e.cancel(t, k, a.value)
	require.Equal(t, b.value, r.Passed.Value, "Cancel of the holder with b in line")
	assertHeard(t, heard, announcement{b.value, r.Passed.Token}, "Cancel of the holder with b in line")

	// b's lease runs out (deleted here), silently; the next call, an
	// Acquire that does not stand in line, passes the lease to c, first
	// in line, and that is announced.
	c := newWaiter("c", "room", liveClaim)
	e.mustQueue(t, k, c, b.value, 0)
	e.srv.MustDo("DEL", k.Lease)
	g = e.acquire(t, k, lease.NewValue("d"), queueTTL)
	require.False(t, g.Acquired)
	require.Equal(t, c.value, g.Holder)
	assertHeard(t, heard, announcement{c.value, g.Fence}, "Acquire of a free lease with c in line")

	// The same for a release by a holder whose lease ran out.
	f := newWaiter("f", "room", liveClaim)
	e.mustQueue(t, k, f, c.value, 0)
	e.srv.MustDo("DEL", k.Lease)
	rel := e.releaseAll(t, k, c.value)
	require.False(t, rel.Deleted)
	require.Equal(t, f.value, rel.Passed.Value)
	assertHeard(t, heard, announcement{f.value, rel.Passed.Token}, "release of a free lease with f in line")

	require.True(t, e.release(t, k, f.value))
	assertHeard(t, heard, announcement{"", rel.Passed.Token}, "f's release: want the end of f's term")
	assert.Empty(t, heard)
}

// TestElectionOnlyElectionsAnnounce: a plain lock's scripts and a
// semaphore's publish nothing on the leader channel, whatever they do; and
// a semaphore cannot be asked to announce.
func TestElectionOnlyElectionsAnnounce(t *testing.T) {
	e := newEnv(t)
	lock := keys(t)
	heard := subscribeLeader(t, e.lc, lock)

	x := lease.NewValue("x")
	e.mustAcquire(t, lock, x)
	e.mustAcquire(t, lock, x)
	a := newWaiter("a", "room", liveClaim)
	b := newWaiter("b", "room", liveClaim)
	e.mustQueue(t, lock, a, x, 0)
	e.mustQueue(t, lock, b, x, 1)
	require.Equal(t, a.value, e.mustRelease(t, lock, x).Value)
	require.True(t, e.queue(t, lock, a).Acquired)
	r := e.cancel(t, lock, a.value)
	require.Equal(t, b.value, r.Passed.Value)
	c := newWaiter("c", "room", liveClaim)
	e.mustQueue(t, lock, c, b.value, 0)
	e.srv.MustDo("DEL", lock.Lease)
	require.False(t, e.acquire(t, lock, lease.NewValue("d"), queueTTL).Acquired)
	require.Equal(t, lease.Pass{}, e.mustRelease(t, lock, c.value))

	sem := lock.Semaphore(1)
	y := lease.NewValue("y")
	e.mustAcquire(t, sem, y)
	w := newWaiter("w", "room", liveClaim)
	e.mustQueue(t, sem, w, y, 0)
	require.Equal(t, w.value, e.mustRelease(t, sem, y).Value)
	require.True(t, e.queue(t, sem, w).Acquired)
	require.Equal(t, lease.Pass{}, e.mustRelease(t, sem, w.value))

	_, err := e.lc.Acquire(ctxFor(t), sem.Election(), y, queueTTL)
	assert.ErrorIs(t, err, lease.ErrBadPermits, "Acquire of an announcing semaphore")
	_, err = e.lc.Release(ctxFor(t), sem.Election(), y)
	assert.ErrorIs(t, err, lease.ErrBadPermits, "Release of an announcing semaphore")

	// The marker: the first thing heard.
	z := lease.NewValue("z")
	zt := e.mustAcquire(t, lock.Election(), z)
	assertHeard(t, heard, announcement{z, zt}, "want the election's grant first: a lock or semaphore announced")
	assert.Empty(t, heard)
}

// TestElectionAnnouncesTokenAfterFenceAhead: when the fencing key is ahead
// of the server's clock, a grant's token is the last one plus one, and the
// announcement carries that token, not the clock.
func TestElectionAnnouncesTokenAfterFenceAhead(t *testing.T) {
	e := newEnv(t)
	k := keys(t).Election()
	const ahead = int64(7_258_118_400_000_000) // year 2200, below 2^53
	e.srv.MustDo("SET", k.Fence, strconv.FormatInt(ahead, 10))
	heard := subscribeLeader(t, e.lc, k)

	x := lease.NewValue("x")
	xt := e.mustAcquire(t, k, x)
	require.Equal(t, ahead+1, xt, "token after the fence was set to %d", ahead)
	assertHeard(t, heard, announcement{x, xt}, "grant")
	assert.Equal(t, xt, e.fence(t, k))
}
