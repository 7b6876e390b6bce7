package goredis_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/goredis"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// ackTimeout is WAIT's timeout in the tests whose replicas are in sync: long
// enough for a slow machine's replica to acknowledge, short enough for the
// tests whose replicas cannot.
const ackTimeout = 2 * time.Second

// TestReplicaAckSingleNode runs locks with WithReplicaAck on a primary with
// one replica: one replica acknowledges (the lock is granted, renewed and
// released), two cannot (the acquisition is refused with ErrNotReplicated
// and undone, so the lock is free afterwards).
func TestReplicaAckSingleNode(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary, primary.Addr())
	rdb := newClient(t, primary.Addr())
	ctx := ctxFor(t, 3*callTimeout)

	m, err := goredis.NewMutex(rdb, "ack-single", distlock.WithReplicaAck(1, time.Second), distlock.WithTTL(6*time.Second))
	require.NoError(t, err)
	before := cmdStat(t, primary, "wait", "calls")
	g, err := m.TryLock(ctx)
	require.NoError(t, err, "one replica acknowledges")
	// Held past a renewal (a third of the TTL), which waits for the replica too.
	eventually(t, settleTimeout, func() (bool, string) {
		n := cmdStat(t, primary, "wait", "calls") - before
		return n >= 2, "WAIT sent " + itoa64(n) + " times, want the acquisition's and a renewal's"
	})
	require.Equal(t, distlock.Acquired, g.State())
	st, err := g.Release(ctx)
	require.NoError(t, err)
	require.Equal(t, distlock.Released, st)

	two, err := goredis.NewMutex(rdb, "ack-single", distlock.WithReplicaAck(2, 100*time.Millisecond))
	require.NoError(t, err)
	_, err = two.TryLock(ctx)
	if !errors.Is(err, lease.ErrNotReplicated) {
		t.Fatalf("TryLock with 2 replicas asked of 1: err = %v, want one matching lease.ErrNotReplicated", err)
	}
	var ackErr *lease.AckError
	require.True(t, errors.As(err, &ackErr), "err = %v", err)
	assert.Equal(t, 1, ackErr.Got, "replicas that acknowledged")
	assert.NoError(t, ackErr.Err, "WAIT gave a count")

	g, err = m.TryLock(ctx)
	require.NoError(t, err, "the unacknowledged acquisition was undone")
	_, _ = g.Release(ctx)
}

// TestReplicaAckLongerThanReadTimeout checks WAIT's timeout against the
// client's ReadTimeout: go-redis reads a pipeline under ReadTimeout, so a
// WAIT of three times as long, on a replica that does not answer, must
// still come back with WAIT's count (0), not a read timeout.
func TestReplicaAckLongerThanReadTimeout(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary, primary.Addr())
	const readTimeout = 300 * time.Millisecond
	rdb := newClient(t, primary.Addr(), &redis.Options{ReadTimeout: readTimeout})
	ctx := ctxFor(t, callTimeout)

	m, err := goredis.NewMutex(rdb, "ack-read-timeout", distlock.WithReplicaAck(1, 3*readTimeout))
	require.NoError(t, err)
	replica.Pause()
	defer replica.Resume()
	start := time.Now()
	_, err = m.TryLock(ctx)
	waited := time.Since(start)
	var ackErr *lease.AckError
	require.True(t, errors.As(err, &ackErr), "err = %v, want an *lease.AckError", err)
	assert.NoError(t, ackErr.Err, "WAIT's count arrived (no read timeout)")
	assert.Equal(t, 0, ackErr.Got)
	assert.GreaterOrEqual(t, waited, 3*readTimeout, "Redis waited WAIT's whole timeout")
}

// TestReplicaAckRing checks that WithReplicaAck on a client that cannot say
// which connection made a write (a Ring) fails with ErrNoReplicaAck, while
// a lock without it works on the same Ring.
func TestReplicaAckRing(t *testing.T) {
	srv := redistest.Start(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": srv.Addr()}})
	t.Cleanup(func() { _ = ring.Close() })
	ctx := ctxFor(t, callTimeout)

	m, err := goredis.NewMutex(ring, "ring", distlock.WithReplicaAck(1, 100*time.Millisecond))
	require.NoError(t, err)
	_, err = m.TryLock(ctx)
	if !errors.Is(err, goredis.ErrNoReplicaAck) {
		t.Fatalf("TryLock with WithReplicaAck on a Ring: err = %v, want one matching goredis.ErrNoReplicaAck", err)
	}

	plain, err := goredis.NewMutex(ring, "ring")
	require.NoError(t, err)
	g, err := plain.TryLock(ctx)
	require.NoError(t, err, "a Ring serves a lock without WithReplicaAck")
	_, _ = g.Release(ctx)
}

// TestReplicaAckCluster runs WithReplicaAck on a cluster of three primaries
// with a replica each, and then follows the lock's slot through a
// migration: while the slot migrates, the old primary answers the script
// with ASK, and the adapter sends ASKING, the script and WAIT to the new
// one, whose replica acknowledges; after the migration, the cluster
// client's stale layout sends the script to the old primary, which answers
// MOVED, and the adapter follows it.
func TestReplicaAckCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	cc := newClusterClient(t, c)
	ctx := ctxFor(t, 6*callTimeout)

	m, err := goredis.NewMutex(cc, "ack-cluster", distlock.WithReplicaAck(1, ackTimeout))
	require.NoError(t, err)
	g, err := m.Lock(ctx)
	require.NoError(t, err)
	_, err = g.Release(ctx)
	require.NoError(t, err)

	lc, err := lease.NewOn(goredis.NewRedis(cc), lease.Ack{Replicas: 1, Timeout: ackTimeout})
	require.NoError(t, err)
	k, err := lease.NewKeys(distlock.DefaultNamespace, "ack-migrating")
	require.NoError(t, err)
	value := lease.NewValue("t")
	const ttl = time.Minute
	grant, err := lc.Acquire(ctx, k, value, ttl)
	require.NoError(t, err)
	require.True(t, grant.Acquired, "%+v", grant)

	slot := c.Slot(k.Lease)
	from := c.PrimaryOf(k.Lease)
	to := c.Primaries()[slices.IndexFunc(c.Primaries(), func(p *redistest.Server) bool { return p != from })]
	mig := c.StartMigration(slot, to)
	keys, err := from.MustDo("CLUSTER", "GETKEYSINSLOT", itoa64(int64(slot)), "100").AsStrSlice()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	mig.Move(keys...)

	asking := cmdStat(t, to, "asking", "calls")
	r, err := lc.Renew(ctx, k, value, ttl)
	require.NoError(t, err, "renewal during the migration, acknowledged by the new primary's replica")
	require.True(t, r.OK, "%+v", r)
	assert.Greater(t, cmdStat(t, to, "asking", "calls"), asking, "ASKING sent to the importing primary")

	mig.Finish()
	rejected := cmdStat(t, from, "evalsha", "rejected_calls")
	waits := cmdStat(t, to, "wait", "calls")
	r, err = lc.Renew(ctx, k, value, ttl)
	require.NoError(t, err, "renewal after the migration")
	require.True(t, r.OK, "%+v", r)
	assert.Greater(t, cmdStat(t, from, "evalsha", "rejected_calls"), rejected, "the old primary answered MOVED")
	assert.Greater(t, cmdStat(t, to, "wait", "calls"), waits, "WAIT sent to the new primary")

	_, err = lc.Release(ctx, k, value)
	require.NoError(t, err)
}
