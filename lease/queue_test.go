package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// Tests of the waiting line (AcquireOrQueue, the pass in Release and
// Cancel, and its announcement) against redis-server.
//
// Timing: waiters that must stay in line for a whole test get liveClaim,
// far longer than any test step takes even on a loaded machine. A waiter
// whose place is meant to lapse first stands in line with liveClaim, so that
// the line's keys outlive its place, and then calls again with shortClaim
// (see lapseSoon); the tests wait for the lapse on the server's own clock,
// or for Redis to expire a key, instead of sleeping. A waiter that must
// still be in line at the next step but whose grant is meant to lapse gets
// grantClaim, long enough for that step on a loaded machine. A lease passed
// to a waiter has its claim window as TTL and a claimed one queueTTL; the
// two are further apart than ttlMargin, so a PTTL tells which one was
// written.
const (
	queueTTL    = 30 * time.Second       // lease TTL of holders and of claimed grants
	liveClaim   = 10 * time.Second       // claim window of waiters that stay in line
	shortClaim  = 200 * time.Millisecond // claim window of places that are meant to lapse
	grantClaim  = time.Second            // claim window of a waiter served next whose grant is meant to lapse
	fadeClaim   = 2 * time.Second        // claim window of waiters that stop calling, so that the line expires
	lapseWait   = 10 * time.Second       // how long a lapse on the server's clock may take to be seen
	readyWait   = 5 * time.Second        // how long a subscription may take to be confirmed
	announceIn  = 5 * time.Second        // how long an announcement may take to arrive
	expiryAfter = 5 * time.Millisecond   // how much earlier than a place's lapse the line's keys may expire
)

// waiter is a value standing in line, with its place.
type waiter struct {
	value string
	place lease.Place
}

func newWaiter(name, room string, claim time.Duration) *waiter {
	return &waiter{value: lease.NewValue(name), place: lease.Place{Claim: claim, Room: room}}
}

// queue calls AcquireOrQueue for w, and remembers the ticket it got.
func (e *env) queue(t *testing.T, k lease.Keys, w *waiter) lease.Grant {
	t.Helper()
	g, err := e.lc.AcquireOrQueue(ctxFor(t), k, w.value, queueTTL, w.place)
	require.NoError(t, err, "AcquireOrQueue(%q, %+v)", w.value, w.place)
	if !g.Acquired && g.Rank >= 0 {
		w.place.Ticket = g.Ticket
	}
	return g
}

// mustQueue calls AcquireOrQueue for w and checks that it stands in line
// at rank behind holder.
func (e *env) mustQueue(t *testing.T, k lease.Keys, w *waiter, holder string, rank int) lease.Grant {
	t.Helper()
	g := e.queue(t, k, w)
	require.False(t, g.Acquired, "AcquireOrQueue(%q): got %+v, want it in line", w.value, g)
	assert.Equal(t, holder, g.Holder, "AcquireOrQueue(%q): holder", w.value)
	assert.Equal(t, rank, g.Rank, "AcquireOrQueue(%q): rank", w.value)
	assert.Positive(t, g.Ticket, "AcquireOrQueue(%q): ticket", w.value)
	return g
}

// mustRelease releases value, which holds the lease, and returns the
// release's pass.
func (e *env) mustRelease(t *testing.T, k lease.Keys, value string) lease.Pass {
	t.Helper()
	r, err := e.lc.Release(ctxFor(t), k, value)
	require.NoError(t, err, "Release(%q)", value)
	require.True(t, r.Deleted, "Release(%q): got %+v, want the lease deleted", value, r)
	return r.Passed
}

// holder returns the lease's value, or "" when there is none.
func (e *env) holder(t *testing.T, k lease.Keys) string {
	t.Helper()
	v, _ := e.get(t, k.Lease)
	return v
}

// inLine reports whether value has a place in line, and checks that the
// queue and the waiters hash agree on it.
func (e *env) inLine(t *testing.T, k lease.Keys, value string) bool {
	t.Helper()
	queued := !e.srv.MustDo("ZSCORE", k.Queue, value).IsNil()
	entry := e.intReply(t, "HEXISTS", k.Waiters, value) == 1
	assert.Equal(t, queued, entry, "%q: in the queue %v, in the waiters hash %v; want both or neither", value, queued, entry)
	return queued
}

// lapseSoon has w, which stands in line at rank behind holder, call again
// with the claim window claim: it keeps its place, which now lapses claim
// from now, and a grant to it lasts claim.
func (e *env) lapseSoon(t *testing.T, k lease.Keys, w *waiter, holder string, rank int, claim time.Duration) {
	t.Helper()
	ticket := w.place.Ticket
	w.place.Claim = claim
	e.mustQueue(t, k, w, holder, rank)
	require.Equal(t, ticket, w.place.Ticket, "%q changed its place when it called again", w.value)
}

// firstCallsAgain has a new value x hold k with waiters a and b in line
// behind it; then a calls again with the claim window claim (see
// lapseSoon). It returns x, a and b.
func (e *env) firstCallsAgain(t *testing.T, k lease.Keys, claim time.Duration) (x string, a, b *waiter) {
	t.Helper()
	x, line := e.heldWithLine(t, k, "a", "b")
	a, b = line[0], line[1]
	e.lapseSoon(t, k, a, x, 0, claim)
	return x, a, b
}

