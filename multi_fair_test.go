package distlock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Issue 25's fairness test: 6 clients take random sets of 3 of 6 names, in
// random order, for 20 s. Never two holders of one name; every client
// progresses every second; the fewest acquisitions of one client are at
// least half the most.

// fairClients, fairNames and fairSet are the test's shape; fairHold is each
// hold, as busy work.
const (
	fairClients = 6
	fairNames   = 6
	fairSet     = 3
	fairHold    = 500 * time.Microsecond
	// fairGap is the longest a client may go without an acquisition.
	fairGap = time.Second
)

// mcFair runs the fairness test on a Cluster of three primaries (the one
// TestMultiMutexCluster shares), with the names spread over the three:
// each set is taken in one script per slot, one after the other.
func mcFair(t *testing.T, cl *redistest.Cluster) {
	names := spreadNames(t, cl, fairNames)
	runFair(t, func() rueidis.Client { return cl.Client() }, names, time.Duration(runs(t, 1))*5*time.Second) // 20 s at DISTLOCK_SOAK=4
}

// TestMultiMutexFairStandalone runs it on one server, where each set is
// taken in one script.
func TestMultiMutexFairStandalone(t *testing.T) {
	srv := redistest.Start(t)
	names := make([]string, fairNames)
	for i := range names {
		names[i] = fmt.Sprint("fair-", i)
	}
	runFair(t, srv.Client, names, 5*time.Second)
}

// spreadNames returns n names whose locks are spread evenly over the
// cluster's primaries.
func spreadNames(t *testing.T, cl *redistest.Cluster, n int) []string {
	t.Helper()
	per := map[string]int{}
	primaries := len(cl.Primaries())
	var names []string
	for i := 0; len(names) < n; i++ {
		name := fmt.Sprint("fair-", i)
		node := cl.PrimaryOf("distlock:{" + name + "}").Addr()
		if per[node] < (n+primaries-1)/primaries {
			per[node]++
			names = append(names, name)
		}
	}
	require.Len(t, per, primaries, "names not spread over every primary")
	return names
}

// busy spins for d, standing for work under the lock (a sleep that short
// lasts a millisecond or more).
func busy(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

func runFair(t *testing.T, connect func() rueidis.Client, names []string, d time.Duration) {
	holders := make(map[string]*atomic.Int32, len(names))
	for _, n := range names {
		holders[n] = new(atomic.Int32)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	start := time.Now()
	end := start.Add(d)
	times := make([][]time.Time, fairClients)
	var breaches atomic.Int32
	var wg sync.WaitGroup
	for i := range fairClients {
		c := connect()
		rng := rand.New(rand.NewPCG(uint64(i), 25))
		wg.Go(func() {
			for time.Now().Before(end) {
				set := slices.Clone(names)
				rng.Shuffle(len(set), func(a, b int) { set[a], set[b] = set[b], set[a] })
				set = set[:fairSet]
				// A new MultiMutex per job, as a worker makes one.
				m, err := distlock.NewMultiMutex(c, set, multiOpts...)
				if !assert.NoError(t, err) {
					return
				}
				g, err := m.Lock(ctx)
				if err != nil {
					assert.ErrorIs(t, err, context.Canceled, "client %d", i)
					return
				}
				times[i] = append(times[i], time.Now())
				for _, n := range set {
					if holders[n].Add(1) != 1 {
						breaches.Add(1)
						t.Errorf("client %d holds %s beside another holder", i, n)
					}
				}
				busy(fairHold)
				if g.State() != distlock.Acquired {
					t.Errorf("client %d: the guard is %v under the lock", i, g.State())
				}
				for _, n := range set {
					holders[n].Add(-1)
				}
				if _, err := g.Release(context.WithoutCancel(ctx)); err != nil {
					t.Errorf("client %d: Release: %v", i, err)
				}
			}
		})
	}
	wg.Wait()
	assert.Zero(t, breaches.Load(), "two holders of one name")
	counts := make([]int, fairClients)
	worstGap := time.Duration(0)
	for i, ts := range times {
		counts[i] = len(ts)
		prev := start
		for _, at := range append(ts, end) {
			if gap := at.Sub(prev); gap > worstGap {
				worstGap = gap
			}
			prev = at
		}
	}
	lo, hi := slices.Min(counts), slices.Max(counts)
	t.Logf("%d clients, sets of %d of %d names, %v: acquisitions per client %v (%.0f/s in all), fewest/most %.2f, longest gap %v",
		fairClients, fairSet, len(names), d, counts, float64(sum(counts))/d.Seconds(), float64(lo)/float64(hi), worstGap.Round(time.Millisecond))
	assert.GreaterOrEqual(t, 2*lo, hi, "the fewest acquisitions of a client are less than half the most: %v", counts)
	assert.LessOrEqual(t, worstGap, fairGap, "a client went %v without an acquisition", worstGap)
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}
