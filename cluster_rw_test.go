package distlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// clusterRWMutex runs a read-write lock on the cluster cl (of
// TestClusterSemaphoreAndElection): its keys and wake channels share one
// slot, and every script (acquire, release passing to a run of readers,
// downgrade) runs there without CROSSSLOT; the grants reach waiters of
// another client through sharded pub/sub on the slot's primary.
func clusterRWMutex(t *testing.T, cl *redistest.Cluster) {
	const name = "config"
	k, err := lease.NewKeys(distlock.DefaultNamespace, name)
	require.NoError(t, err)
	slot := cl.Slot(k.Lease)
	for _, key := range []string{k.Fence, k.Queue, k.Waiters, k.WakeChannel("room"), k.Void("v#1")} {
		assert.Equal(t, slot, cl.Slot(key), "slot of %s", key)
	}
	owner := cl.PrimaryOf(k.Lease)
	newRW := func() *distlock.RWMutex {
		rw, err := distlock.NewRWMutex(cl.Client(), name, distlock.WithTTL(longTTL))
		require.NoError(t, err)
		return rw
	}
	writer, readers := newRW(), newRW()

	w, err := writer.Lock(t.Context())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	got := make(chan *distlock.Guard, 2)
	for range 2 {
		wg.Go(func() {
			g, err := readers.RLock(ctx)
			if assert.NoError(t, err, "RLock in line") {
				got <- g
			}
		})
	}
	clusterWaitLine(t, owner, k.Queue, 2)
	assert.ElementsMatch(t, []string{k.Lease, k.Fence, k.Queue, k.Waiters}, keysOn(t, owner, k.Lease+"*"),
		"keys on the slot's primary")
	for _, p := range cl.Primaries() {
		if p != owner {
			assert.Empty(t, keysOn(t, p, k.Lease+"*"), "keys of %s on %s", k.Lease, p.Addr())
		}
	}
	// The downgrade grants both readers at once, in the script.
	require.NoError(t, w.Downgrade(t.Context()))
	var rs []*distlock.Guard
	for range 2 {
		select {
		case g := <-got:
			assert.Greater(t, g.Token(), w.Token())
			rs = append(rs, g)
		case <-time.After(eventually):
			t.Fatal("a reader in line was not granted at the downgrade")
		}
	}
	_, err = writer.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "a writer while three read")
	for _, g := range append(rs, w) {
		assert.Equal(t, distlock.Released, release(t, g))
	}
	assert.Equal(t, []string{k.Fence}, keysOn(t, owner, k.Lease+"*"), "keys left after the last release: the fencing key alone")
}