// assertNoLine checks that the line's keys do not exist.
func (e *env) assertNoLine(t *testing.T, k lease.Keys) {
	t.Helper()
	assert.False(t, e.exists(t, k.Queue), "the queue key %s exists", k.Queue)
	assert.False(t, e.exists(t, k.Waiters), "the waiters key %s exists", k.Waiters)
}

// entry is a waiter's record in the waiters hash.
type entry struct {
	lapse int64 // server time in ms at which the place lapses
	claim time.Duration
	room  string
}

func (e *env) entry(t *testing.T, k lease.Keys, value string) entry {
	t.Helper()
	raw, err := e.srv.MustDo("HGET", k.Waiters, value).ToString()
	require.NoError(t, err, "HGET %s %q", k.Waiters, value)
	parts := strings.SplitN(raw, " ", 3)
	require.Len(t, parts, 3, "waiters entry of %q: %q", value, raw)
	lapse, err1 := strconv.ParseInt(parts[0], 10, 64)
	claim, err2 := strconv.ParseInt(parts[1], 10, 64)
	require.NoError(t, errors.Join(err1, err2), "waiters entry of %q: %q", value, raw)
	return entry{lapse: lapse, claim: time.Duration(claim) * time.Millisecond, room: parts[2]}
}

// waitLapsed waits until value's place has lapsed on the server's clock.
func (e *env) waitLapsed(t *testing.T, k lease.Keys, value string) {
	t.Helper()
	lapse := e.entry(t, k, value).lapse
	require.Eventually(t, func() bool { return e.serverTime(t)/1000 >= lapse }, lapseWait, pollEvery,
		"the server clock did not reach the lapse of %q's place", value)
}

// waitGone waits until Redis has expired key.
func (e *env) waitGone(t *testing.T, key string) {
	t.Helper()
	require.Eventually(t, func() bool { return !e.exists(t, key) }, lapseWait, pollEvery, "%s did not expire", key)
}

// announcement is a grant heard on a room's channel.
type announcement struct {
	value string
	token int64
}

// subscribe listens to room's channel until the test ends, and returns the
// announcements heard. It returns once the subscription is confirmed.
func subscribe(t *testing.T, lc *lease.Client, k lease.Keys, room string) <-chan announcement {
	t.Helper()
	return listen(t, "Subscribe(room "+room+")", func(ctx context.Context, ready func(), heard func(string, int64)) error {
		return lc.Subscribe(ctx, k, room, ready, heard)
	})
}

// nextAnnouncement returns the next announcement heard.
func nextAnnouncement(t *testing.T, heard <-chan announcement, room string) announcement {
	t.Helper()
	select {
	case a := <-heard:
		return a
	case <-time.After(announceIn):
		t.Fatalf("room %s: no announcement within %v", room, announceIn)
		return announcement{}
	}
}

// TestQueueFIFO: waiters get the lease in the order they stood in line.
// Each release passes it to the next waiter for its claim window with a
// larger token, and takes that waiter out of line.
func TestQueueFIFO(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	x := lease.NewValue("x")
	xg := e.acquire(t, k, x, queueTTL)
	require.True(t, xg.Acquired)

	waiters := []*waiter{
		newWaiter("a", "room", liveClaim),
		newWaiter("b", "room", liveClaim),
		newWaiter("c", "room", liveClaim),
	}
	var lastTicket int64
	for i, w := range waiters {
		g := e.mustQueue(t, k, w, x, i)
		assert.Greater(t, g.Ticket, lastTicket, "ticket of waiter %d: want more than the one before", i)
		lastTicket = g.Ticket
		assert.Equal(t, xg.Token, g.Fence, "waiter %d: fence in the reply", i)
		assert.LessOrEqual(t, g.HolderTTL, queueTTL, "waiter %d: HolderTTL", i)
		assert.Greater(t, g.HolderTTL, queueTTL-ttlMargin, "waiter %d: HolderTTL", i)
		e.assertTTL(t, k.Lease, queueTTL) // standing in line does not touch the lease
	}
	// Calling again keeps the place, with or without the ticket.
	b := waiters[1]
	kept := b.place.Ticket
	b.place.Ticket = 0
	e.mustQueue(t, k, b, x, 1)
	assert.Equal(t, kept, b.place.Ticket, "b's ticket after calling again without it")
	e.assertTTL(t, k.Queue, liveClaim)
	e.assertTTL(t, k.Waiters, liveClaim)

	prev, last := x, xg.Token
	for i, w := range waiters {
		p := e.mustRelease(t, k, prev)
		assert.Equal(t, w.value, p.Value, "release %d passed to the wrong waiter", i)
		assert.Equal(t, w.place.Room, p.Room, "release %d: room", i)
		assert.Greater(t, p.Token, last, "release %d: token of the pass", i)
		assert.Equal(t, p.Token, e.fence(t, k), "release %d: fencing key", i)
		assert.Equal(t, w.value, e.holder(t, k), "release %d: lease", i)
		e.assertTTL(t, k.Lease, liveClaim)
		assert.False(t, e.inLine(t, k, w.value), "release %d: the new holder still stands in line", i)
		for j, rest := range waiters[i+1:] {
			e.mustQueue(t, k, rest, w.value, j)
		}
		prev, last = w.value, p.Token
	}
	e.assertNoLine(t, k)
	p := e.mustRelease(t, k, prev)
	assert.Equal(t, lease.Pass{}, p, "the last release passed to nobody")
	assert.False(t, e.exists(t, k.Lease))
	assert.Equal(t, last, e.fence(t, k), "a release without a pass issued a token")
}

