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

// batchHoldTTL is short, so that a test sees several rounds of renewals,
// and long enough that a renewal has most of a second to spare for the
// scheduling delay of a loaded machine under -race (at 600 ms it had 364
// ms, which such a machine used up now and then).
const batchHoldTTL = 1500 * time.Millisecond

// requireBatchHeld releases guards, held for rounds renewal periods,
// checking that each still held, that rounds-2 renewals of each were
// observed at least (the Observer hears of a confirmation through the
// batcher when the guard's actor next wakes, when the next renewal is
// due: the last renewal's is still to come), and that no renewal failed or was lost, unless the
// probe saw a scheduling delay since from that used up the time to spare
// (for a lease, a renewal's budget; for the count, the spare period): the
// machine, not the batcher, may then have taken a lease or held a renewal
// up, and it says so and skips.
func requireBatchHeld(t *testing.T, p *probe, from time.Time, rounds int, guards []*distlock.Guard, obs *heldObserver) {
	t.Helper()
	notHeld := 0
	for _, g := range guards {
		if g.State() != distlock.Acquired {
			notHeld++
		}
	}
	late := stepHops * p.delay(from, time.Now())
	want, renewals := int64((rounds-2)*len(guards)), obs.renewals.Load()
	lostOne := notHeld > 0 || obs.failures.Load() > 0 || obs.lost.Load() > 0
	if lostOne && late >= renewalBudget(batchHoldTTL) || renewals < want && late >= batchHoldTTL/3 {
		for _, g := range guards {
			_, _ = g.Release(t.Context())
		}
		t.Skipf("%d of %d guards no longer held, %d failed renewals, %d Lost events, %d of at least %d renewals answered, "+
			"but the scheduling delay reached %v (%d times the probe's worst), and a renewal has %v to spare: "+
			"the machine may have taken the leases or held renewals up",
			notHeld, len(guards), obs.failures.Load(), obs.lost.Load(), renewals, want, late, stepHops, renewalBudget(batchHoldTTL))
	}
	for i, g := range guards {
		assert.Equal(t, distlock.Acquired, g.State(), "guard %d", i)
		_, err := g.Release(t.Context())
		require.NoError(t, err)
	}
	assert.GreaterOrEqual(t, renewals, want, "renewals answered (scheduling delay up to %v)", late)
	assert.Zero(t, obs.failures.Load(), "failed renewals (scheduling delay up to %v): %v", late, obs.errs)
	assert.Zero(t, obs.lost.Load(), "Lost events (scheduling delay up to %v)", late)
}

// TestBatchRenewalKinds holds locks of every kind on one client of a
// standalone server, through the renewal batcher, for several rounds of
// renewals: every renewal is confirmed, and they share a few commands.
func TestBatchRenewalKinds(t *testing.T) {
	srv := redistest.Start(t)
	c, counter := srv.CountingClient(t)
	p, start := startProbe(t, nil), time.Now()
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
	requireBatchHeld(t, p, start, rounds, guards, obs)
	renewals := obs.renewals.Load()
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
	p, start := startProbe(t, nil), time.Now()
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
	requireBatchHeld(t, p, start, rounds, guards, obs)
}

// TestBatchRenewalRestartNoticed holds many locks when Redis restarts
// empty: the keeper's poke has every guard renew at once, through the
// batcher, so they all learn they are Lost within a round trip of the
// server answering again, in a few commands rather than one per guard.
func TestBatchRenewalRestartNoticed(t *testing.T) {
	const (
		locks = 1000
		ttl   = 12 * time.Second
		// Well before the next scheduled renewal: 2/3 of the TTL (less
		// twice the slack of 5% of a period) after the acquisitions began,
		// about 3.5 s after the restart less the time the acquisitions took, so a slow start and restart on a loaded
		// machine still leave the renewals due later than this bound
		// widened by the measured scheduling delay (without the poke it
		// measured 870 ms at a 3 s TTL; at 6 s, a loaded machine that took
		// a second and a half to acquire left too little room).
		within = time.Second
	)
	srv := redistest.Start(t)
	c, counter := srv.CountingClient(t)
	p := startProbe(t, nil)
	// No guard's second scheduled renewal goes out before two periods
	// after this, each less the slack by which a renewal may go early.
	first := time.Now()
	guards := make([]*distlock.Guard, locks)
	for i := range guards {
		m, err := distlock.NewMutex(c, "restart:"+strconv.Itoa(i), distlock.WithTTL(ttl))
		require.NoError(t, err)
		guards[i], err = m.Lock(t.Context())
		require.NoError(t, err)
	}
	// Past the first renewal: every guard has its actor.
	time.Sleep(ttl/3 + 100*time.Millisecond)
	defer func() { // on every way out: they are all Lost by then, or the test failed
		for _, g := range guards {
			_, _ = g.Release(context.Background())
		}
	}()
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
	earliest := first.Add(2 * (ttl/3 - ttl/3/20))
	early := 0 // guards Lost before the earliest scheduled renewal: only the poke can tell them
	for {
		n, now := lost(), time.Now()
		if now.Before(earliest) {
			early = n
		}
		if n == locks || now.Sub(restarted) >= ttl/3 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	took, sent := time.Since(restarted), counter.Load()-cmds
	late := stepHops * p.delay(restarted, restarted.Add(took))
	t.Logf("%d of %d guards Lost %v after the restart, %d of them before the earliest scheduled renewal (%v after the restart), "+
		"with %d commands; scheduling delay up to %v (%d times the probe's worst)",
		lost(), locks, took, early, earliest.Sub(restarted), sent, late, stepHops)
	assert.Equal(t, locks, lost(), "guards Lost within %v of the restart", took)
	assert.Less(t, sent, int64(locks/20), "commands from the restart until every guard was Lost")
	require.Positive(t, early, "no guard learnt of the restart before the earliest scheduled renewal, %v after it: "+
		"the keeper did not poke them (all Lost after %v)", earliest.Sub(restarted), took)
	if took >= within+late {
		// Slower than the bound allows for the delay the probe saw. On a
		// machine that gives this process a small share of its CPU, the
		// thousand renewals and losses take that long without any one
		// goroutine waiting long; that the poke ran shows in the guards
		// that learnt of the restart before any scheduled renewal could
		// have told them.
		t.Skipf("the keeper's poke ran (%d guards Lost before any scheduled renewal), but every guard learnt of the restart only %v after it, "+
			"past the bound of %v plus the scheduling delay of %v the probe measured: the machine is too busy to time it", early, took, within, late)
	}
}
