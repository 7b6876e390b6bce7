package lease_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// setOf returns the keys of n locks unique to the test, in the order a set
// takes them.
func setOf(t *testing.T, n int) []lease.Keys {
	t.Helper()
	ks := make([]lease.Keys, n)
	for i := range ks {
		k, err := lease.NewKeys("distlock-test", fmt.Sprintf("%s-%d", t.Name(), i))
		require.NoError(t, err)
		ks[i] = k
	}
	require.NoError(t, lease.SortSet(ks))
	return ks
}

func TestAcquireAllFree(t *testing.T) {
	e := newEnv(t)
	ks := setOf(t, 3)
	v := lease.NewValue("set")
	g, err := e.lc.AcquireAll(ctxFor(t), ks, v, queueTTL, nil)
	require.NoError(t, err)
	require.Equal(t, 3, g.Held, "got %+v, want all three held", g)
	for i, k := range ks {
		assert.Equal(t, v, e.holder(t, k), "lock %d", i)
		assert.Greater(t, e.pttl(t, k.Lease), queueTTL-time.Second, "lock %d's lease", i)
		assert.Positive(t, g.Tokens[i], "lock %d's token", i)
		fence, _ := e.get(t, k.Fence)
		assert.Equal(t, fmt.Sprint(g.Tokens[i]), fence, "lock %d's fencing key", i)
	}
	// Asking again keeps the tokens, as a lock's acquire does.
	again, err := e.lc.AcquireAll(ctxFor(t), ks, v, queueTTL, nil)
	require.NoError(t, err)
	assert.Equal(t, g.Tokens, again.Tokens)

	rs, err := e.lc.ReleaseAll(ctxFor(t), ks, v)
	require.NoError(t, err)
	require.Len(t, rs, 3)
	for i, k := range ks {
		assert.True(t, rs[i].Deleted, "lock %d deleted", i)
		assert.Empty(t, e.holder(t, k), "lock %d after the release", i)
	}
}

// A single attempt that meets a held lock gives back the ones before it;
// one that stands in line keeps them for its claim window.
func TestAcquireAllBlocked(t *testing.T) {
	e := newEnv(t)
	ks := setOf(t, 3)
	x := lease.NewValue("x")
	e.mustAcquire(t, ks[1], x)
	v := lease.NewValue("set")

	g, err := e.lc.AcquireAll(ctxFor(t), ks, v, queueTTL, nil)
	require.NoError(t, err)
	assert.Equal(t, 0, g.Held)
	assert.Equal(t, 1, g.Stopped, "a single attempt says where it stopped")
	assert.Equal(t, x, g.Blocked.Holder)
	assert.Equal(t, -1, g.Blocked.Rank)
	assert.Empty(t, e.holder(t, ks[0]), "a single attempt left the first lock held")
	assert.Empty(t, e.holder(t, ks[2]))

	w := newWaiter("set", "room", liveClaim)
	g, err = e.lc.AcquireAll(ctxFor(t), ks, w.value, queueTTL, &w.place)
	require.NoError(t, err)
	assert.Equal(t, 1, g.Held)
	assert.Equal(t, 1, g.Stopped)
	assert.Equal(t, x, g.Blocked.Holder)
	assert.Equal(t, 0, g.Blocked.Rank)
	assert.Positive(t, g.Blocked.Ticket)
	assert.Equal(t, w.value, e.holder(t, ks[0]))
	assert.LessOrEqual(t, e.pttl(t, ks[0].Lease), liveClaim, "the lock held while waiting keeps only the claim window")
	assert.True(t, e.inLine(t, ks[1], w.value))
	assert.Empty(t, e.holder(t, ks[2]), "the lock after the one it waits for was touched")

	// x's release passes ks[1] to the set's value, as to any waiter.
	p := e.mustRelease(t, ks[1], x)
	assert.Equal(t, w.value, p.Value)
	w.place.Ticket = g.Blocked.Ticket
	g, err = e.lc.AcquireAll(ctxFor(t), ks, w.value, queueTTL, &w.place)
	require.NoError(t, err)
	require.Equal(t, 3, g.Held)
	assert.Equal(t, 3, g.Stopped)
	assert.Equal(t, p.Token, g.Tokens[1], "the passed lock keeps its grant's token")
	for i, k := range ks {
		assert.Greater(t, e.pttl(t, k.Lease), liveClaim, "lock %d is held for the TTL", i)
	}
}