// TestQueuePassAnnounced: a pass is announced on the waiter's room's
// channel with its value and token, and on no other room's.
func TestQueuePassAnnounced(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	x := lease.NewValue("x")
	e.mustAcquire(t, k, x)
	heard := map[string]<-chan announcement{
		"r1": subscribe(t, e.lc, k, "r1"),
		"r2": subscribe(t, e.lc, k, "r2"),
	}
	waiters := []*waiter{
		newWaiter("a", "r1", liveClaim),
		newWaiter("b", "r2", liveClaim),
		newWaiter("c", "r1", liveClaim),
		newWaiter("d", "r2", liveClaim),
	}
	for i, w := range waiters {
		e.mustQueue(t, k, w, x, i)
	}
	prev := x
	for i, w := range waiters {
		p := e.mustRelease(t, k, prev)
		require.Equal(t, w.value, p.Value, "release %d", i)
		// Announcements arrive in order, so the next one on this room's
		// channel being this pass's shows that the previous pass (to the
		// other room) was not announced here.
		got := nextAnnouncement(t, heard[w.place.Room], w.place.Room)
		assert.Equal(t, announcement{w.value, p.Token}, got, "room %s, pass %d", w.place.Room, i)
		prev = w.value
	}
	e.mustRelease(t, k, prev)
	for room, ch := range heard {
		assert.Empty(t, ch, "room %s heard more than its waiters' grants", room)
	}
}

// TestQueuePlaceLapses: a waiter that does not call again within its claim
// window loses its place: the next release skips it and removes its entry.
func TestQueuePlaceLapses(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	x, a, b := e.firstCallsAgain(t, k, shortClaim)
	e.waitLapsed(t, k, a.value)
	assert.True(t, e.inLine(t, k, a.value), "a lapsed place is removed by the next release, not before")

	p := e.mustRelease(t, k, x)
	assert.Equal(t, b.value, p.Value, "release: want the lapsed waiter skipped")
	assert.Equal(t, b.value, e.holder(t, k))
	assert.False(t, e.inLine(t, k, a.value), "the lapsed place was kept")
	e.assertNoLine(t, k)
}

// TestQueueGrantLapses: a lease passed to a waiter that never claims it
// lasts its claim window; the next waiter, first in line now, is then
// granted the full TTL.
func TestQueueGrantLapses(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	x, a, b := e.firstCallsAgain(t, k, grantClaim)

	p := e.mustRelease(t, k, x)
	require.Equal(t, a.value, p.Value, "release: a's place lapsed before it (the machine is slower than grantClaim allows)")
	got := e.pttl(t, k.Lease)
	assert.LessOrEqual(t, got, grantClaim, "PTTL of the pass: want a's claim window")
	e.waitGone(t, k.Lease)

	g := e.queue(t, k, b)
	require.True(t, g.Acquired, "b, first in line, after a's grant lapsed: got %+v, want granted", g)
	assert.Greater(t, g.Token, p.Token, "b's token")
	assert.Equal(t, b.value, e.holder(t, k))
	e.assertTTL(t, k.Lease, queueTTL)
	e.assertNoLine(t, k)
}

// TestQueueTicketKept: a waiter that lost its place (it lapsed, or the line
// was lost) gets it back by calling with its ticket, ahead of those who
// came after it.
func TestQueueTicketKept(t *testing.T) {
	t.Run("place lapsed", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		x, a, b := e.firstCallsAgain(t, k, shortClaim)
		e.waitLapsed(t, k, a.value)
		require.Equal(t, b.value, e.mustRelease(t, k, x).Value, "the lapsed waiter was not skipped")
		require.False(t, e.inLine(t, k, a.value))
		c := newWaiter("c", "room", liveClaim)
		e.mustQueue(t, k, c, b.value, 0)

		ticket := a.place.Ticket
		a.place.Claim = liveClaim
		e.mustQueue(t, k, a, b.value, 0)
		assert.Equal(t, ticket, a.place.Ticket, "a's ticket after it came back")
		e.mustQueue(t, k, c, b.value, 1)
		assert.Equal(t, a.value, e.mustRelease(t, k, b.value).Value, "the release after a came back")
		assert.Equal(t, c.value, e.mustRelease(t, k, a.value).Value)
	})
	for _, lost := range []string{"queue keys deleted", "flushall"} {
		t.Run(lost, func(t *testing.T) {
			e := newEnv(t)
			k := keys(t)
			x, line := e.heldWithLine(t, k, "a", "b")
			a, b := line[0], line[1]
			if lost == "flushall" {
				e.srv.MustDo("FLUSHALL")
				x = lease.NewValue("y") // the lease was lost with the rest
				e.mustAcquire(t, k, x)
			} else {
				e.srv.MustDo("DEL", k.Queue, k.Waiters)
			}

			// They come back in the reverse order, after a newcomer.
			c := newWaiter("c", "room", liveClaim)
			e.mustQueue(t, k, c, x, 0)
			e.mustQueue(t, k, b, x, 0)
			e.mustQueue(t, k, a, x, 0)
			e.mustQueue(t, k, b, x, 1)
			e.mustQueue(t, k, c, x, 2)
			prev := x
			for _, w := range []*waiter{a, b, c} {
				assert.Equal(t, w.value, e.mustRelease(t, k, prev).Value)
				prev = w.value
			}
		})
	}
}

