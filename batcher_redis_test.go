package distlock_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// batchHoldTTL is short, so that a test sees several rounds of renewals.
const batchHoldTTL = 600 * time.Millisecond

// TestBatchRenewalKinds holds locks of every kind on one client of a
// standalone server, through the renewal batcher, for several rounds of
// renewals: every renewal is confirmed, and they share a few commands.
func TestBatchRenewalKinds(t *testing.T) {
	srv := redistest.Start(t)
	c, counter := srv.CountingClient(t)
	obs := &heldObserver{}
	ctx := t.Context()
	opts := []distlock.Option{distlock.WithTTL(batchHoldTTL), distlock.WithObserver(obs)}
	var guards []*distlock.Guard
	for i := range 10 {
		name := "kinds:" + strconv.Itoa(i)
		m, err := distlock.NewMutex(c, name+":m", opts...)
		require.NoError(t, err)
		s, err := distlock.NewSemaphore(c, name+":s", 2, opts...)
		require.NoError(t, err)
		rw, err := distlock.NewRWMutex(c, name+":rw", opts...)
		require.NoError(t, err)
		w, err := distlock.NewRWMutex(c, name+":w", opts...)
		require.NoError(t, err)
		for _, lock := range []func(context.Context) (*distlock.Guard, error){m.Lock, s.Acquire, rw.RLock, rw.RLock, w.Lock} {
			g, err := lock(ctx)
			require.NoError(t, err)
			guards = append(guards, g)
		}
	}
	cmds := counter.Load()
	const rounds = 4
	time.Sleep(rounds * batchHoldTTL / 3)
	cmds = counter.Load() - cmds
	for i, g := range guards {
		assert.Equal(t, distlock.Acquired, g.State(), "guard %d", i)
		_, err := g.Release(ctx)
		require.NoError(t, err)
	}
	renewals := obs.renewals.Load()
	assert.GreaterOrEqual(t, renewals, int64((rounds-1)*len(guards)), "renewals answered")
	assert.Zero(t, obs.failures.Load(), "failed renewals: %v", obs.errs)
	assert.Zero(t, obs.lost.Load(), "Lost events")
	// The keeper's subscription is one command; each round of renewals a
	// few more (the guards were taken over a few ms, so one or two scripts).
	assert.Less(t, cmds, renewals/5, "commands during the hold, for %d renewals", renewals)
}

// TestBatchRenewalCluster holds locks of many slots on a Redis Cluster:
// the batcher renews them per slot (a script's keys must share one), and
// every renewal is confirmed.
func TestBatchRenewalCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	c := cl.Client()
	obs := &heldObserver{}
	ctx := t.Context()
	var guards []*distlock.Guard
	for i := range 40 {
		m, err := distlock.NewMutex(c, "cluster:"+strconv.Itoa(i), distlock.WithTTL(batchHoldTTL), distlock.WithObserver(obs))
		require.NoError(t, err)
		g, err := m.Lock(ctx)
		require.NoError(t, err)
		guards = append(guards, g)
	}
	const rounds = 4
	time.Sleep(rounds * batchHoldTTL / 3)
	for i, g := range guards {
		assert.Equal(t, distlock.Acquired, g.State(), "guard %d", i)
		_, err := g.Release(ctx)
		require.NoError(t, err)
	}
	assert.GreaterOrEqual(t, obs.renewals.Load(), int64((rounds-1)*len(guards)), "renewals answered")
	assert.Zero(t, obs.failures.Load(), "failed renewals: %v", obs.errs)
	assert.Zero(t, obs.lost.Load(), "Lost events")
}

// TestBatchRenewalRestartNoticed holds many locks when Redis restarts
// empty: the keeper's poke has every guard renew at once, through the
// batcher, so they all learn they are Lost within a round trip of the
// server answering again, in a few commands rather than one per guard.
func TestBatchRenewalRestartNoticed(t *testing.T) {
	const (
		locks = 1000
		ttl   = 6 * time.Second
		// Well before the next scheduled renewal: 2/3 of the TTL after the
		// acquisitions, about 1.9 s after the restart began, so a slow
		// restart on a loaded machine still leaves the renewals due later
		// than this bound (without the poke it measured 870 ms at a 3 s TTL).
		within = time.Second
	)
	srv := redistest.Start(t)
	c, counter := srv.CountingClient(t)
	guards := make([]*distlock.Guard, locks)
	for i := range guards {
		m, err := distlock.NewMutex(c, "restart:"+strconv.Itoa(i), distlock.WithTTL(ttl))
		require.NoError(t, err)
		guards[i], err = m.Lock(t.Context())
		require.NoError(t, err)
	}
	// Past the first renewal: every guard has its actor.
	time.Sleep(ttl/3 + 100*time.Millisecond)
	srv.Restart()
	restarted, cmds := time.Now(), counter.Load()
	lost := func() int {
		n := 0
		for _, g := range guards {
			if g.State() == distlock.Lost {
				n++
			}
		}
		return n
	}
	for lost() < locks && time.Since(restarted) < ttl/3 {
		time.Sleep(5 * time.Millisecond)
	}
	took, sent := time.Since(restarted), counter.Load()-cmds
	t.Logf("%d of %d guards Lost %v after the restart, with %d commands", lost(), locks, took, sent)
	assert.Equal(t, locks, lost(), "guards Lost after the restart")
	assert.Less(t, took, within, "the guards learnt of the restart at their next renewal, not at once")
	assert.Less(t, sent, int64(locks/20), "commands from the restart until every guard was Lost")
	for _, g := range guards {
		_, _ = g.Release(t.Context())
	}
}
