package lease_test

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// Tests of the semaphore's scripts (semAcquireScript, semReleaseScript,
// semRenewScript) and of readScript against redis-server.
//
// Timing: holders that must hold for the whole test get queueTTL or more.
// A holder whose lease is meant to end gets endTTL and the test waits for
// the end on the server's own clock (waitEnded), with a holder of a longer
// lease beside it so that the set outlives it: the scripts, not Redis's
// expiry, must then leave it out. Waiters use the constants of
// queue_test.go.
const endTTL = 300 * time.Millisecond // lease of a holder whose lease is meant to end

// semKeys returns keys unique to the test for a semaphore of permits.
func semKeys(t *testing.T, permits int) lease.Keys {
	t.Helper()
	return keys(t).Semaphore(permits)
}

// score returns the end of value's lease in the holders set (server time in
// ms), and whether value is in the set at all (ended or not).
func (e *env) score(t *testing.T, k lease.Keys, value string) (int64, bool) {
	t.Helper()
	msg := e.srv.MustDo("ZSCORE", k.Lease, value)
	if msg.IsNil() {
		return 0, false
	}
	s, err := msg.ToString()
	require.NoError(t, err, "ZSCORE %s %q", k.Lease, value)
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err, "ZSCORE %s %q: %q", k.Lease, value, s)
	return n, true
}

// members returns every value in the holders set, ended or not, in the
// order their leases end.
func (e *env) members(t *testing.T, k lease.Keys) []string {
	t.Helper()
	vs, err := e.srv.MustDo("ZRANGE", k.Lease, "0", "-1").AsStrSlice()
	require.NoError(t, err, "ZRANGE %s", k.Lease)
	return vs
}

// assertHolds checks that value holds a permit whose lease ends within want
// from now, and not much sooner. The score is rounded up to the next whole
// millisecond, so read within the millisecond of the grant it is want plus
// that millisecond.
func (e *env) assertHolds(t *testing.T, k lease.Keys, value string, want time.Duration) {
	t.Helper()
	end, ok := e.score(t, k, value)
	if !assert.True(t, ok, "%q holds no permit", value) {
		return
	}
	left := time.Duration(end-e.serverTime(t)/1000) * time.Millisecond
	assert.LessOrEqual(t, left, want+time.Millisecond, "lease of %q: %v left, want at most %v", value, left, want)
	assert.Greater(t, left, want-ttlMargin, "lease of %q: %v left, want about %v", value, left, want)
}

// waitEnded waits until value's lease has ended on the server's clock.
func (e *env) waitEnded(t *testing.T, k lease.Keys, value string) {
	t.Helper()
	end, ok := e.score(t, k, value)
	require.True(t, ok, "%q holds no permit", value)
	require.Eventually(t, func() bool { return e.serverTime(t)/1000 >= end }, lapseWait, pollEvery,
		"the server clock did not reach the end of %q's lease", value)
}

// endedWithLine fills k, a semaphore of 2 permits, with x, whose lease
// is meant to end (endTTL), and y, which keeps its permit; then ws stand in
// line behind x. It returns x and y once x's lease has ended on the
// server's clock, x still being in the holders set.
func (e *env) endedWithLine(t *testing.T, k lease.Keys, ws ...*waiter) (x, y string) {
	t.Helper()
	x, y = lease.NewValue("x"), lease.NewValue("y")
	require.True(t, e.acquire(t, k, x, endTTL).Acquired, "Acquire(%q)", x)
	e.mustAcquire(t, k, y)
	e.lineUp(t, k, x, ws...)
	e.waitEnded(t, k, x)
	return x, y
}

// limit returns the limit that the last grant recorded, or "" if none.
func (e *env) limit(t *testing.T, k lease.Keys) string {
	t.Helper()
	v, _ := e.get(t, k.Limit)
	return v
}

// state returns every key of the name of k with its serialized value and
// absolute expiry, to tell whether a call wrote anything. A server without
// PEXPIRETIME (Redis 6.2) cannot tell a key's expiry exactly, and a call
// that only moved an expiry would go unseen: state skips the test there.
func (e *env) state(t *testing.T, k lease.Keys) map[string]string {
	t.Helper()
	e.srv.SkipUnless(t, redistest.ExpireTime)
	names, err := e.srv.MustDo("KEYS", k.Lease+"*").AsStrSlice()
	require.NoError(t, err)
	out := make(map[string]string, len(names))
	for _, key := range names {
		dump, err := e.srv.MustDo("DUMP", key).ToString()
		require.NoError(t, err, "DUMP %s", key)
		at := e.intReply(t, "PEXPIRETIME", key)
		out[key] = fmt.Sprintf("%q expires at %d", dump, at)
	}
	return out
}