// TestQueueClaim: a waiter the lease was passed to claims it with
// AcquireOrQueue or Acquire (the full TTL and a new token), or keeps it by
// renewing.
func TestQueueClaim(t *testing.T) {
	// passedToA has x hold a new lock with a in line, and release it: the
	// lease passes to a, for its claim window.
	passedToA := func(t *testing.T) (*env, lease.Keys, *waiter, lease.Pass) {
		t.Helper()
		e := newEnv(t)
		k := keys(t)
		x, line := e.heldWithLine(t, k, "a")
		a := line[0]
		p := e.mustRelease(t, k, x)
		require.Equal(t, a.value, p.Value)
		return e, k, a, p
	}
	claims := []struct {
		name  string
		claim func(t *testing.T, e *env, k lease.Keys, w *waiter) lease.Grant
	}{
		{"AcquireOrQueue", func(t *testing.T, e *env, k lease.Keys, w *waiter) lease.Grant { return e.queue(t, k, w) }},
		{"Acquire", func(t *testing.T, e *env, k lease.Keys, w *waiter) lease.Grant {
			return e.acquire(t, k, w.value, queueTTL)
		}},
	}
	for _, c := range claims {
		t.Run(c.name, func(t *testing.T) {
			e, k, a, p := passedToA(t)
			e.assertTTL(t, k.Lease, liveClaim)

			g := c.claim(t, e, k, a)
			require.True(t, g.Acquired, "claim: got %+v, want granted", g)
			assert.Equal(t, p.Token, g.Token, "the claim keeps the pass's token")
			assert.Equal(t, g.Token, e.fence(t, k))
			assert.Equal(t, a.value, e.holder(t, k))
			e.assertTTL(t, k.Lease, queueTTL)
			e.assertNoLine(t, k)
		})
	}
	t.Run("Renew", func(t *testing.T) {
		e, k, a, p := passedToA(t)
		require.True(t, e.renew(t, k, a.value, queueTTL).OK, "renewal of a passed lease")
		e.assertTTL(t, k.Lease, queueTTL)
		assert.Equal(t, p.Token, e.fence(t, k), "a renewal issued a token")
	})
}

// TestQueueCancel: Cancel takes a waiter out of line, and when the lease
// was just passed to it, deletes it and passes it on at once. The value is
// refused afterwards and does not stand in line again.
func TestQueueCancel(t *testing.T) {
	t.Run("waiter", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		x, line := e.heldWithLine(t, k, "a", "b")
		a, b := line[0], line[1]

		r := e.cancel(t, k, a.value)
		assert.Equal(t, lease.Release{}, r, "Cancel of a waiter: nothing deleted, nothing passed")
		assert.False(t, e.inLine(t, k, a.value), "the cancelled waiter stands in line")
		assert.Equal(t, x, e.holder(t, k), "Cancel of a waiter touched the lease")
		e.mustQueue(t, k, b, x, 0)

		g := e.queue(t, k, a)
		assert.Equal(t, lease.Grant{Holder: x, HolderTTL: g.HolderTTL, Rank: -1, Fence: g.Fence}, g,
			"AcquireOrQueue with a voided value: want refused, not in line")
		assert.False(t, e.inLine(t, k, a.value), "a voided value stood in line again")
		assert.Equal(t, b.value, e.mustRelease(t, k, x).Value)
	})
	t.Run("grantee", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		x, line := e.heldWithLine(t, k, "a", "b")
		a, b := line[0], line[1]
		pa := e.mustRelease(t, k, x)
		require.Equal(t, a.value, pa.Value)

		r := e.cancel(t, k, a.value)
		assert.True(t, r.Deleted, "Cancel of the grantee: the passed lease was not deleted")
		assert.Equal(t, b.value, r.Passed.Value, "Cancel of the grantee: passed to")
		assert.Greater(t, r.Passed.Token, pa.Token, "token of the second pass")
		assert.Equal(t, b.value, e.holder(t, k))
		e.assertTTL(t, k.Lease, liveClaim)
		e.assertNoLine(t, k)

		g := e.queue(t, k, a)
		assert.False(t, g.Acquired, "a voided value was granted")
		assert.Equal(t, -1, g.Rank, "a voided value stood in line")
		assert.False(t, e.inLine(t, k, a.value))
		e.assertNoLine(t, k)
		require.True(t, e.release(t, k, b.value))
		g = e.queue(t, k, a)
		assert.False(t, g.Acquired, "a voided value was granted the free lease")
		assert.False(t, e.exists(t, k.Lease), "a voided value wrote the lease")
	})
	t.Run("first waiter of a free lease", func(t *testing.T) {
		// The grant lapsed (here: the lease was deleted): a waiter that
		// gives up passes the free lease on.
		e := newEnv(t)
		k := keys(t)
		line := e.freeWithLine(t, k, "a", "b")
		a, b := line[0], line[1]

		r := e.cancel(t, k, a.value)
		assert.False(t, r.Deleted)
		assert.Equal(t, b.value, r.Passed.Value, "Cancel of a waiter of a free lease: passed to")
		assert.Equal(t, b.value, e.holder(t, k))
	})
}

