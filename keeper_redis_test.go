package distlock_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// TestYoungHolderNoticesARestart restarts Redis empty half a second after
// a Lock with the default TTL, while another client waits for the lock:
// the holder, ten seconds before its first renewal, is watched by its
// client's keeper all the same, so it is Lost within a round trip or two
// of the server answering again, and the waiter then holds the lock with
// a larger token.
func TestYoungHolderNoticesARestart(t *testing.T) {
	srv := redistest.Start(t)
	youngHolderNoticesRestart(t, srv.Client(), srv.Client(), "young", 500*time.Millisecond, func(*distlock.Guard) { srv.Restart() })
}

// TestYoungHolderNoticesARestartBeforeItsWatch is
// TestYoungHolderNoticesARestart with the restart 20 ms after the Lock,
// before the client's keeper has subscribed (on rueidis it subscribes once
// a guard has lived 100 ms, keeperDelay): the restart breaks no
// subscription of the keeper's, and the holder learns of it when the
// keeper's first subscription is confirmed, on the new server. Without the
// renewal at that first confirmation the holder learnt of it at its first
// renewal, ten seconds in.
func TestYoungHolderNoticesARestartBeforeItsWatch(t *testing.T) {
	srv := redistest.Start(t)
	youngHolderNoticesRestart(t, srv.Client(), srv.Client(), "young-early", 20*time.Millisecond, func(*distlock.Guard) { srv.Restart() })
}

// TestShortHoldsDoNotSubscribeOnRueidis takes and releases a lock over and
// over on a rueidis client, each hold far shorter than the 100 ms after
// which the client's restart watch subscribes (keeperDelay): the server
// is asked for no subscription, so the client's connection keeps rueidis's
// fast path for lone commands. A lock held for longer makes the one
// subscription. Before the watch waited, the first Lock subscribed.
func TestShortHoldsDoNotSubscribeOnRueidis(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	m, err := distlock.NewMutex(c, "short")
	require.NoError(t, err)
	for range 200 {
		g, err := m.Lock(context.Background())
		require.NoError(t, err)
		_, err = g.Release(context.Background())
		require.NoError(t, err)
	}
	assert.Zero(t, subscriptions(t, srv), "subscriptions after 200 short holds")
	g, err := m.Lock(context.Background())
	require.NoError(t, err)
	assert.Eventually(t, func() bool { return subscriptions(t, srv) == 1 }, 10*time.Second, 5*time.Millisecond,
		"the held lock's subscription")
	_, err = g.Release(context.Background())
	require.NoError(t, err)
}

// subscriptions returns how many SSUBSCRIBE and SUBSCRIBE commands srv
// has run.
func subscriptions(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	stats, err := srv.Info("commandstats")
	require.NoError(t, err)
	n := 0
	for _, cmd := range []string{"cmdstat_ssubscribe", "cmdstat_subscribe"} {
		calls, _, _ := strings.Cut(strings.TrimPrefix(stats[cmd], "calls="), ",")
		if calls != "" {
			c, err := strconv.Atoi(calls)
			require.NoError(t, err, "%s: %s", cmd, stats[cmd])
			n += c
		}
	}
	return n
}

// TestYoungHolderNoticesANodeRestart is TestYoungHolderNoticesARestart on a
// Redis Cluster, where the node restarted is not the one of the client's
// first lock: the client holds a young guard on one node, then the guard
// under test on another, and the second node restarts empty. Its holder
// is Lost within a round trip or two of the node answering again, the
// waiter gets a larger token, and the guard on the other node stays
// Acquired. (Before each client's session watched every slot its guards
// live on, the one keeper's subscription lived on the node of the first
// lock, and this holder learnt of the restart at its first renewal.)
func TestYoungHolderNoticesANodeRestart(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	c := cl.Client()
	other, err := distlock.NewMutex(c, "young-first")
	require.NoError(t, err)
	first, err := other.Lock(t.Context())
	require.NoError(t, err)
	name := "young-0"
	for i := 1; cl.PrimaryOf(keyOf(t, c, name)) == cl.PrimaryOf(first.Key()); i++ {
		name = "young-" + strconv.Itoa(i)
	}
	youngHolderNoticesRestart(t, c, cl.Client(), name, 500*time.Millisecond, func(g *distlock.Guard) {
		node := cl.PrimaryOf(g.Key())
		node.Restart()
		// A primary that rejoins after a restart refuses commands
		// (CLUSTERDOWN) for two seconds, to let the cluster reconfigure it:
		// it answers for its slots once its cluster state is ok.
		require.True(t, pollEveryUntil(time.Millisecond, nodeRejoinBound, func() bool {
			info, err := node.Do(t.Context(), "CLUSTER", "INFO")
			if err != nil {
				return false
			}
			text, err := info.ToString()
			return err == nil && strings.Contains(text, "cluster_state:ok")
		}), "the restarted node's cluster state is not ok after %v", nodeRejoinBound)
	})
	assert.Equal(t, distlock.Acquired, first.State(), "the guard on the node that did not restart")
	_, err = first.Release(t.Context())
	require.NoError(t, err)
}

