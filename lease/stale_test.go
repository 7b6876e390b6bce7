package lease_test

import (
	"fmt"
	"slices"
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

// TestStaleSetCallGrantsNothing: a set's call that reaches Redis after
// the set it belonged to held its locks and released them is refused, as
// a Mutex's is (TestStaleCallGrantsNothing), whether it waited at the
// set's first lock or held that one and waited at the next: it grants no
// lock anew and stands in no line. The locks the call found held by the
// set carry its grant's token less one (Place.SetSeen), so that even a
// lock nobody took since is not granted again.
func TestStaleSetCallGrantsNothing(t *testing.T) {
	for _, waitAt := range []int{0, 1} {
		t.Run(fmt.Sprintf("waits at lock %d", waitAt), func(t *testing.T) {
			e := newEnv(t)
			ks := setOf(t, 2)
			x := lease.NewValue("x")
			e.mustAcquire(t, ks[waitAt], x)
			w := newWaiter("set", "room", liveClaim)
			g, err := e.lc.AcquireAll(ctxFor(t), ks, w.value, queueTTL, &w.place)
			require.NoError(t, err, "the set's first call")
			require.Equal(t, waitAt, g.Held, "the set's first call: got %+v", g)
			require.Equal(t, 0, g.Blocked.Rank, "the set's rank behind x")
			w.place.Ticket = g.Blocked.Ticket
			// The refresh that the path will hold, with what the set knew.
			late := w.place
			late.SetSeen = make([]int64, len(ks))
			for i := range g.Held {
				late.SetSeen[i] = g.Tokens[i] - 1
			}
			late.SetSeen[waitAt] = g.Blocked.Fence

			// x passes the lock to the set, which claims it and releases
			// the whole set; c holds the lock it waited for, after it.
			passed := e.mustRelease(t, ks[waitAt], x)
			require.Equal(t, w.value, passed.Value, "x's release passed the lock to")
			claim := w.place
			claim.SetSeen = slices.Clone(late.SetSeen)
			claim.SetSeen[waitAt] = passed.Token
			g, err = e.lc.AcquireAll(ctxFor(t), ks, w.value, queueTTL, &claim)
			require.NoError(t, err, "the set's claim")
			require.Equal(t, len(ks), g.Held, "the set's claim: got %+v", g)
			rs, err := e.lc.ReleaseAll(ctxFor(t), ks, w.value)
			require.NoError(t, err, "the set's release")
			for i, r := range rs {
				require.True(t, r.Deleted, "the set's release of lock %d", i)
			}
			c := lease.NewValue("c")
			e.mustAcquire(t, ks[waitAt], c)
			require.True(t, e.release(t, ks[waitAt], c), "c's release")

			got, err := e.lc.AcquireAll(ctxFor(t), ks, w.value, queueTTL, &late)
			require.NoError(t, err, "the late call")
			assert.Equal(t, 0, got.Held, "the late call: got %+v, want nothing granted", got)
			assert.Equal(t, 0, got.Stopped, "the late call stopped at")
			assert.Equal(t, -1, got.Blocked.Rank, "the late call's rank: want -1 (refused)")
			for i, k := range ks {
				assert.Empty(t, e.holder(t, k), "the late call left lock %d held", i)
				assert.False(t, e.inLine(t, k, w.value), "the late call put the set in the line of lock %d", i)
			}

			// A call that brings the fence of that refusal is a live one:
			// it gets the free set.
			fresh := late
			fresh.SetSeen = []int64{got.Blocked.Fence}
			got, err = e.lc.AcquireAll(ctxFor(t), ks, w.value, queueTTL, &fresh)
			require.NoError(t, err, "the call with the fence it saw")
			assert.Equal(t, len(ks), got.Held, "the call with the fence it saw: got %+v", got)
		})
	}
}

// TestAcquireAllBadSeen: a set's seen tokens are checked before anything
// is sent.
func TestAcquireAllBadSeen(t *testing.T) {
	e := newEnv(t)
	ks := setOf(t, 2)
	w := newWaiter("set", "room", liveClaim)
	for _, seen := range [][]int64{{1, 2, 3}, {-1}} {
		p := w.place
		p.SetSeen = seen
		_, err := e.lc.AcquireAll(ctxFor(t), ks, w.value, queueTTL, &p)
		assert.ErrorIs(t, err, lease.ErrBadPlace, "seen %v", seen)
	}
	for i, k := range ks {
		assert.False(t, e.exists(t, k.Lease), "lock %d after the refused calls", i)
	}
}