// TestQueueAcquireDoesNotBarge: Acquire never stands in line, and does not
// take a free lease from a live waiter: it passes the lease to the waiter,
// announces it, and reports the waiter as holder. AcquireOrQueue does the
// same and stands in line behind.
func TestQueueAcquireDoesNotBarge(t *testing.T) {
	t.Run("held lease", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		x := lease.NewValue("x")
		e.mustAcquire(t, k, x)
		c := lease.NewValue("c")
		g := e.acquire(t, k, c, queueTTL)
		assert.False(t, g.Acquired)
		assert.Equal(t, -1, g.Rank, "Acquire stood in line")
		assert.Zero(t, g.Ticket)
		assert.False(t, e.inLine(t, k, c))
		e.assertNoLine(t, k)
	})
	for _, how := range []string{"Acquire", "AcquireOrQueue"} {
		t.Run("free lease, "+how, func(t *testing.T) {
			e := newEnv(t)
			k := keys(t)
			x := lease.NewValue("x")
			xt := e.mustAcquire(t, k, x)
			a := newWaiter("a", "ra", liveClaim)
			e.mustQueue(t, k, a, x, 0)
			heard := subscribe(t, e.lc, k, "ra")
			e.srv.MustDo("DEL", k.Lease) // x's lease expired

			c := newWaiter("c", "rc", liveClaim)
			var g lease.Grant
			if how == "Acquire" {
				g = e.acquire(t, k, c.value, queueTTL)
			} else {
				g = e.queue(t, k, c)
			}
			require.False(t, g.Acquired, "%s took the lease from a live waiter: %+v", how, g)
			assert.Equal(t, a.value, g.Holder, "%s: holder", how)
			assert.Greater(t, g.Fence, xt, "%s: fence: want the pass's token", how)
			assert.LessOrEqual(t, g.HolderTTL, liveClaim, "%s: HolderTTL: want a's claim window", how)
			assert.Greater(t, g.HolderTTL, liveClaim-ttlMargin, "%s: HolderTTL: want a's claim window", how)
			assert.Equal(t, a.value, e.holder(t, k))
			assert.Equal(t, g.Fence, e.fence(t, k))
			e.assertTTL(t, k.Lease, liveClaim)
			assert.False(t, e.inLine(t, k, a.value), "a still stands in line")
			assert.Equal(t, announcement{a.value, g.Fence}, nextAnnouncement(t, heard, "ra"))
			if how == "Acquire" {
				assert.Equal(t, -1, g.Rank, "Acquire stood in line")
				assert.False(t, e.inLine(t, k, c.value), "Acquire stood in line")
			} else {
				assert.Equal(t, 0, g.Rank, "AcquireOrQueue: rank behind the new holder")
				assert.True(t, e.inLine(t, k, c.value))
			}
		})
	}
	t.Run("free lease, first waiter", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		line := e.freeWithLine(t, k, "a", "b")
		a, b := line[0], line[1]

		g := e.acquire(t, k, a.value, queueTTL)
		require.True(t, g.Acquired, "Acquire by the first waiter of a free lease: got %+v", g)
		e.assertTTL(t, k.Lease, queueTTL)
		assert.False(t, e.inLine(t, k, a.value))
		e.mustQueue(t, k, b, a.value, 0)
	})
}

// TestQueueFreeLeaseEmptyLine: with nobody in line, a free lease is granted
// at once and no line is created.
func TestQueueFreeLeaseEmptyLine(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	v := lease.NewValue("v")
	e.mustAcquire(t, k, v)
	e.assertNoLine(t, k)
	assert.Equal(t, lease.Pass{}, e.mustRelease(t, k, v))

	w := newWaiter("w", "room", liveClaim)
	g := e.queue(t, k, w)
	require.True(t, g.Acquired, "AcquireOrQueue of a free lease: got %+v", g)
	e.assertTTL(t, k.Lease, queueTTL)
	e.assertNoLine(t, k)
	assert.Equal(t, lease.Pass{}, e.mustRelease(t, k, w.value))
	e.assertNoLine(t, k)

	// Only lapsed places in line: the same, and the line is cleared. (a
	// keeps the line's keys alive past b's lapse, then leaves.)
	x := lease.NewValue("x")
	e.mustAcquire(t, k, x)
	a := newWaiter("a", "room", liveClaim)
	b := newWaiter("b", "room", shortClaim)
	e.mustQueue(t, k, a, x, 0)
	e.mustQueue(t, k, b, x, 1)
	r := e.cancel(t, k, a.value)
	require.Equal(t, lease.Release{}, r, "a waiter's cancel")
	require.False(t, e.inLine(t, k, a.value), "a waiter's cancel left it in line")
	e.srv.MustDo("DEL", k.Lease)
	e.waitLapsed(t, k, b.value)
	g = e.queue(t, k, newWaiter("c", "room", liveClaim))
	require.True(t, g.Acquired, "AcquireOrQueue of a free lease behind a lapsed place: got %+v", g)
	e.assertNoLine(t, k)
}