// A release of a set passes each lock to its own line, and a Cancel voids
// the value on each.
func TestReleaseAllPasses(t *testing.T) {
	e := newEnv(t)
	ks := setOf(t, 2)
	v := lease.NewValue("set")
	_, err := e.lc.AcquireAll(ctxFor(t), ks, v, queueTTL, nil)
	require.NoError(t, err)
	a := newWaiter("a", "room-a", liveClaim)
	e.mustQueue(t, ks[1], a, v, 0)
	rs, err := e.lc.CancelAll(ctxFor(t), ks, v, queueTTL)
	require.NoError(t, err)
	assert.True(t, rs[0].Deleted)
	assert.Empty(t, rs[0].Passed.Value)
	assert.True(t, rs[1].Deleted)
	assert.Equal(t, a.value, rs[1].Passed.Value)
	assert.Equal(t, "room-a", rs[1].Passed.Room)
	assert.Equal(t, a.value, e.holder(t, ks[1]))
	// Voided: a late acquire with the value is refused on every lock.
	g, err := e.lc.AcquireAll(ctxFor(t), ks[:1], v, queueTTL, nil)
	require.NoError(t, err)
	assert.Equal(t, 0, g.Held)
}

func TestAcquireAllBadSets(t *testing.T) {
	e := newEnv(t)
	ks := setOf(t, 2)
	v := lease.NewValue("set")
	sem := ks[1].Semaphore(2)
	for name, set := range map[string][]lease.Keys{
		"empty":     nil,
		"twice":     {ks[0], ks[0]},
		"semaphore": {ks[0], sem},
		"election":  {ks[0], ks[1].Election()},
		"too many":  make([]lease.Keys, lease.MaxSet+1),
	} {
		_, err := e.lc.AcquireAll(ctxFor(t), set, v, queueTTL, nil)
		assert.ErrorIs(t, err, lease.ErrBadSet, name)
		_, err = e.lc.ReleaseAll(ctxFor(t), set, v)
		assert.ErrorIs(t, err, lease.ErrBadSet, name)
	}
	assert.ErrorIs(t, lease.SortSet([]lease.Keys{ks[1], ks[0], ks[1]}), lease.ErrBadSet)
	assert.Empty(t, e.holder(t, ks[0]))

	// A lock whose key holds something else stops the set, and the locks
	// granted before it are given back.
	e.srv.MustDo("HSET", ks[1].Lease, "f", "v")
	_, err := e.lc.AcquireAll(ctxFor(t), ks, v, queueTTL, nil)
	require.Error(t, err)
	assert.Empty(t, e.holder(t, ks[0]))

	// A semaphore's key in a set is the wrong kind, named as such.
	e.srv.MustDo("DEL", ks[1].Lease)
	_, err = e.lc.Acquire(ctxFor(t), ks[1].Semaphore(2), lease.NewValue("sem"), queueTTL)
	require.NoError(t, err)
	_, err = e.lc.AcquireAll(ctxFor(t), ks, v, queueTTL, nil)
	var wk *lease.WrongKindError
	require.ErrorAs(t, err, &wk)
	assert.Equal(t, ks[1].Lease, wk.Key)
	assert.Equal(t, "semaphore", wk.Found)
	assert.Empty(t, e.holder(t, ks[0]), "a set that met a semaphore kept the lock before it")
}

// A single attempt refused issues no token and makes no fencing key for a
// free lock (issue 32): it tries the locks that are not free first. A lock
// that holds the value already is granted again with its token, and given
// back when a later one is refused; a set whose only non-free lock holds
// the value is granted whole.
func TestAcquireAllSingleAttemptTouchesNoFreeLock(t *testing.T) {
	e := newEnv(t)
	ks := setOf(t, 4)
	x := lease.NewValue("x")
	e.mustAcquire(t, ks[2], x)
	v := lease.NewValue("set")

	for range 2 {
		g, err := e.lc.AcquireAll(ctxFor(t), ks, v, queueTTL, nil)
		require.NoError(t, err)
		assert.Equal(t, 0, g.Held)
		assert.Equal(t, 2, g.Stopped, "the attempt names the held lock")
		assert.Equal(t, x, g.Blocked.Holder)
		for _, i := range []int{0, 1, 3} {
			assert.False(t, e.exists(t, ks[i].Fence), "lock %d, free, has a fencing key", i)
			assert.Empty(t, e.holder(t, ks[i]), "lock %d", i)
		}
	}

	// ks[1] holds the value already (an attempt whose reply was lost): it
	// is given back with the rest when ks[2] is refused.
	e.mustAcquire(t, ks[1], v)
	g, err := e.lc.AcquireAll(ctxFor(t), ks, v, queueTTL, nil)
	require.NoError(t, err)
	assert.Equal(t, 2, g.Stopped)
	assert.Empty(t, e.holder(t, ks[1]), "the lock the value held before the refused attempt")
	assert.False(t, e.exists(t, ks[0].Fence), "lock 0, free, has a fencing key")

	// Once ks[2] is free, a lock the value holds keeps its token.
	require.True(t, e.release(t, ks[2], x))
	own := e.mustAcquire(t, ks[1], v)
	g, err = e.lc.AcquireAll(ctxFor(t), ks, v, queueTTL, nil)
	require.NoError(t, err)
	require.Equal(t, 4, g.Held)
	assert.Equal(t, own, g.Tokens[1], "the token of the lock the value held")
	for i, k := range ks {
		assert.Equal(t, v, e.holder(t, k), "lock %d", i)
	}
}
