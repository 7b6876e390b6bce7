package lease_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// staleFaces are the faces that stand in line, each with the keys its
// waiter (w) and the other callers use.
var staleFaces = []struct {
	name string
	keys func(lease.Keys) lease.Keys
}{
	{"mutex", func(k lease.Keys) lease.Keys { return k }},
	{"election", func(k lease.Keys) lease.Keys { return k.Election() }},
	{"writer", func(k lease.Keys) lease.Keys { return k.RW(lease.Write) }},
	{"reader behind a writer", func(k lease.Keys) lease.Keys { return k.RW(lease.Read) }},
	{"semaphore", func(k lease.Keys) lease.Keys { return k.Semaphore(1) }},
}

// TestStaleCallGrantsNothing: a call of an acquisition that reaches Redis
// after the grant it led to was used and ended (a path that held the
// request and delivered it late) is refused: it is not granted the lock
// anew, and it does not stand in line again, whether the lock is free or
// another holds it. The acquisition's own later calls, which bring the
// token they saw, still work, and a waiter whose place merely lapsed
// stands in line again with its ticket.
func TestStaleCallGrantsNothing(t *testing.T) {
	for _, f := range staleFaces {
		t.Run(f.name, func(t *testing.T) {
			e := newEnv(t)
			base := keys(t)
			k := f.keys(base)
			// The other callers: exclusive ones for a read-write lock, so
			// that a reader waits behind them.
			other := k
			if k.Mode != 0 {
				other = base.RW(lease.Write)
			}

			x := lease.NewValue("x")
			e.mustAcquire(t, other, x)
			w := newWaiter("w", "room", liveClaim)
			g := e.queue(t, k, w)
			require.False(t, g.Acquired, "w behind x: got %+v, want it in line", g)
			require.Equal(t, 0, g.Rank, "w's rank behind x")
			// The refresh that the path will hold: sent now, with what w
			// had seen so far.
			late := w.place
			late.Seen = g.Fence

			r := e.releaseAll(t, other, x)
			require.Len(t, r.Passes(), 1, "x's release: got %+v, want the lock passed to w", r)
			require.Equal(t, w.value, r.Passes()[0].Value, "x's release passed the lock to")
			passed := r.Passes()[0].Token
			require.True(t, e.releaseAll(t, k, w.value).Deleted, "w's release of the lock passed to it")

			// c takes the lock and gives it back: the lock was held by
			// another after w.
			c := lease.NewValue("c")
			ct := e.mustAcquire(t, other, c)
			require.Greater(t, ct, passed, "c's token")
			require.True(t, e.release(t, other, c), "c's release")

			// The held refresh lands on a free lock.
			got, err := e.lc.AcquireOrQueue(ctxFor(t), k, w.value, queueTTL, late)
			require.NoError(t, err, "the late refresh")
			assert.False(t, got.Acquired, "the late refresh on a free lock: got %+v, want it refused", got)
			assert.Equal(t, -1, got.Rank, "the late refresh's rank: want -1 (not in line)")
			assert.Equal(t, ct, got.Fence, "the late refresh's fence: want c's token")
			assert.False(t, e.exists(t, k.Lease), "the late refresh left a lease")
			assert.False(t, e.inLine(t, k, w.value), "the late refresh put w back in line")

			// The same while d holds the lock: w does not stand in line,
			// so d's release passes it to nobody.
			d := lease.NewValue("d")
			e.mustAcquire(t, other, d)
			got, err = e.lc.AcquireOrQueue(ctxFor(t), k, w.value, queueTTL, late)
			require.NoError(t, err, "the late refresh behind d")
			assert.False(t, got.Acquired, "the late refresh behind d: got %+v", got)
			assert.Equal(t, -1, got.Rank, "the late refresh behind d: rank")
			assert.False(t, e.inLine(t, k, w.value), "the late refresh behind d put w in line")
			assert.Empty(t, e.releaseAll(t, other, d).Passes(), "d's release passed the lock to the late refresh")

			// A call that brings the token it saw last is no stale call:
			// w, with the fence of its refused call, gets the free lock.
			fresh := late
			fresh.Seen = got.Fence
			got, err = e.lc.AcquireOrQueue(ctxFor(t), k, w.value, queueTTL, fresh)
			require.NoError(t, err, "w's call with the fence it saw")
			assert.True(t, got.Acquired, "w's call with the fence it saw, on a free lock: got %+v", got)
		})
	}
}

// TestStaleCallLapsedPlaceComesBack: a waiter whose place lapsed while the
// lock changed hands is refused once (its call looks like a late one), and
// stands in line again with its ticket when it calls with the fence of
// that reply, ahead of those who came after it.
func TestStaleCallLapsedPlaceComesBack(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	x, a, b := e.firstCallsAgain(t, k, shortClaim)
	seen := e.intReply(t, "GET", k.Fence)
	e.waitLapsed(t, k, a.value)
	require.Equal(t, b.value, e.mustRelease(t, k, x).Value, "the lapsed waiter was not skipped")
	c := newWaiter("c", "room", liveClaim)
	e.mustQueue(t, k, c, b.value, 0)

	ticket := a.place.Ticket
	a.place.Claim = liveClaim
	a.place.Seen = seen
	g := e.queue(t, k, a)
	require.False(t, g.Acquired, "a, lapsed, after b was passed the lock: got %+v", g)
	require.Equal(t, -1, g.Rank, "a's call with the fence it saw before b's grant: want it refused")
	require.Greater(t, g.Fence, seen, "the refusal's fence")
	assert.False(t, e.inLine(t, k, a.value), "the refused call put a in line")

	a.place.Seen = g.Fence
	e.mustQueue(t, k, a, b.value, 0)
	assert.Equal(t, ticket, a.place.Ticket, "a's ticket after it came back")
	e.mustQueue(t, k, c, b.value, 1)
}