// TestQueueKeysDisappear: the line's keys go when the last waiter leaves
// it, and expire when every waiter stops calling; they never expire before
// a place in them lapses.
func TestQueueKeysDisappear(t *testing.T) {
	leaves := []struct {
		name  string
		leave func(t *testing.T, e *env, k lease.Keys, holder string, w *waiter)
	}{
		{"last waiter served", func(t *testing.T, e *env, k lease.Keys, holder string, w *waiter) {
			require.Equal(t, w.value, e.mustRelease(t, k, holder).Value)
		}},
		{"last waiter cancelled", func(t *testing.T, e *env, k lease.Keys, _ string, w *waiter) {
			e.cancel(t, k, w.value)
		}},
	}
	for _, l := range leaves {
		t.Run(l.name, func(t *testing.T) {
			e := newEnv(t)
			k := keys(t)
			x, line := e.heldWithLine(t, k, "a")
			require.True(t, e.exists(t, k.Queue))
			l.leave(t, e, k, x, line[0])
			e.assertNoLine(t, k)
		})
	}
	t.Run("waiters stop calling", func(t *testing.T) {
		e := newEnv(t)
		e.srv.SkipUnless(t, redistest.ExpireTime) // the keys' absolute expiry, to the millisecond
		k := keys(t)
		x := lease.NewValue("x")
		e.mustAcquire(t, k, x)
		long := newWaiter("long", "room", fadeClaim)
		short := newWaiter("short", "room", fadeClaim/2)
		e.mustQueue(t, k, long, x, 0)
		e.mustQueue(t, k, short, x, 1) // a shorter window must not shorten the keys' life
		for _, key := range []string{k.Queue, k.Waiters} {
			expires := e.intReply(t, "PEXPIRETIME", key)
			for _, w := range []*waiter{long, short} {
				lapse := e.entry(t, k, w.value).lapse
				assert.GreaterOrEqual(t, expires, lapse-expiryAfter.Milliseconds(),
					"%s expires at %d ms, before %q's place lapses at %d ms", key, expires, w.value, lapse)
			}
			assert.LessOrEqual(t, e.pttl(t, key), fadeClaim, "PTTL of %s", key)
		}
		e.waitGone(t, k.Queue)
		e.waitGone(t, k.Waiters)
		assert.Equal(t, x, e.holder(t, k), "the holder's lease went with the line")
	})
}

// TestQueueWrongTypes: when the line's keys hold something other than
// distlock's types, a call that uses the line fails with an error and
// writes nothing, while a release still deletes the caller's lease.
func TestQueueWrongTypes(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(k lease.Keys) []string
		corrupt func(k lease.Keys) string
	}{
		{"queue is a string", func(k lease.Keys) []string { return []string{"SET", k.Queue, "junk"} }, nil},
		{"queue is a hash", func(k lease.Keys) []string { return []string{"HSET", k.Queue, "f", "1"} }, nil},
		{"waiters is a string", func(k lease.Keys) []string { return []string{"SET", k.Waiters, "junk"} }, nil},
		{"waiters is a sorted set", func(k lease.Keys) []string { return []string{"ZADD", k.Waiters, "1", "m"} }, nil},
	}
	calls := []struct {
		name string
		call func(ctx context.Context, e *env, k lease.Keys, value string) (lease.Grant, error)
	}{
		{"Acquire", func(ctx context.Context, e *env, k lease.Keys, value string) (lease.Grant, error) {
			return e.lc.Acquire(ctx, k, value, queueTTL)
		}},
		{"AcquireOrQueue", func(ctx context.Context, e *env, k lease.Keys, value string) (lease.Grant, error) {
			return e.lc.AcquireOrQueue(ctx, k, value, queueTTL, lease.Place{Claim: liveClaim, Room: "room"})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			k := keys(t)
			cmd := tt.setup(k)
			e.srv.MustDo(cmd...)
			typ, err := e.srv.MustDo("TYPE", cmd[1]).ToString()
			require.NoError(t, err)

			// The waiters hash is read only when someone is in line: a free
			// lease with an empty line is granted, a foreign hash
			// notwithstanding, without a round trip's worth of checks.
			if cmd[1] == k.Queue {
				for _, c := range calls {
					g, err := c.call(ctxFor(t), e, k, lease.NewValue("me"))
					require.Error(t, err, "%s on a free lease: got %+v, want an error", c.name, g)
					assert.Contains(t, err.Error(), "queue keys", "%s: error", c.name)
					assert.False(t, e.exists(t, k.Lease), "%s: a failed acquire wrote the lease", c.name)
					assert.False(t, e.exists(t, k.Fence), "%s: a failed acquire wrote the fencing key", c.name)
				}
			}

			x := lease.NewValue("x")
			e.srv.MustDo("SET", k.Lease, x, "PX", strconv.FormatInt(queueTTL.Milliseconds(), 10))
			for _, c := range calls[1:] { // Acquire on a held lease does not look at the line
				g, err := c.call(ctxFor(t), e, k, lease.NewValue("me"))
				require.Error(t, err, "%s on a held lease: got %+v, want an error", c.name, g)
				assert.Contains(t, err.Error(), "queue keys", "%s: error", c.name)
				assert.Equal(t, x, e.holder(t, k), "%s: a failed acquire touched the lease", c.name)
			}
			r, err := e.lc.Release(ctxFor(t), k, x)
			require.NoError(t, err, "Release with a corrupt line")
			assert.Equal(t, lease.Release{Deleted: true}, r, "Release with a corrupt line")
			assert.False(t, e.exists(t, k.Lease), "Release with a corrupt line kept the lease")

			e.srv.MustDo("SET", k.Lease, x, "PX", strconv.FormatInt(queueTTL.Milliseconds(), 10))
			r, err = e.lc.Cancel(ctxFor(t), k, x, queueTTL)
			require.NoError(t, err, "Cancel with a corrupt line")
			assert.Equal(t, lease.Release{Deleted: true}, r, "Cancel with a corrupt line")
			assert.False(t, e.exists(t, k.Lease), "Cancel with a corrupt line kept the lease")

			got, err := e.srv.MustDo("TYPE", cmd[1]).ToString()
			require.NoError(t, err)
			assert.Equal(t, typ, got, "the foreign key %s was changed", cmd[1])
		})
	}
}

