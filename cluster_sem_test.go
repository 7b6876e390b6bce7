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

// TestClusterSemaphoreAndElection runs a semaphore and an election on a
// Redis Cluster of three primaries, built by redis-cli --cluster create
// and shared by the subtests. Each client stands for a process. Every
// script names keys of one slot, and writes or publishes on others of it
// (the limit record, the leader channel), so a key outside the slot would
// fail with CROSSSLOT or a redirection.
func TestClusterSemaphoreAndElection(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)

	t.Run("KeysShareASlot", func(t *testing.T) {
		k, err := lease.NewKeys(distlock.DefaultNamespace, "pool")
		require.NoError(t, err)
		slot := cl.Slot(k.Lease)
		for _, key := range []string{k.Fence, k.Queue, k.Waiters, k.WakeChannel("room"), k.Leader, k.Limit, k.Void("v#1")} {
			assert.Equal(t, slot, cl.Slot(key), "slot of %s", key)
		}
	})

	t.Run("Semaphore", func(t *testing.T) {
		const name = "pool"
		k, err := lease.NewKeys(distlock.DefaultNamespace, name)
		require.NoError(t, err)
		newSem := func() *distlock.Semaphore {
			s, err := distlock.NewSemaphore(cl.Client(), name, 2, distlock.WithTTL(longTTL))
			require.NoError(t, err)
			return s
		}
		holder, other := newSem(), newSem()
		owner := cl.PrimaryOf(k.Lease)

		var held []*distlock.Guard
		var last int64
		for range 2 {
			g, err := holder.TryAcquire(t.Context())
			require.NoError(t, err)
			assert.Greater(t, g.Token(), last, "token of a grant")
			last = g.Token()
			held = append(held, g)
		}
		_, err = other.TryAcquire(t.Context())
		var nae *distlock.NotAcquiredError
		require.ErrorAs(t, err, &nae, "TryAcquire of a full semaphore from another client")
		assert.Equal(t, 2, nae.Permits)

		// Two waiters in the other client; each release in the first
		// passes its permit to one of them, in the script.
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel() // before the wait: it ends an Acquire still waiting
		got := make(chan *distlock.Guard, 2)
		for range 2 {
			wg.Go(func() {
				g, err := other.Acquire(ctx)
				if assert.NoError(t, err, "Acquire in line") {
					got <- g
				}
			})
		}
		clusterWaitLine(t, owner, k.Queue, 2)
		assert.ElementsMatch(t, []string{k.Lease, k.Fence, k.Limit, k.Queue, k.Waiters}, keysOn(t, owner, k.Lease+"*"),
			"keys on the slot's primary")
		for _, p := range cl.Primaries() {
			if p != owner {
				assert.Empty(t, keysOn(t, p, k.Lease+"*"), "keys of %s on %s", k.Lease, p.Addr())
			}
		}
		for i, g := range held {
			assert.Equal(t, distlock.Released, release(t, g), "release %d", i)
			select {
			case w := <-got:
				assert.Greater(t, w.Token(), last, "token of the permit passed by release %d", i)
				last = w.Token()
				held[i] = w
			case <-time.After(eventually):
				t.Fatalf("no waiter acquired after release %d", i)
			}
		}
		for _, g := range held {
			assert.Equal(t, distlock.Released, release(t, g))
		}
		assert.Empty(t, keysOn(t, owner, k.Queue+"*"), "the line outlived its waiters")
	})

	t.Run("SemaphoreHolderThatStops", func(t *testing.T) {
		// A holder that stops renewing gives its permit back when its
		// lease ends, with nobody releasing it: a waiter in another client
		// takes it.
		const name, hold = "pool-stop", time.Second
		first, err := distlock.NewSemaphore(cl.Client(), name, 1, distlock.WithTTL(hold))
		require.NoError(t, err)
		second, err := distlock.NewSemaphore(cl.Client(), name, 1, distlock.WithTTL(longTTL))
		require.NoError(t, err)
		g, err := first.TryAcquire(t.Context())
		require.NoError(t, err)
		_, err = g.Leave(t.Context())
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), hold+eventually)
		defer cancel()
		g2, err := second.Acquire(ctx)
		require.NoError(t, err, "Acquire after the holder stopped renewing")
		assert.Greater(t, g2.Token(), g.Token())
		release(t, g2)
	})

	t.Run("RWMutex", func(t *testing.T) { clusterRWMutex(t, cl) })

	t.Run("Election", func(t *testing.T) {
		const name = "leader"
		k, err := lease.NewKeys(distlock.DefaultNamespace, name)
		require.NoError(t, err)
		owner := cl.PrimaryOf(k.Lease)
		newElection := func() *distlock.Election {
			e, err := distlock.NewElection(cl.Client(), name, distlock.WithTTL(longTTL))
			require.NoError(t, err)
			return e
		}
		a, b, watcher := newElection(), newElection(), newElection()
		octx, stop := context.WithCancel(t.Context())
		defer stop()
		obs := watcher.Observe(octx)
		assert.True(t, nextLeader(t, obs, eventually, func(distlock.Leader) bool { return true }).IsZero(), "nobody leads yet")
		// The observer listens on the slot's primary, where the scripts
		// publish.
		require.Eventually(t, func() bool {
			chans, err := owner.MustDo("PUBSUB", "SHARDCHANNELS", k.Leader).AsStrSlice()
			return err == nil && len(chans) == 1
		}, eventually, pollEvery, "the observer never subscribed on the election's primary")

		ga, err := a.Campaign(t.Context(), "a:1")
		require.NoError(t, err)
		la := nextLeader(t, obs, eventually, func(l distlock.Leader) bool { return l.Value == "a:1" })
		assert.Equal(t, ga.Token(), la.Token)

		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		got := make(chan *distlock.Guard, 1)
		wg.Go(func() {
			g, err := b.Campaign(ctx, "b:1")
			if assert.NoError(t, err, "Campaign in line") {
				got <- g
			}
		})
		clusterWaitLine(t, owner, k.Queue, 1)
		assert.Equal(t, distlock.Released, release(t, ga))
		lb := nextLeader(t, obs, eventually, func(l distlock.Leader) bool { return l.Value == "b:1" })
		var gb *distlock.Guard
		select {
		case gb = <-got:
		case <-time.After(eventually):
			t.Fatal("the candidate in line did not lead after the release")
		}
		assert.Equal(t, gb.Token(), lb.Token)
		assert.Greater(t, lb.Token, la.Token)
		now, err := a.Leader(t.Context())
		require.NoError(t, err)
		assert.Equal(t, lb.Value, now.Value, "Leader from another client")
		assert.Equal(t, lb.Token, now.Token, "Leader from another client")

		assert.Equal(t, distlock.Released, release(t, gb))
		nextLeader(t, obs, eventually, func(l distlock.Leader) bool { return l.IsZero() })
		stop()
		for range obs {
		}
	})
}

// clusterWaitLine waits until the line at key, on the primary n, has want
// waiters.
func clusterWaitLine(t *testing.T, n *redistest.Server, key string, want int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		got, err := n.MustDo("ZCARD", key).AsInt64()
		return err == nil && got == want
	}, eventually, pollEvery, "the line at %s never had %d waiters", key, want)
}
