package goredis_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/goredis"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// The mixed fleet's bounds. Waiters refresh their place every half claim
// window (mixedClaim/2), and poll every distlock.DefaultRetryInterval while
// their room has no subscription; a hand-off woken by pub/sub takes
// milliseconds.
const (
	mixedClaim   = 4 * time.Second
	handoffBound = time.Second // well under a refresh (2 s)
	quietWindow  = 1500 * time.Millisecond
	quietCalls   = 10 // four waiters refresh at most once each, plus a poke each
)

// TestMixedFleet runs one lock on a rueidis client and a go-redis client
// of one server, as processes on either client would: what one holds the
// other cannot take; waiters of both stand in one line, in arrival order;
// while they wait they are quiet (woken by pub/sub, not polling); each
// release, always to a waiter of the other client, wakes the next in line
// at once; and the fencing tokens of all acquisitions form one increasing
// sequence.
func TestMixedFleet(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client()
	gr := newClient(t, srv.Addr())
	const name = "mixed"
	mr, err := distlock.NewMutex(rc, name, distlock.WithClaimWindow(mixedClaim), distlock.WithOwner("rueidis"))
	require.NoError(t, err)
	mg, err := goredis.NewMutex(gr, name, distlock.WithClaimWindow(mixedClaim), distlock.WithOwner("go-redis"))
	require.NoError(t, err)
	keys, err := lease.NewKeys(distlock.DefaultNamespace, name)
	require.NoError(t, err)
	ctx := ctxFor(t, 2*time.Minute)

	holder, err := mg.TryLock(ctx)
	require.NoError(t, err)
	_, err = mr.TryLock(ctx)
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "the lock held on go-redis is held for rueidis")

	// Waiters alternate clients, so that each release goes to the other
	// client's waiter: a rueidis release wakes a go-redis waiter, and the
	// other way round, through the waiter's own subscription.
	waiters := []*distlock.Mutex{mr, mg, mr, mg}
	type acquired struct {
		i   int
		g   *distlock.Guard
		at  time.Time
		err error
	}
	results := make(chan acquired, len(waiters))
	wctx, wcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		wcancel()
		wg.Wait()
	})
	for i, m := range waiters {
		wg.Go(func() {
			g, err := m.Lock(wctx)
			results <- acquired{i: i, g: g, at: time.Now(), err: err}
		})
		eventually(t, settleTimeout, func() (bool, string) {
			n, err := gr.ZCard(ctx, keys.Queue).Result()
			return err == nil && n == int64(i+1), "line of " + strconv.FormatInt(n, 10) + ", want " + strconv.Itoa(i+1)
		})
	}

	// Both clients' rooms listen on the process's wake channel: a sharded
	// one, or a plain one on a server without sharded pub/sub.
	sharded := srv.Has(redistest.ShardedPubSub)
	eventually(t, settleTimeout, func() (bool, string) {
		channels := gr.PubSubShardChannels
		if !sharded {
			channels = gr.PubSubChannels
		}
		chans, err := channels(ctx, keys.Lease+":wake:*").Result()
		if err != nil || len(chans) != 1 {
			return false, "wake channels: " + strconv.Itoa(len(chans))
		}
		n := subscribers(t, srv, chans[0], sharded)
		return n == 2, strconv.FormatInt(n, 10) + " subscribers of " + chans[0] + ", want 2 (one per client)"
	})

	// Quiet: over the window, the waiters send a refresh each at most.
	before := cmdStat(t, srv, "evalsha", "calls")
	select {
	case <-time.After(quietWindow):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if calls := cmdStat(t, srv, "evalsha", "calls") - before; calls > quietCalls {
		t.Errorf("%d scripts run in %v of waiting, want at most %d: the waiters poll", calls, quietWindow, quietCalls)
	}

	cur, last := holder, holder.Token()
	for i := range waiters {
		released := time.Now()
		_, err := cur.Release(ctx)
		require.NoError(t, err)
		var r acquired
		select {
		case r = <-results:
		case <-time.After(settleTimeout):
			t.Fatalf("hand-off %d: no waiter acquired the lock within %v", i, settleTimeout)
		}
		require.NoError(t, r.err, "waiter %d", r.i)
		require.Equal(t, i, r.i, "hand-off %d went to waiter %d: not first come, first served", i, r.i)
		if took := r.at.Sub(released); took > handoffBound {
			t.Errorf("hand-off %d took %v, want at most %v (woken by pub/sub)", i, took, handoffBound)
		}
		require.Greater(t, r.g.Token(), last, "hand-off %d: token", i)
		cur, last = r.g, r.g.Token()
	}
	_, err = cur.Release(ctx)
	require.NoError(t, err)
}