// TestQueueReleaseWithForeignFence: a fencing key that is not a token (or
// not even a string) must not keep a holder from releasing: the release
// deletes the lease and passes nothing on.
func TestQueueReleaseWithForeignFence(t *testing.T) {
	for _, setup := range [][]string{{"SET", "", "soon"}, {"HSET", "", "f", "1"}} {
		t.Run(setup[0], func(t *testing.T) {
			e := newEnv(t)
			k := keys(t)
			x, _ := e.heldWithLine(t, k, "a")
			args := append([]string(nil), setup...)
			args[1] = k.Fence
			e.srv.MustDo("DEL", k.Fence)
			e.srv.MustDo(args...)

			r, err := e.lc.Release(ctxFor(t), k, x)
			require.NoError(t, err, "Release with a foreign fencing key")
			assert.Equal(t, lease.Release{Deleted: true}, r, "Release with a foreign fencing key: want deleted, not passed")
			assert.False(t, e.exists(t, k.Lease), "Release with a foreign fencing key kept the lease")
		})
	}
}

// TestQueueBadPlace: a Place that cannot be used is refused before anything
// is sent.
func TestQueueBadPlace(t *testing.T) {
	srv := redistest.Start(t)
	rc, sent := srv.CountingClient(t)
	lc := lease.New(rc)
	e := newEnvOn(srv)
	k := keys(t)
	require.NoError(t, rc.Do(ctxFor(t), rc.B().Ping().Build()).Error()) // connect first
	for _, p := range []lease.Place{
		{Claim: 0, Room: "room"},
		{Claim: time.Millisecond - 1, Room: "room"},
		{Claim: -time.Second, Room: "room"},
		{Claim: liveClaim},
		{Claim: liveClaim, Room: "room", Ticket: -1},
		{Claim: liveClaim, Room: "r oom"},
	} {
		before := sent.Load()
		g, err := lc.AcquireOrQueue(ctxFor(t), k, lease.NewValue("me"), queueTTL, p)
		require.ErrorIs(t, err, lease.ErrBadPlace, "AcquireOrQueue(%+v): got %+v", p, g)
		assert.Equal(t, lease.Grant{}, g)
		assert.Equal(t, before, sent.Load(), "AcquireOrQueue(%+v) sent commands", p)
	}
	assert.False(t, e.exists(t, k.Lease))
	e.assertNoLine(t, k)
}

// TestQueueOutOfMemory: under maxmemory with noeviction, acquiring a free
// lock fails with Redis's OOM error and writes nothing, and standing in
// line fails too; releasing, which frees memory, still works and passes the
// lease on.
func TestQueueOutOfMemory(t *testing.T) {
	e := &env{srv: redistest.Start(t, "--maxmemory-policy", "noeviction")}
	e.lc = lease.New(e.srv.Client())
	k := keys(t)
	x, y := lease.NewValue("x"), lease.NewValue("y")
	e.mustAcquire(t, k, x)
	a := newWaiter("a", "room", liveClaim)
	e.mustQueue(t, k, a, x, 0)
	free, err := lease.NewKeys("distlock-test", t.Name()+"-free")
	require.NoError(t, err)
	overMemoryLimit(t, e.srv)

	assertOOM := func(what string, g lease.Grant, err error) {
		t.Helper()
		require.Error(t, err, "%s at maxmemory: got %+v, want an error", what, g)
		assert.Contains(t, err.Error(), "OOM", "%s at maxmemory", what)
	}
	g, err := e.lc.Acquire(ctxFor(t), free, y, queueTTL)
	assertOOM("Acquire of a free lock", g, err)
	g, err = e.lc.AcquireOrQueue(ctxFor(t), free, y, queueTTL, lease.Place{Claim: liveClaim, Room: "room"})
	assertOOM("AcquireOrQueue of a free lock", g, err)
	for _, key := range []string{free.Lease, free.Fence, free.Queue, free.Waiters} {
		assert.False(t, e.exists(t, key), "a failed acquire wrote %s", key)
	}
	g, err = e.lc.AcquireOrQueue(ctxFor(t), k, y, queueTTL, lease.Place{Claim: liveClaim, Room: "room"})
	assertOOM("AcquireOrQueue of a held lock", g, err)
	assert.False(t, e.inLine(t, k, y), "a failed AcquireOrQueue stood in line")

	p := e.mustRelease(t, k, x)
	assert.Equal(t, a.value, p.Value, "Release at maxmemory: passed to")
}

// TestQueueCancelOutOfMemory: under maxmemory with noeviction, Cancel of
// a held lease, or of a lease passed to a waiter, deletes it and passes it
// on, as Release does: a waiter that gives up (or an acquire whose reply
// was lost) must not leave the lock held until the TTL ends.
func TestQueueCancelOutOfMemory(t *testing.T) {
	for _, passed := range []bool{false, true} {
		t.Run(fmt.Sprintf("passed=%v", passed), func(t *testing.T) {
			e := &env{srv: redistest.Start(t, "--maxmemory-policy", "noeviction")}
			e.lc = lease.New(e.srv.Client())
			k := keys(t)
			x, line := e.heldWithLine(t, k, "a", "b")
			a, b := line[0], line[1]
			holder, next := x, a.value
			if passed {
				require.Equal(t, a.value, e.mustRelease(t, k, x).Value)
				holder, next = a.value, b.value
			}
			overMemoryLimit(t, e.srv)

			r, err := e.lc.Cancel(ctxFor(t), k, holder, queueTTL)
			require.NoError(t, err, "Cancel of the holder at maxmemory")
			assert.True(t, r.Deleted, "Cancel of the holder at maxmemory: lease not deleted")
			assert.Equal(t, next, r.Passed.Value, "Cancel of the holder at maxmemory: passed to")
			assert.Equal(t, next, e.holder(t, k))
			assert.True(t, e.exists(t, k.Void(holder)), "Cancel at maxmemory did not void the value")
		})
	}
}