// TestSemaphoreGrantsUpToPermits: up to permits values are granted, each
// with a larger token than the one before, recorded in the fencing key; the
// next is refused without standing in line and without writing anything,
// and is told of the holder whose lease ends first. A holder that asks
// again is granted again, with a new token and the full TTL.
func TestSemaphoreGrantsUpToPermits(t *testing.T) {
	e := newEnv(t)
	k := semKeys(t, 3)
	var values []string
	var last int64
	for i := range 3 {
		v := lease.NewValue(fmt.Sprint("h", i))
		hold := queueTTL + time.Duration(i)*time.Second // the first one's lease ends first
		g := e.acquire(t, k, v, hold)
		require.True(t, g.Acquired, "Acquire %d of 3: got %+v", i, g)
		assert.Greater(t, g.Token, last, "token of grant %d", i)
		assert.Equal(t, g.Token, e.fence(t, k), "fencing key after grant %d", i)
		e.assertHolds(t, k, v, hold)
		last = g.Token
		values = append(values, v)
	}
	e.assertTTL(t, k.Lease, queueTTL+2*time.Second) // the longest lease
	assert.Equal(t, "3", e.limit(t, k))

	before := e.state(t, k)
	c := lease.NewValue("c")
	g := e.acquire(t, k, c, queueTTL)
	require.False(t, g.Acquired, "a fourth Acquire of 3 permits: got %+v", g)
	assert.Equal(t, values[0], g.Holder, "holder in the reply: want the one whose lease ends first")
	assert.LessOrEqual(t, g.HolderTTL, queueTTL)
	assert.Greater(t, g.HolderTTL, queueTTL-ttlMargin)
	assert.Equal(t, -1, g.Rank)
	assert.Zero(t, g.Ticket)
	assert.Equal(t, last, g.Fence)
	assert.Equal(t, before, e.state(t, k), "a refused Acquire wrote something")

	// Again by a holder: granted, with a new token and its lease refreshed.
	e.srv.MustDo("ZADD", k.Lease, "XX", strconv.FormatInt(e.serverTime(t)/1000+shortPTTL, 10), values[1])
	g = e.acquire(t, k, values[1], queueTTL)
	require.True(t, g.Acquired, "Acquire by a holder: got %+v", g)
	assert.Greater(t, g.Token, last)
	e.assertHolds(t, k, values[1], queueTTL)
	assert.ElementsMatch(t, values, e.members(t, k))
}