// nodeRejoinBound bounds how long a restarted cluster node takes to answer
// for its slots again (two seconds of its own, and a loaded machine).
const nodeRejoinBound = 20 * time.Second

// keyOf returns the Redis key of the lock name on c.
func keyOf(t *testing.T, c rueidis.Client, name string) string {
	t.Helper()
	m, err := distlock.NewMutex(c, name)
	require.NoError(t, err)
	return m.Key()
}

// youngHolderNoticesRestart locks name on holder with the default TTL and
// has a Mutex of name on waiter wait for it; restartIn after the Lock it
// calls restart, which restarts the server of the holder's guard empty
// and returns once it answers. The holder must be Lost within
// half a second of that, for the lease its renewal found gone, and the
// waiter must then hold the lock with a larger token.
func youngHolderNoticesRestart(t *testing.T, holderClient, waiterClient rueidis.Client, name string, restartIn time.Duration,
	restart func(*distlock.Guard)) {
	t.Helper()
	const (
		// The promise: every holder learns of the restart within this of
		// the server answering. Without the keeper's watch of young guards
		// it took 9.4 s (the first renewal, a third of the TTL in).
		within    = 500 * time.Millisecond
		waitBound = 10 * time.Second // for the waiter, and for the loss on a stalled machine
	)
	holder, err := distlock.NewMutex(holderClient, name)
	require.NoError(t, err)
	waiter, err := distlock.NewMutex(waiterClient, name)
	require.NoError(t, err)
	p := startProbe(t, nil) // what the machine keeps this process from running
	g, err := holder.Lock(t.Context())
	require.NoError(t, err)
	locked := time.Now()

	type result struct {
		g   *distlock.Guard
		err error
	}
	waited := make(chan result, 1)
	wctx, cancel := context.WithTimeout(t.Context(), waitBound+restartIn)
	defer cancel()
	go func() {
		wg, err := waiter.Lock(wctx)
		waited <- result{wg, err}
	}()

	time.Sleep(time.Until(locked.Add(restartIn))) // the scenario's timing, not a synchronisation
	t.Logf("restarting %v after the Lock", time.Since(locked))
	restart(g)
	answering := time.Now() // restart returns once the new server answers
	t.Logf("the server answers again %v after the Lock", answering.Sub(locked))
	select {
	case <-g.Context().Done():
	case <-time.After(waitBound):
	}
	took := time.Since(answering)
	require.Equal(t, distlock.Lost, g.State(), "the holder after the restart (%v)", took)
	var lost *distlock.LostError
	require.ErrorAs(t, context.Cause(g.Context()), &lost)
	assert.Equal(t, distlock.LostRefused, lost.Reason, "the renewal found the lease gone")
	late := p.delay(answering, answering.Add(took))
	t.Logf("the young holder was Lost %v after the server answered again (scheduling delay meanwhile %v)", took, late)
	assert.Less(t, took, within+late, "the holder learnt of the restart late: %v, the bound %v plus the scheduling "+
		"delay the probe measured meanwhile, %v", took, within, late)

	r := <-waited
	if r.err != nil && strings.Contains(r.err.Error(), "CLUSTERDOWN") {
		// A waiter whose refresh of its place met the rejoining node's
		// CLUSTERDOWN gave up (an error Redis answered with ends a Lock);
		// it asks again now that the node answers.
		t.Logf("the waiter gave up during the node's rejoin (%v); locking again", r.err)
		ctx, cancel := context.WithTimeout(t.Context(), waitBound)
		defer cancel()
		r.g, r.err = waiter.Lock(ctx)
	}
	require.NoError(t, r.err, "the waiter after the restart")
	assert.Greater(t, r.g.Token(), g.Token(), "the waiter's token after the restart")
	assert.Equal(t, distlock.Acquired, r.g.State())
	_, err = r.g.Release(t.Context())
	require.NoError(t, err)
	st, err := g.Release(t.Context())
	require.NoError(t, err)
	assert.Equal(t, distlock.Lost, st)
}