// overMemoryLimit sets the server's maxmemory to half what it uses now, so
// that it is over its limit (and never 0, which means no limit).
func overMemoryLimit(t *testing.T, srv *redistest.Server) {
	t.Helper()
	info, err := srv.Info("memory")
	require.NoError(t, err)
	used, err := strconv.ParseInt(info["used_memory"], 10, 64)
	require.NoError(t, err, "used_memory %q", info["used_memory"])
	require.Positive(t, used)
	srv.MustDo("CONFIG", "SET", "maxmemory", strconv.FormatInt(used/2, 10))
}

// TestQueueConcurrentWaiters: waiters that stand in line at the same time
// get distinct tickets and ranks, and are served in ticket order.
func TestQueueConcurrentWaiters(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	x := lease.NewValue("x")
	e.mustAcquire(t, k, x)
	const n = 8
	waiters := make([]*waiter, n)
	grants := make([]lease.Grant, n)
	errs := make([]error, n)
	ctx := ctxFor(t)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		waiters[i] = newWaiter(fmt.Sprint("w", i), "room", liveClaim)
		wg.Go(func() {
			<-start
			grants[i], errs[i] = e.lc.AcquireOrQueue(ctx, k, waiters[i].value, queueTTL, waiters[i].place)
		})
	}
	close(start)
	wg.Wait()

	byRank := make([]*waiter, n)
	for i, g := range grants {
		require.NoError(t, errs[i], "waiter %d", i)
		require.False(t, g.Acquired, "waiter %d was granted a held lease", i)
		require.True(t, g.Rank >= 0 && g.Rank < n, "waiter %d: rank %d", i, g.Rank)
		require.Nil(t, byRank[g.Rank], "waiters %v and %d got the same rank %d", byRank[g.Rank], i, g.Rank)
		byRank[g.Rank] = waiters[i]
		waiters[i].place.Ticket = g.Ticket
	}
	prev := x
	for r, w := range byRank {
		if r > 0 {
			assert.Greater(t, w.place.Ticket, byRank[r-1].place.Ticket, "ticket of rank %d", r)
		}
		assert.Equal(t, w.value, e.mustRelease(t, k, prev).Value, "release %d", r)
		prev = w.value
	}
	e.assertNoLine(t, k)
}

// TestQueueCluster runs the line on Redis Cluster: every script names the
// lease, fencing, queue, waiters keys and the wake channel, and Redis
// refuses the script unless they all share one slot; the pass is announced
// by sharded pub/sub.
func TestQueueCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	lc := lease.New(cl.Client())
	k := keys(t)
	e := &env{srv: cl.PrimaryOf(k.Lease), lc: lc}
	x := lease.NewValue("x")
	e.mustAcquire(t, k, x)
	a := newWaiter("a", "ra", liveClaim)
	b := newWaiter("b", "rb", liveClaim)
	e.mustQueue(t, k, a, x, 0)
	e.mustQueue(t, k, b, x, 1)
	heard := subscribe(t, lc, k, "ra")

	p := e.mustRelease(t, k, x)
	require.Equal(t, a.value, p.Value)
	assert.Equal(t, announcement{a.value, p.Token}, nextAnnouncement(t, heard, "ra"))
	g := e.queue(t, k, a)
	require.True(t, g.Acquired, "claim on the cluster: %+v", g)
	r, err := lc.Cancel(ctxFor(t), k, a.value, queueTTL)
	require.NoError(t, err)
	assert.Equal(t, b.value, r.Passed.Value, "Cancel on the cluster: passed to")
	e.assertNoLine(t, k)
	require.True(t, e.release(t, k, b.value))
}

// TestQueueNumbersAheadOfTheClock: a ticket in line, or a token in the
// fencing key, above the server's clock (a failover to a server whose clock
// is behind) is still followed: a newcomer's ticket comes after the last
// one in line, and a pass's token after the last one issued. Both the lean
// paths (a Mutex's string held, an exclusive waiter first in line) and the
// full ones must keep to it.
func TestQueueNumbersAheadOfTheClock(t *testing.T) {
	const ahead = int64(1) << 52 // µs: more than a century past the clock
	e := newEnv(t)
	k := keys(t)
	x := lease.NewValue("x")
	require.True(t, e.acquire(t, k, x, queueTTL).Acquired)

	a := newWaiter("a", "room", liveClaim)
	a.place.Ticket = ahead
	e.mustQueue(t, k, a, x, 0)
	require.Equal(t, ahead, a.place.Ticket, "a's ticket: the one it brought")
	b := newWaiter("b", "room", liveClaim)
	e.mustQueue(t, k, b, x, 1)
	assert.Equal(t, ahead+1, b.place.Ticket, "b's ticket: want the one after the tail")

	e.srv.MustDo("SET", k.Fence, strconv.FormatInt(ahead, 10))
	p := e.mustRelease(t, k, x)
	assert.Equal(t, a.value, p.Value)
	assert.Equal(t, ahead+1, p.Token, "the pass's token: want the one after the fencing key's")
	assert.Equal(t, ahead+1, e.fence(t, k))
	e.assertTTL(t, k.Fence, lease.FenceRetention)
	p = e.mustRelease(t, k, a.value)
	assert.Equal(t, b.value, p.Value)
	assert.Equal(t, ahead+2, p.Token)
}