// TestSemaphoreConcurrentAcquire: of many concurrent calls, exactly permits
// are granted, with distinct tokens.
func TestSemaphoreConcurrentAcquire(t *testing.T) {
	e := newEnv(t)
	const permits, callers = 3, 16
	k := semKeys(t, permits)
	grants := make([]lease.Grant, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			grants[i], errs[i] = e.lc.Acquire(ctxFor(t), k, lease.NewValue(fmt.Sprint("c", i)), queueTTL)
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	tokens := make(map[int64]bool)
	for _, g := range grants {
		if g.Acquired {
			assert.False(t, tokens[g.Token], "token %d granted twice", g.Token)
			tokens[g.Token] = true
		}
	}
	assert.Len(t, tokens, permits, "grants")
	assert.Len(t, e.members(t, k), permits, "holders")
}

// TestSemaphoreEndedHolder: a holder whose lease has ended no longer counts,
// with no call made in between: the next Acquire takes its permit and
// drops it from the set. With someone in line, the permit goes to the first
// waiter instead, whoever makes the call.
func TestSemaphoreEndedHolder(t *testing.T) {
	t.Run("nobody in line", func(t *testing.T) {
		e := newEnv(t)
		k := semKeys(t, 2)
		x, y := e.endedWithLine(t, k)
		yt := e.fence(t, k) // y's grant issued the last token
		require.Contains(t, e.members(t, k), x, "x's ended permit is dropped by the next call, not before")

		c := lease.NewValue("c")
		g := e.acquire(t, k, c, queueTTL)
		require.True(t, g.Acquired, "Acquire after x's lease ended: got %+v", g)
		assert.Greater(t, g.Token, yt)
		assert.ElementsMatch(t, []string{y, c}, e.members(t, k), "holders: want x dropped")
		e.assertNoLine(t, k)
	})
	t.Run("first waiter calls", func(t *testing.T) {
		e := newEnv(t)
		k := semKeys(t, 2)
		a := newWaiter("a", "room", liveClaim)
		b := newWaiter("b", "room", liveClaim)
		_, y := e.endedWithLine(t, k, a, b)

		g := e.queue(t, k, a)
		require.True(t, g.Acquired, "the first waiter after x's lease ended: got %+v", g)
		e.assertHolds(t, k, a.value, queueTTL)
		assert.ElementsMatch(t, []string{y, a.value}, e.members(t, k))
		assert.False(t, e.inLine(t, k, a.value), "a still stands in line")
		e.mustQueue(t, k, b, y, 0)
	})
	t.Run("ended holder releases", func(t *testing.T) {
		// Its release deletes nothing of its own, but drops it, and
		// passes its permit on.
		e := newEnv(t)
		k := semKeys(t, 2)
		a := newWaiter("a", "room", liveClaim)
		x, y := e.endedWithLine(t, k, a)

		r := e.releaseAll(t, k, x)
		assert.False(t, r.Deleted, "release by a holder whose lease ended: %+v", r)
		assert.Equal(t, a.value, r.Passed.Value, "release by a holder whose lease ended: passed to")
		assert.ElementsMatch(t, []string{y, a.value}, e.members(t, k))
	})
	t.Run("second waiter calls", func(t *testing.T) {
		e := newEnv(t)
		k := semKeys(t, 2)
		a := newWaiter("a", "ra", liveClaim)
		b := newWaiter("b", "rb", liveClaim)
		heard := subscribe(t, e.lc, k, "ra")
		_, y := e.endedWithLine(t, k, a, b)

		g := e.queue(t, k, b)
		require.False(t, g.Acquired, "the second waiter took the permit from the first: %+v", g)
		assert.Equal(t, 0, g.Rank, "b's rank once a was served")
		e.assertHolds(t, k, a.value, liveClaim)
		assert.ElementsMatch(t, []string{y, a.value}, e.members(t, k))
		assert.Equal(t, g.Fence, e.fence(t, k))
		assert.Equal(t, announcement{a.value, g.Fence}, nextAnnouncement(t, heard, "ra"))
	})
}

// TestSemaphoreRenew: Renew extends a holder's lease, counted from the
// call, and the set's TTL with it; it refuses a value whose lease ended or
// that holds nothing, and never adds one.
func TestSemaphoreRenew(t *testing.T) {
	e := newEnv(t)
	k := semKeys(t, 3)
	x, y := lease.NewValue("x"), lease.NewValue("y")
	require.True(t, e.acquire(t, k, x, endTTL).Acquired)
	require.True(t, e.acquire(t, k, y, 2*time.Second).Acquired)

	r := e.renew(t, k, y, queueTTL)
	assert.Equal(t, lease.Renewal{OK: true}, r, "Renew of a holder")
	e.assertHolds(t, k, y, queueTTL)
	e.assertTTL(t, k.Lease, queueTTL)
	// A shorter renewal shortens the holder's lease, not the set's TTL.
	r = e.renew(t, k, y, ttl)
	assert.Equal(t, lease.Renewal{OK: true}, r, "shorter Renew of a holder")
	e.assertHolds(t, k, y, ttl)
	e.assertTTL(t, k.Lease, queueTTL)

	e.waitEnded(t, k, x)
	before := e.state(t, k)
	r = e.renew(t, k, x, queueTTL)
	assert.False(t, r.OK, "Renew of a holder whose lease ended: got %+v", r)
	assert.Equal(t, before, e.state(t, k), "a refused Renew wrote something")

	z := lease.NewValue("z")
	r = e.renew(t, k, z, queueTTL)
	assert.False(t, r.OK, "Renew of a value that holds nothing: got %+v", r)
	_, ok := e.score(t, k, z)
	assert.False(t, ok, "Renew added a holder")

	k2 := semKeys(t, 3)
	k2.Lease += "-none"
	r = e.renew(t, k2, z, queueTTL)
	assert.False(t, r.OK, "Renew of a missing semaphore: got %+v", r)
	assert.False(t, e.exists(t, k2.Lease), "Renew created the semaphore")
}

// TestSemaphoreReleasePassesFIFO: each release passes the freed permit to
// the first waiter in line, for its claim window, with a new token, and
// announces it on the waiter's room; the waiter leaves the line. A release
// with nobody in line passes nothing and issues no token.
func TestSemaphoreReleasePassesFIFO(t *testing.T) {
	e := newEnv(t)
	k := semKeys(t, 2)
	x, y := lease.NewValue("x"), lease.NewValue("y")
	e.mustAcquire(t, k, x)
	e.mustAcquire(t, k, y)
	waiters := []*waiter{
		newWaiter("a", "r1", liveClaim),
		newWaiter("b", "r2", liveClaim),
		newWaiter("c", "r1", liveClaim),
	}
	heard := map[string]<-chan announcement{
		"r1": subscribe(t, e.lc, k, "r1"),
		"r2": subscribe(t, e.lc, k, "r2"),
	}
	for i, w := range waiters {
		e.mustQueue(t, k, w, x, i)
	}
	last := e.fence(t, k)
	releasers := []string{x, y, waiters[0].value}
	for i, w := range waiters {
		r, err := e.lc.Release(ctxFor(t), k, releasers[i])
		require.NoError(t, err, "release %d", i)
		assert.True(t, r.Deleted, "release %d: want the permit deleted", i)
		assert.Empty(t, r.More, "release %d of one permit passed more than one", i)
		p := r.Passed
		require.Equal(t, w.value, p.Value, "release %d passed to the wrong waiter", i)
		assert.Equal(t, w.place.Room, p.Room, "release %d: room", i)
		assert.Greater(t, p.Token, last, "release %d: token", i)
		assert.Equal(t, p.Token, e.fence(t, k), "release %d: fencing key", i)
		e.assertHolds(t, k, w.value, liveClaim)
		assert.False(t, e.inLine(t, k, w.value), "release %d: the new holder still stands in line", i)
		_, ok := e.score(t, k, releasers[i])
		assert.False(t, ok, "release %d: the releaser still holds", i)
		assert.Len(t, e.members(t, k), 2, "release %d: holders", i)
		assert.Equal(t, announcement{w.value, p.Token}, nextAnnouncement(t, heard[w.place.Room], w.place.Room), "release %d", i)
		last = p.Token
	}
	e.assertNoLine(t, k)
	for _, v := range []string{waiters[1].value, waiters[2].value} {
		r := e.releaseAll(t, k, v)
		assert.Equal(t, lease.Release{Deleted: true}, r, "release with nobody in line")
	}
	assert.Equal(t, last, e.fence(t, k), "a release without a pass issued a token")
	assert.False(t, e.exists(t, k.Lease), "the empty set is kept")
	for room, ch := range heard {
		assert.Empty(t, ch, "room %s heard more than its waiters' grants", room)
	}

	// A release by a value that holds nothing deletes nothing.
	r := e.releaseAll(t, k, x)
	assert.Equal(t, lease.Release{}, r, "a second release")
}

// TestSemaphoreReleasePassesSeveral: a release made with a higher limit than
// the grants before it passes every permit that the higher limit frees, in
// one call, to the first live waiters in line, in order, each with a larger
// token and announced on its own room. Lapsed places are skipped.
func TestSemaphoreReleasePassesSeveral(t *testing.T) {
	e := newEnv(t)
	k1, k3 := semKeys(t, 1), semKeys(t, 3)
	x := lease.NewValue("x")
	xt := e.mustAcquire(t, k1, x)
	waiters := []*waiter{
		newWaiter("a", "r1", liveClaim),
		newWaiter("b", "r2", liveClaim), // lapses
		newWaiter("c", "r2", liveClaim),
		newWaiter("d", "r1", liveClaim),
		newWaiter("e", "r1", liveClaim),
	}
	for i, w := range waiters {
		e.mustQueue(t, k1, w, x, i)
	}
	heard := map[string]<-chan announcement{
		"r1": subscribe(t, e.lc, k1, "r1"),
		"r2": subscribe(t, e.lc, k1, "r2"),
	}
	b := waiters[1]
	e.lapseSoon(t, k1, b, x, 1, shortClaim)
	e.waitLapsed(t, k1, b.value)
	assert.Equal(t, "1", e.limit(t, k1))

	r := e.releaseAll(t, k3, x)
	assert.True(t, r.Deleted)
	passes := r.Passes()
	want := []*waiter{waiters[0], waiters[2], waiters[3]}
	require.Len(t, passes, len(want), "passes: %+v", passes)
	assert.Equal(t, passes[0], r.Passed)
	assert.Equal(t, passes[1:], r.More)
	last := xt
	for i, w := range want {
		p := passes[i]
		assert.Equal(t, w.value, p.Value, "pass %d", i)
		assert.Equal(t, w.place.Room, p.Room, "pass %d: room", i)
		assert.Greater(t, p.Token, last, "pass %d: token", i)
		last = p.Token
		e.assertHolds(t, k3, w.value, liveClaim)
		assert.False(t, e.inLine(t, k3, w.value), "pass %d: still in line", i)
	}
	assert.Equal(t, last, e.fence(t, k3), "fencing key: want the last pass's token")
	assert.Len(t, e.members(t, k3), 3)
	assert.Equal(t, "3", e.limit(t, k3), "limit recorded by the passes")
	assert.False(t, e.inLine(t, k3, b.value), "the lapsed place was kept")
	e.mustQueue(t, k3, waiters[4], waiters[0].value, 0)

	// Each room hears its own waiters' passes, in order.
	assert.Equal(t, announcement{passes[0].Value, passes[0].Token}, nextAnnouncement(t, heard["r1"], "r1"))
	assert.Equal(t, announcement{passes[2].Value, passes[2].Token}, nextAnnouncement(t, heard["r1"], "r1"))
	assert.Equal(t, announcement{passes[1].Value, passes[1].Token}, nextAnnouncement(t, heard["r2"], "r2"))
	for room, ch := range heard {
		assert.Empty(t, ch, "room %s heard more than its waiters' grants", room)
	}
}

// TestSemaphoreCancel: Cancel takes a waiter out of line and voids its
// value, so that its later calls are refused; Cancel of a holder gives its
// permit back and passes it on, as Release does.
func TestSemaphoreCancel(t *testing.T) {
	e := newEnv(t)
	k := semKeys(t, 1)
	x, line := e.heldWithLine(t, k, "a", "b", "c")
	a, b, c := line[0], line[1], line[2]

	r := e.cancel(t, k, a.value)
	assert.Equal(t, lease.Release{}, r, "Cancel of a waiter")
	assert.False(t, e.inLine(t, k, a.value), "a cancelled waiter stands in line")
	assert.True(t, e.exists(t, k.Void(a.value)), "Cancel did not void the value")
	e.assertTTL(t, k.Void(a.value), queueTTL)
	e.mustQueue(t, k, b, x, 0)

	g := e.queue(t, k, a)
	assert.False(t, g.Acquired, "a cancelled value acquired: %+v", g)
	assert.Equal(t, -1, g.Rank, "a cancelled value stood in line")
	assert.False(t, e.inLine(t, k, a.value), "a cancelled value stood in line")

	// The holder cancels: its permit goes to b.
	r = e.cancel(t, k, x)
	assert.True(t, r.Deleted, "Cancel of a holder: %+v", r)
	assert.Equal(t, b.value, r.Passed.Value, "Cancel of a holder: passed to")
	g = e.acquire(t, k, x, queueTTL)
	assert.False(t, g.Acquired, "a cancelled holder acquired again: %+v", g)

	// b never hears of its grant and cancels: its permit goes on to c.
	r = e.cancel(t, k, b.value)
	assert.True(t, r.Deleted, "Cancel of a waiter that was passed a permit: %+v", r)
	assert.Equal(t, c.value, r.Passed.Value)
	assert.Equal(t, []string{c.value}, e.members(t, k))
	e.assertNoLine(t, k)
}

// TestSemaphoreCancelVoidsALateAttempt: with nobody in line, Cancel voids
// the value, so that an attempt with it that arrives later is refused
// although permits are free; Cancel of a holder gives its permit back.
func TestSemaphoreCancelVoidsALateAttempt(t *testing.T) {
	e := newEnv(t)
	k := semKeys(t, 2)
	value := lease.NewValue("me")
	r := e.cancel(t, k, value)
	assert.Equal(t, lease.Release{}, r, "Cancel before any attempt")
	e.assertTTL(t, k.Void(value), queueTTL)

	g := e.acquire(t, k, value, queueTTL)
	assert.False(t, g.Acquired, "an attempt with a voided value was granted: %+v", g)
	assert.Empty(t, e.members(t, k), "an attempt with a voided value took a permit")
	assert.False(t, e.exists(t, k.Fence), "an attempt with a voided value issued a token")

	x := lease.NewValue("x")
	require.True(t, e.acquire(t, k, x, queueTTL).Acquired)
	r = e.cancel(t, k, x)
	assert.Equal(t, lease.Release{Deleted: true}, r, "Cancel of a holder with nobody in line")
	assert.Empty(t, e.members(t, k), "Cancel of a holder kept its permit")
	assert.True(t, e.exists(t, k.Void(x)), "Cancel of a holder did not void its value")
}

// TestSemaphoreSetKeepsLongestLease: the holders' set lasts as long as its
// longest lease: a grant with a shorter TTL does not shorten it.
func TestSemaphoreSetKeepsLongestLease(t *testing.T) {
	e := newEnv(t)
	k := semKeys(t, 2)
	require.True(t, e.acquire(t, k, lease.NewValue("long"), queueTTL).Acquired)
	e.assertTTL(t, k.Lease, queueTTL)
	require.True(t, e.acquire(t, k, lease.NewValue("short"), time.Second).Acquired)
	e.assertTTL(t, k.Lease, queueTTL)
}

// TestSemaphoreAcquireDoesNotBarge: Acquire, which does not stand in line,
// never takes a permit ahead of a live waiter: it passes free permits to
// those in line first, and takes one only if one is left.
func TestSemaphoreAcquireDoesNotBarge(t *testing.T) {
	t.Run("full", func(t *testing.T) {
		e := newEnv(t)
		k := semKeys(t, 1)
		x := lease.NewValue("x")
		e.mustAcquire(t, k, x)
		g := e.acquire(t, k, lease.NewValue("c"), queueTTL)
		assert.False(t, g.Acquired)
		assert.Equal(t, -1, g.Rank, "Acquire stood in line")
		e.assertNoLine(t, k)
	})
	t.Run("ended holder", func(t *testing.T) {
		e := newEnv(t)
		k := semKeys(t, 2)
		a := newWaiter("a", "ra", liveClaim)
		heard := subscribe(t, e.lc, k, "ra")
		_, y := e.endedWithLine(t, k, a)

		c := lease.NewValue("c")
		g := e.acquire(t, k, c, queueTTL)
		require.False(t, g.Acquired, "Acquire took the permit from a live waiter: %+v", g)
		assert.Equal(t, -1, g.Rank, "Acquire stood in line")
		assert.ElementsMatch(t, []string{y, a.value}, e.members(t, k))
		assert.Equal(t, g.Fence, e.fence(t, k), "fence in the reply: want the pass's token")
		assert.Equal(t, announcement{a.value, g.Fence}, nextAnnouncement(t, heard, "ra"))
		assert.False(t, e.inLine(t, k, c), "Acquire stood in line")
		e.assertNoLine(t, k)
	})
	t.Run("raised limit", func(t *testing.T) {
		// a waits under a limit of 1; an Acquire under a limit of 3 passes
		// a permit to a first, then takes one.
		e := newEnv(t)
		k1, k3 := semKeys(t, 1), semKeys(t, 3)
		x := lease.NewValue("x")
		xt := e.mustAcquire(t, k1, x)
		a := newWaiter("a", "ra", liveClaim)
		e.mustQueue(t, k1, a, x, 0)
		heard := subscribe(t, e.lc, k1, "ra")
		c := lease.NewValue("c")
		g := e.acquire(t, k3, c, queueTTL)
		require.True(t, g.Acquired, "Acquire with a free permit left after the pass: %+v", g)
		e.assertHolds(t, k3, a.value, liveClaim)
		pass := nextAnnouncement(t, heard, "ra")
		assert.Equal(t, a.value, pass.value)
		assert.Greater(t, pass.token, xt, "token of the pass to a")
		assert.Greater(t, g.Token, pass.token, "token of c's grant, made after the pass to a")
		assert.Equal(t, g.Token, e.fence(t, k3), "fencing key: want c's token, issued after a's")
		assert.ElementsMatch(t, []string{x, a.value, c}, e.members(t, k3))
		e.assertNoLine(t, k3)
	})
	t.Run("first waiter", func(t *testing.T) {
		e := newEnv(t)
		k := semKeys(t, 2)
		a := newWaiter("a", "room", liveClaim)
		b := newWaiter("b", "room", liveClaim)
		_, y := e.endedWithLine(t, k, a, b)

		g := e.acquire(t, k, a.value, queueTTL)
		require.True(t, g.Acquired, "Acquire by the first waiter with a free permit: %+v", g)
		assert.False(t, e.inLine(t, k, a.value))
		e.mustQueue(t, k, b, y, 0)
	})
}

// TestSemaphoreFirstWaiterPassesTheRest: when several permits are free
// (several leases ended at once, or the limit was raised), the first waiter
// who calls takes one and passes those left to the waiters behind it, up to
// the limit it was called with.
func TestSemaphoreFirstWaiterPassesTheRest(t *testing.T) {
	t.Run("ended holders", func(t *testing.T) {
		e := newEnv(t)
		k := semKeys(t, 3)
		x, y, z := lease.NewValue("x"), lease.NewValue("y"), lease.NewValue("z")
		require.True(t, e.acquire(t, k, x, endTTL).Acquired)
		require.True(t, e.acquire(t, k, y, endTTL).Acquired)
		e.mustAcquire(t, k, z)
		a := newWaiter("a", "ra", liveClaim)
		b := newWaiter("b", "rb", liveClaim)
		c := newWaiter("c", "rc", liveClaim)
		for i, w := range []*waiter{a, b, c} {
			e.mustQueue(t, k, w, x, i)
		}
		heard := subscribe(t, e.lc, k, "rb")
		e.waitEnded(t, k, x)
		e.waitEnded(t, k, y)

		g := e.queue(t, k, a)
		require.True(t, g.Acquired, "the first waiter with two permits free: %+v", g)
		assert.ElementsMatch(t, []string{z, a.value, b.value}, e.members(t, k), "holders: want a's and a pass to b")
		e.assertHolds(t, k, b.value, liveClaim)
		pass := nextAnnouncement(t, heard, "rb")
		assert.Equal(t, b.value, pass.value)
		assert.Greater(t, pass.token, g.Token, "token of the pass to b, made after a's grant")
		assert.Equal(t, pass.token, e.fence(t, k))
		assert.False(t, e.inLine(t, k, b.value), "b still stands in line")
		e.mustQueue(t, k, c, z, 0)
	})
	t.Run("raised limit", func(t *testing.T) {
		e := newEnv(t)
		k1, k3 := semKeys(t, 1), semKeys(t, 3)
		x := lease.NewValue("x")
		// x's lease ends first, before b's claim window: the holder that
		// c's reply names (ties in the same ms would go by name).
		require.True(t, e.acquire(t, k1, x, liveClaim/2).Acquired)
		a := newWaiter("a", "ra", liveClaim)
		b := newWaiter("b", "rb", liveClaim)
		c := newWaiter("c", "rc", liveClaim)
		for i, w := range []*waiter{a, b, c} {
			e.mustQueue(t, k1, w, x, i)
		}
		g, err := e.lc.AcquireOrQueue(ctxFor(t), k3, a.value, queueTTL, a.place)
		require.NoError(t, err)
		require.True(t, g.Acquired, "the first waiter under a raised limit: %+v", g)
		assert.ElementsMatch(t, []string{x, a.value, b.value}, e.members(t, k3), "holders: want a's and a pass to b")
		e.mustQueue(t, k3, c, x, 0)
	})
}

// TestSemaphoreLoweredLimit: holders above a lowered limit keep their
// permits and renew them; callers with the lower limit are granted nothing,
// and releases made with it pass nothing on, until fewer than that many
// hold. The limit key records the limit of the last grant.
func TestSemaphoreLoweredLimit(t *testing.T) {
	e := newEnv(t)
	k3, k2 := semKeys(t, 3), semKeys(t, 2)
	x, y, z := lease.NewValue("x"), lease.NewValue("y"), lease.NewValue("z")
	for _, v := range []string{x, y, z} {
		e.mustAcquire(t, k3, v)
	}
	assert.Equal(t, "3", e.limit(t, k3))

	c := newWaiter("c", "room", liveClaim)
	g := e.acquire(t, k2, c.value, queueTTL)
	assert.False(t, g.Acquired, "Acquire under a lowered limit with 3 holders: %+v", g)
	e.mustQueue(t, k2, c, x, 0)
	for _, v := range []string{x, y, z} {
		assert.True(t, e.renew(t, k2, v, queueTTL).OK, "Renew of a holder above the lowered limit")
	}
	// A holder that acquires again under the lowered limit keeps its permit.
	g = e.acquire(t, k2, y, queueTTL)
	assert.True(t, g.Acquired, "Acquire again by a holder above the lowered limit: %+v", g)
	assert.Equal(t, "2", e.limit(t, k2), "limit after a grant under 2")

	r := e.releaseAll(t, k2, z)
	assert.Equal(t, lease.Release{Deleted: true}, r, "a release that leaves 2 holders under a limit of 2 passed on")
	g = e.queue(t, k2, c)
	assert.False(t, g.Acquired, "the waiter with 2 holders under a limit of 2: %+v", g)
	assert.Equal(t, 0, g.Rank)

	// An old caller, with the limit of 3, is still granted up to 3; it
	// passes the permit to the waiter in line first.
	g = e.acquire(t, k3, lease.NewValue("old"), queueTTL)
	assert.False(t, g.Acquired, "an Acquire under 3 ahead of the waiter: %+v", g)
	assert.ElementsMatch(t, []string{x, y, c.value}, e.members(t, k3))
	assert.Equal(t, "3", e.limit(t, k3), "limit after a pass under 3")

	r = e.releaseAll(t, k2, c.value)
	assert.True(t, r.Deleted)
	r = e.releaseAll(t, k2, y)
	assert.True(t, r.Deleted)
	d := lease.NewValue("d")
	g = e.acquire(t, k2, d, queueTTL)
	assert.True(t, g.Acquired, "Acquire under 2 with 1 holder: %+v", g)
	assert.Equal(t, "2", e.limit(t, k2))
	g = e.acquire(t, k2, lease.NewValue("e"), queueTTL)
	assert.False(t, g.Acquired, "Acquire under 2 with 2 holders: %+v", g)
}

// TestSemaphoreAndLockShareNoKey: a semaphore's scripts on a lock's lease
// fail with an error that says so, and a lock's scripts on a semaphore's
// likewise; neither writes anything. Renew and Release refuse
// without an error, and write nothing either.
func TestSemaphoreAndLockShareNoKey(t *testing.T) {
	// assertRefused checks that k's scripts, on a lease of the other kind
	// held by holder, refuse the newcomer v's Acquire and AcquireOrQueue
	// with an error that contains want (and names k's lease), and refuse
	// the Renew and Release of both without an error. what names the calls
	// in failures: "semaphore" or "lock".
	assertRefused := func(t *testing.T, e *env, k lease.Keys, holder, v, want, what string) {
		t.Helper()
		place := lease.Place{Claim: liveClaim, Room: "room"}
		g, err := e.lc.Acquire(ctxFor(t), k, v, queueTTL)
		require.Error(t, err, "%s Acquire on the other kind: got %+v", what, g)
		assert.Contains(t, err.Error(), want)
		assert.Contains(t, err.Error(), k.Lease)
		g, err = e.lc.AcquireOrQueue(ctxFor(t), k, v, queueTTL, place)
		require.Error(t, err, "%s AcquireOrQueue on the other kind: got %+v", what, g)
		assert.Contains(t, err.Error(), want)
		for _, val := range []string{holder, v} {
			r := e.renew(t, k, val, queueTTL)
			assert.False(t, r.OK, "%s Renew on the other kind", what)
			assert.Equal(t, lease.Release{}, e.releaseAll(t, k, val), "%s Release on the other kind", what)
		}
	}
	t.Run("semaphore on a lock", func(t *testing.T) {
		e := newEnv(t)
		lock := keys(t)
		x, _ := e.heldWithLine(t, lock, "a")
		before := e.state(t, lock)

		assertRefused(t, e, lock.Semaphore(2), x, lease.NewValue("v"), "not a semaphore", "semaphore")
		assert.Equal(t, before, e.state(t, lock), "a semaphore's scripts on a lock wrote something")
	})
	t.Run("lock on a semaphore", func(t *testing.T) {
		e := newEnv(t)
		sem := semKeys(t, 2)
		lock := keys(t)
		x := lease.NewValue("x")
		e.mustAcquire(t, sem, x)
		e.mustAcquire(t, sem, lease.NewValue("y"))
		e.lineUp(t, sem, x, newWaiter("a", "room", liveClaim))
		before := e.state(t, sem)

		v := lease.NewValue("v")
		for _, k := range []lease.Keys{lock, lock.Election()} {
			assertRefused(t, e, k, x, v, "not a lock", "lock")
		}
		assert.Equal(t, before, e.state(t, sem), "a lock's scripts on a semaphore wrote something")
	})
}

// TestRead: Read reports a semaphore's live holders in the order their
// leases end, with what is left of each, the last token and the limit; a
// lock's holder; nobody for a missing key; the type of a foreign key. It
// writes nothing.
func TestRead(t *testing.T) {
	assertHolding := func(t *testing.T, want lease.Holding, got lease.Holding) {
		t.Helper()
		assert.Equal(t, want.Value, got.Value)
		assert.LessOrEqual(t, got.TTL, want.TTL, "TTL of %q", got.Value)
		assert.Greater(t, got.TTL, want.TTL-ttlMargin, "TTL of %q", got.Value)
	}
	t.Run("semaphore", func(t *testing.T) {
		e := newEnv(t)
		k := semKeys(t, 4)
		x := lease.NewValue("x")
		require.True(t, e.acquire(t, k, x, endTTL).Acquired)
		want := []lease.Holding{
			{Value: lease.NewValue("b"), TTL: 20 * time.Second},
			{Value: lease.NewValue("c"), TTL: 30 * time.Second},
			{Value: lease.NewValue("a"), TTL: 10 * time.Second},
		}
		var last int64
		for _, h := range want {
			g := e.acquire(t, k, h.Value, h.TTL)
			require.True(t, g.Acquired)
			last = g.Token
		}
		e.waitEnded(t, k, x)
		require.Contains(t, e.members(t, k), x)
		before := e.state(t, k)

		s, err := e.lc.Read(ctxFor(t), k)
		require.NoError(t, err)
		assert.Equal(t, "zset", s.Type)
		assert.Equal(t, last, s.Fence)
		assert.Equal(t, 4, s.Limit)
		require.Len(t, s.Holders, 3, "holders: want x, whose lease ended, left out: %+v", s.Holders)
		for i, j := range []int{2, 0, 1} {
			assertHolding(t, want[j], s.Holders[i])
		}
		assert.Equal(t, before, e.state(t, k), "Read wrote something")
	})
	t.Run("lock", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		x := lease.NewValue("x")
		tok := e.mustAcquire(t, k, x)
		s, err := e.lc.Read(ctxFor(t), k)
		require.NoError(t, err)
		assert.Equal(t, "string", s.Type)
		assert.Equal(t, tok, s.Fence)
		assert.Zero(t, s.Limit)
		require.Len(t, s.Holders, 1)
		assertHolding(t, lease.Holding{Value: x, TTL: ttl}, s.Holders[0])

		e.srv.MustDo("PERSIST", k.Lease)
		s, err = e.lc.Read(ctxFor(t), k)
		require.NoError(t, err)
		require.Len(t, s.Holders, 1)
		assert.Negative(t, s.Holders[0].TTL, "TTL of a lease without expiry")
	})
	t.Run("none", func(t *testing.T) {
		e := newEnv(t)
		k := semKeys(t, 2)
		s, err := e.lc.Read(ctxFor(t), k)
		require.NoError(t, err)
		assert.Equal(t, lease.Snapshot{Type: "none"}, s)

		// Released: no holder, the last token and limit are kept.
		x := lease.NewValue("x")
		tok := e.mustAcquire(t, k, x)
		require.True(t, e.release(t, k, x))
		s, err = e.lc.Read(ctxFor(t), k)
		require.NoError(t, err)
		assert.Equal(t, lease.Snapshot{Type: "none", Fence: tok, Limit: 2}, s)
	})
	t.Run("foreign", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		e.srv.MustDo("HSET", k.Lease, "f", "v")
		e.srv.MustDo("SET", k.Fence, "1.5")
		e.srv.MustDo("HSET", k.Limit, "f", "v")
		s, err := e.lc.Read(ctxFor(t), k)
		require.NoError(t, err)
		assert.Equal(t, lease.Snapshot{Type: "hash"}, s)
	})
}
