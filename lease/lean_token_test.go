package lease_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// TestLeanGrantPutsBackTheFence: the lock's lean grants write the token
// to the fencing key in the call that reads it (SET ... GET); a call that
// then grants nothing leaves the key as it found it. A late call (one that
// brings a seen token) on a free lock is checked before any write, so the
// key's TTL is not touched either; a release whose first in line has
// lapsed puts back the token it had written over, and passes to nobody.
func TestLeanGrantPutsBackTheFence(t *testing.T) {
	t.Run("stale call on a free lock", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		const last = "5000000000000000"
		e.srv.MustDo("SET", k.Fence, last, "PX", "60000")
		w := lease.NewValue("w")
		g, err := e.lc.AcquireOrQueue(ctxFor(t), k, w, ttl, lease.Place{Claim: time.Second, Room: "room", Seen: 5})
		require.NoError(t, err)
		assert.False(t, g.Acquired, "a call that saw token 5 after 5e15 was issued: got %+v, want refused", g)
		assert.Equal(t, -1, g.Rank)
		got, _ := e.get(t, k.Fence)
		assert.Equal(t, last, got, "the fencing key after a refused call")
		assert.LessOrEqual(t, e.pttl(t, k.Fence), time.Minute, "the refused call renewed the fencing key's TTL: it wrote it")
		assert.False(t, e.exists(t, k.Lease), "the refused call left a lease")
	})
	t.Run("release whose first in line lapsed", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		a := lease.NewValue("a")
		token := e.mustAcquire(t, k, a)
		w := lease.NewValue("w")
		g, err := e.lc.AcquireOrQueue(ctxFor(t), k, w, ttl, lease.Place{Claim: time.Minute, Room: "room"})
		require.NoError(t, err)
		require.Equal(t, 0, g.Rank, "w behind a: got %+v", g)
		// w's place lapsed long ago (its entry says so), while the line's
		// keys last: w died, and others came and left.
		e.srv.MustDo("HSET", k.Waiters, w, "1 60000 room")
		r, err := e.lc.Release(ctxFor(t), k, a)
		require.NoError(t, err)
		assert.True(t, r.Deleted, "a's release")
		assert.Empty(t, r.Passes(), "a's release passed the lock to a lapsed place")
		got, _ := e.get(t, k.Fence)
		assert.Equal(t, strconv.FormatInt(token, 10), got, "the fencing key after a release that passed nothing: want a's token")
		assert.False(t, e.exists(t, k.Lease), "the lease after a's release")
	})
	t.Run("clock behind the last token", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		const last = "8000000000000000" // far past the server's clock in µs
		e.srv.MustDo("SET", k.Fence, last, "PX", "60000")
		a := lease.NewValue("a")
		token := e.mustAcquire(t, k, a)
		assert.Equal(t, int64(8000000000000001), token, "the token after %s", last)
		got, _ := e.get(t, k.Fence)
		assert.Equal(t, "8000000000000001", got, "the fencing key after the grant")
		b := lease.NewValue("b")
		g, err := e.lc.AcquireOrQueue(ctxFor(t), k, b, ttl, lease.Place{Claim: time.Minute, Room: "room"})
		require.NoError(t, err)
		require.False(t, g.Acquired)
		r, err := e.lc.Release(ctxFor(t), k, a)
		require.NoError(t, err)
		require.Len(t, r.Passes(), 1, "a's release: got %+v", r)
		assert.Equal(t, int64(8000000000000002), r.Passed.Token, "the pass's token")
		got, _ = e.get(t, k.Fence)
		assert.Equal(t, "8000000000000002", got, "the fencing key after the pass")
	})
}
