package suite

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// Cluster runs distlock on a Redis Cluster of three primaries, each with
// one replica, built by redis-cli --cluster create. The cluster is built
// once and shared by the subtests, which run in order: the last two move
// primaries and slots around, and each leaves the cluster settled. Every
// script names keys of one slot, and writes or publishes on others of it
// (the fencing key, the line, the limit record, the wake and leader
// channels), so a key outside the slot would fail with CROSSSLOT or a
// redirection; each client stands for a process.
func Cluster(t *testing.T, lib Library) {
	cl := redistest.StartCluster(t, 3, 1)
	target := Target{Cluster: cl.Addrs()}
	c := lib.Connect(t, target)

	t.Run("KeysShareASlot", func(t *testing.T) { clusterKeysShareASlot(t, cl) })
	t.Run("LocksSpreadOverPrimaries", func(t *testing.T) { clusterLocksSpread(t, cl, c) })
	t.Run("Contention", func(t *testing.T) {
		// Each worker has its own client, as separate processes would.
		checkContention(t, func(int) Client { return lib.Connect(t, target) }, "contended", 4, 8)
	})
	t.Run("WaiterHearsReleaseOnTheShard", func(t *testing.T) { clusterWaiterHearsRelease(t, lib, cl) })
	t.Run("ReplicaAckGoesToTheSlotsPrimary", func(t *testing.T) { clusterReplicaAck(t, cl, c) })
	t.Run("Semaphore", func(t *testing.T) { clusterSemaphore(t, lib, cl) })
	t.Run("SemaphoreHolderThatStops", func(t *testing.T) { clusterSemaphoreHolderThatStops(t, lib, cl) })
	t.Run("RWMutex", func(t *testing.T) { clusterRWMutex(t, lib, cl) })
	t.Run("Election", func(t *testing.T) { clusterElection(t, lib, cl) })
	t.Run("FailoverKeepsLocks", func(t *testing.T) { clusterFailoverKeepsLocks(t, lib, cl, c) })
	t.Run("ReshardingKeepsLocks", func(t *testing.T) { clusterReshardingKeepsLocks(t, lib, cl, c) })
}

func clusterKeysShareASlot(t *testing.T, cl *redistest.Cluster) {
	for _, name := range []string{"job", "a:b", "with space", "ünïcødé", "x", "pool"} {
		k, err := lease.NewKeys(distlock.DefaultNamespace, name)
		require.NoError(t, err)
		slot := cl.Slot(k.Lease)
		for _, key := range []string{k.Fence, k.Queue, k.Waiters, k.WakeChannel("0123456789abcdef"), k.Leader, k.Limit, k.Void("v#1")} {
			assert.Equal(t, slot, cl.Slot(key), "slot of %s", key)
		}
	}
}

func clusterLocksSpread(t *testing.T, cl *redistest.Cluster, c Client) {
	const n = 48
	guards := make([]*distlock.Guard, n)
	var wg sync.WaitGroup
	for i := range n {
		m := newMutex(t, c, fmt.Sprintf("spread-%d", i))
		wg.Go(func() {
			g, err := m.Lock(t.Context())
			if assert.NoError(t, err, "Lock %s", m.Key()) {
				guards[i] = g
			}
		})
	}
	wg.Wait()
	primaries := cl.Primaries()
	used := make(map[string]int)
	for _, g := range guards {
		require.NotNil(t, g)
		assert.Equal(t, distlock.Acquired, g.State())
		owner := cl.PrimaryOf(g.Key())
		used[owner.Addr()]++
		// Both keys live on the primary that serves the slot, and on no
		// other primary.
		for _, p := range primaries {
			var want []string
			if p == owner {
				want = []string{g.Key(), g.Key() + ":fence"}
			}
			assert.ElementsMatch(t, want, keysOn(t, p, g.Key()+"*"), "keys of %s on %s", g.Key(), p.Addr())
		}
	}
	assert.Len(t, used, len(primaries), "locks per primary: %v", used)
	for _, g := range guards {
		assert.Equal(t, distlock.Released, release(t, g))
	}
}

// A waiter in another process (another client) subscribes to its room's
// wake channel with SSUBSCRIBE, on the primary that serves the lock's
// slot, and the release script publishes the grant there. (On a Cluster
// without sharded pub/sub, Redis 6.2, it subscribes with SUBSCRIBE on
// whichever node its client picks, and the script's PUBLISH reaches it
// there: see clusterSubscribed.) While subscribed, the waiter does not
// poll: besides its first call, it only refreshes its place every half
// claim window.
func clusterWaiterHearsRelease(t *testing.T, lib Library, cl *redistest.Cluster) {
	target := Target{Cluster: cl.Addrs()}
	obs := &acquireWatch{}
	ma := newMutex(t, lib.Connect(t, target), "notify", distlock.WithTTL(longTTL))
	mb := newMutex(t, lib.Connect(t, target), "notify", distlock.WithObserver(obs))
	ga, err := ma.Lock(t.Context())
	require.NoError(t, err)
	began := time.Now()
	got := lockAsync(t, t.Context(), mb)
	k, err := lease.NewKeys(distlock.DefaultNamespace, "notify")
	require.NoError(t, err)
	owner := cl.PrimaryOf(k.Lease)
	require.Eventually(t, func() bool { return len(clusterSubscribed(t, cl, owner, k.Wake+":*")) == 1 },
		eventually, pollEvery, "the waiter never subscribed on the lock's primary")

	const hold = 300 * time.Millisecond // six polls' worth at the default interval
	time.Sleep(hold)
	start := time.Now()
	// The first call, one after the subscription is confirmed, the
	// refreshes of the wait so far (one every half claim window since the
	// first call: more than the hold's where subscribing took long, as on a
	// server without sharded pub/sub, whose subscription is refused once
	// before the plain one), and one to spare for a slow machine.
	maxAttempts := 3 + int(start.Sub(began)/(distlock.DefaultClaimWindow/2))
	release(t, ga)
	o := await(t, got, eventually, "the waiter after the release")
	require.NoError(t, o.err)
	assert.Less(t, o.at.Sub(start), promptly, "the waiter took too long after the release")
	// Polling would have made one every 50ms.
	assert.LessOrEqual(t, obs.attempts(), maxAttempts, "attempts of the waiter")
	release(t, o.g)
}

// WAIT has no key, so only the lease key can route it: if it went to
// another primary, it would count that primary's replica, which never saw
// the write. Stopping the replica of the lock's own primary must make the
// acquisition fail; a lock on another primary is unaffected.
func clusterReplicaAck(t *testing.T, cl *redistest.Cluster, c Client) {
	m := newMutex(t, c, "acked", distlock.WithReplicaAck(1, ackTimeout))
	owner := cl.PrimaryOf(m.Key())
	replicas := cl.ReplicasOf(owner)
	require.Len(t, replicas, 1)
	var other *distlock.Mutex
	for i := 0; other == nil; i++ {
		o := newMutex(t, c, fmt.Sprint("acked-elsewhere-", i), distlock.WithReplicaAck(1, ackTimeout))
		if cl.PrimaryOf(o.Key()) != owner {
			other = o
		}
	}

	g, err := m.Lock(t.Context())
	require.NoError(t, err, "acknowledged Lock")
	assert.Equal(t, []string{m.Key()}, keysOn(t, replicas[0], m.Key()), "lease on the replica of its primary")
	release(t, g)

	replicas[0].Pause()
	_, err = m.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotReplicated, "with the slot's replica stopped")
	g, err = other.TryLock(t.Context())
	require.NoError(t, err, "lock on another primary, whose replica runs")
	replicas[0].Resume()
	release(t, g)
	assert.Empty(t, keysOn(t, owner, m.Key()), "the unacknowledged lease was left behind")

	// More replicas than the primary has.
	_, err = newMutex(t, c, "acked", distlock.WithReplicaAck(2, ackTimeout)).TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotReplicated)
}

// clusterWaitLine waits until the line at key, on the primary n, has want
// waiters.
// clusterSubscribed returns the channels matching pattern that distlock's
// subscribers listen on where they must. On a Cluster with sharded pub/sub
// that is owner, the primary of the channels' slot: a sharded publish
// reaches the nodes of that slot alone. Without it (Redis 6.2), distlock
// falls back to plain pub/sub, and a plain PUBLISH is sent over the
// cluster bus to every node, replicas included, so a subscription on any
// node hears it: the channels are those subscribed on any node. That
// broadcast is what the fallback costs: every grant and every change of
// leader is a message to every node of the cluster.
func clusterSubscribed(t *testing.T, cl *redistest.Cluster, owner *redistest.Server, pattern string) []string {
	t.Helper()
	if owner.Has(redistest.ShardedPubSub) {
		return subscribedChannels(t, owner, pattern)
	}
	var chans []string
	for _, n := range cl.Nodes() {
		chans = append(chans, subscribedChannels(t, n, pattern)...)
	}
	return chans
}

func clusterWaitLine(t *testing.T, n *redistest.Server, key string, want int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		got, err := n.MustDo("ZCARD", key).AsInt64()
		return err == nil && got == want
	}, eventually, pollEvery, "the line at %s never had %d waiters", key, want)
}

// onlyOn checks that the keys of the lock at k live on the slot's primary
// owner, as want lists them, and on no other primary.
func onlyOn(t *testing.T, cl *redistest.Cluster, owner *redistest.Server, k lease.Keys, want []string) {
	t.Helper()
	assert.ElementsMatch(t, want, keysOn(t, owner, k.Lease+"*"), "keys on the slot's primary")
	for _, p := range cl.Primaries() {
		if p != owner {
			assert.Empty(t, keysOn(t, p, k.Lease+"*"), "keys of %s on %s", k.Lease, p.Addr())
		}
	}
}

func clusterSemaphore(t *testing.T, lib Library, cl *redistest.Cluster) {
	const name = "pool"
	k, err := lease.NewKeys(distlock.DefaultNamespace, name)
	require.NoError(t, err)
	target := Target{Cluster: cl.Addrs()}
	holder := newSemaphore(t, lib.Connect(t, target), name, 2, distlock.WithTTL(longTTL))
	other := newSemaphore(t, lib.Connect(t, target), name, 2, distlock.WithTTL(longTTL))
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

	// Two waiters in the other client; each release in the first passes
	// its permit to one of them, in the script.
	waiters := []<-chan outcome{async(t, t.Context(), other.Acquire), async(t, t.Context(), other.Acquire)}
	clusterWaitLine(t, owner, k.Queue, 2)
	onlyOn(t, cl, owner, k, []string{k.Lease, k.Fence, k.Limit, k.Queue, k.Waiters})
	pending := waiters
	for i, g := range held {
		assert.Equal(t, distlock.Released, release(t, g), "release %d", i)
		o := firstOutcome(t, &pending, eventually, fmt.Sprint("a waiter after release ", i))
		require.NoError(t, o.err)
		assert.Greater(t, o.g.Token(), last, "token of the permit passed by release %d", i)
		last = o.g.Token()
		held[i] = o.g
	}
	for _, g := range held {
		assert.Equal(t, distlock.Released, release(t, g))
	}
	assert.Empty(t, keysOn(t, owner, k.Queue+"*"), "the line outlived its waiters")
}

// firstOutcome returns the first outcome of any of the channels in chs,
// and removes that channel from chs.
func firstOutcome(t *testing.T, chs *[]<-chan outcome, within time.Duration, what string) outcome {
	t.Helper()
	deadline := time.After(within)
	for {
		for i, ch := range *chs {
			select {
			case o := <-ch:
				*chs = append((*chs)[:i:i], (*chs)[i+1:]...)
				return o
			default:
			}
		}
		select {
		case <-deadline:
			t.Fatalf("%s: no result within %v", what, within)
		case <-time.After(pollEvery):
		}
	}
}

// A holder that stops renewing gives its permit back when its lease ends,
// with nobody releasing it: a waiter in another client takes it.
func clusterSemaphoreHolderThatStops(t *testing.T, lib Library, cl *redistest.Cluster) {
	const name, hold = "pool-stop", time.Second
	target := Target{Cluster: cl.Addrs()}
	first := newSemaphore(t, lib.Connect(t, target), name, 1, distlock.WithTTL(hold))
	second := newSemaphore(t, lib.Connect(t, target), name, 1, distlock.WithTTL(longTTL))
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
}

// A read-write lock's keys and wake channels share one slot, and every
// script (acquire, release passing to a run of readers, downgrade) runs
// there without CROSSSLOT; the grants reach waiters of another client
// through sharded pub/sub on the slot's primary.
func clusterRWMutex(t *testing.T, lib Library, cl *redistest.Cluster) {
	const name = "config"
	k, err := lease.NewKeys(distlock.DefaultNamespace, name)
	require.NoError(t, err)
	owner := cl.PrimaryOf(k.Lease)
	target := Target{Cluster: cl.Addrs()}
	writer := newRWMutex(t, lib.Connect(t, target), name, distlock.WithTTL(longTTL))
	readers := newRWMutex(t, lib.Connect(t, target), name, distlock.WithTTL(longTTL))

	w, err := writer.Lock(t.Context())
	require.NoError(t, err)
	pending := []<-chan outcome{async(t, t.Context(), readers.RLock), async(t, t.Context(), readers.RLock)}
	clusterWaitLine(t, owner, k.Queue, 2)
	onlyOn(t, cl, owner, k, []string{k.Lease, k.Fence, k.Queue, k.Waiters})
	// The downgrade grants both readers at once, in the script.
	require.NoError(t, w.Downgrade(t.Context()))
	var rs []*distlock.Guard
	for range 2 {
		o := firstOutcome(t, &pending, eventually, "a reader in line, after the downgrade")
		require.NoError(t, o.err)
		assert.Greater(t, o.g.Token(), w.Token())
		rs = append(rs, o.g)
	}
	_, err = writer.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "a writer while three read")
	for _, g := range append(rs, w) {
		assert.Equal(t, distlock.Released, release(t, g))
	}
	assert.Equal(t, []string{k.Fence}, keysOn(t, owner, k.Lease+"*"), "keys left after the last release: the fencing key alone")
}

func clusterElection(t *testing.T, lib Library, cl *redistest.Cluster) {
	const name = "leader"
	k, err := lease.NewKeys(distlock.DefaultNamespace, name)
	require.NoError(t, err)
	owner := cl.PrimaryOf(k.Lease)
	target := Target{Cluster: cl.Addrs()}
	elect := func() *distlock.Election {
		return newElection(t, lib.Connect(t, target), name, distlock.WithTTL(longTTL))
	}
	a, b, watcher := elect(), elect(), elect()
	octx, stop := context.WithCancel(t.Context())
	defer stop()
	obs := watcher.Observe(octx)
	assert.True(t, nextLeader(t, obs, eventually, func(distlock.Leader) bool { return true }).IsZero(), "nobody leads yet")
	// The observer listens on the slot's primary, where the scripts
	// publish (or anywhere, without sharded pub/sub).
	require.Eventually(t, func() bool { return len(clusterSubscribed(t, cl, owner, k.Leader)) == 1 },
		eventually, pollEvery, "the observer never subscribed on the election's primary")

	ga, err := a.Campaign(t.Context(), "a:1")
	require.NoError(t, err)
	la := nextLeader(t, obs, eventually, func(l distlock.Leader) bool { return l.Value == "a:1" })
	assert.Equal(t, ga.Token(), la.Token)

	got := async(t, t.Context(), func(ctx context.Context) (*distlock.Guard, error) { return b.Campaign(ctx, "b:1") })
	clusterWaitLine(t, owner, k.Queue, 1)
	assert.Equal(t, distlock.Released, release(t, ga))
	lb := nextLeader(t, obs, eventually, func(l distlock.Leader) bool { return l.Value == "b:1" })
	o := await(t, got, eventually, "the candidate in line after the release")
	require.NoError(t, o.err)
	gb := o.g
	assert.Equal(t, gb.Token(), lb.Token)
	assert.Greater(t, lb.Token, la.Token)
	now, err := a.Leader(t.Context())
	require.NoError(t, err)
	assert.Equal(t, lb.Value, now.Value, "Leader from another client")
	assert.Equal(t, lb.Token, now.Token, "Leader from another client")

	assert.Equal(t, distlock.Released, release(t, gb))
	nextLeader(t, obs, eventually, func(l distlock.Leader) bool { return l.IsZero() })
	stop()
	drainLeaders(obs)
}

// acquireWatch records the attempts of the last acquisition.
type acquireWatch struct {
	mu   sync.Mutex
	last distlock.AcquireInfo
}

func (w *acquireWatch) ObserveAcquire(i distlock.AcquireInfo) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = i
}

func (w *acquireWatch) ObserveRenew(distlock.RenewInfo)           {}
func (w *acquireWatch) ObserveTransition(distlock.TransitionInfo) {}

func (w *acquireWatch) attempts() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last.Attempts
}

// clusterTTL is the lease of the locks held across a failover or a slot
// migration: renewed every 800ms, so the test sees several renewals soon.
const clusterTTL = 2400 * time.Millisecond

// lossWatch counts, per lock, the renewals that ended and the transitions
// to Lost, through the Observer hook.
type lossWatch struct {
	mu      sync.Mutex
	renewed map[string]int // successful renewals per key
	errs    []error
	lost    []distlock.TransitionInfo
}

func newLossWatch() *lossWatch { return &lossWatch{renewed: make(map[string]int)} }

func (w *lossWatch) ObserveAcquire(distlock.AcquireInfo) {}

func (w *lossWatch) ObserveRenew(i distlock.RenewInfo) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i.Err != nil {
		w.errs = append(w.errs, i.Err)
		return
	}
	w.renewed[i.Key]++
}

func (w *lossWatch) ObserveTransition(i distlock.TransitionInfo) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i.To == distlock.Lost {
		w.lost = append(w.lost, i)
	}
}

// snapshot returns the renewal counts and every failure so far.
func (w *lossWatch) snapshot() (map[string]int, []error, []distlock.TransitionInfo) {
	w.mu.Lock()
	defer w.mu.Unlock()
	renewed := make(map[string]int, len(w.renewed))
	for k, v := range w.renewed {
		renewed[k] = v
	}
	return renewed, append([]error(nil), w.errs...), append([]distlock.TransitionInfo(nil), w.lost...)
}

// waitRenewals waits until every key has renewed at least n more times than
// in base.
func (w *lossWatch) waitRenewals(t *testing.T, keys []string, base map[string]int, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		now, _, _ := w.snapshot()
		for _, k := range keys {
			if now[k] < base[k]+n {
				return false
			}
		}
		return true
	}, 10*time.Second, pollEvery, "locks did not renew %d times", n)
}

// held is a lock held by a test: its name and guard.
type held struct {
	name string
	g    *distlock.Guard
}

// holdAcross acquires a lock for each name, alternately without and with
// replica acknowledgement, all observed by w.
func holdAcross(t *testing.T, c Client, w *lossWatch, names ...string) []held {
	t.Helper()
	var hs []held
	for i, name := range names {
		opts := []distlock.Option{distlock.WithTTL(clusterTTL), distlock.WithObserver(w), distlock.WithLogger(testLogger(t))}
		if i%2 == 1 {
			opts = append(opts, distlock.WithReplicaAck(1, ackTimeout))
		}
		g, err := newMutex(t, c, name, opts...).TryLock(t.Context())
		require.NoError(t, err)
		hs = append(hs, held{name: name, g: g})
	}
	return hs
}

func keysOf(hs []held) []string {
	keys := make([]string, len(hs))
	for i, h := range hs {
		keys[i] = h.g.Key()
	}
	return keys
}

// checkKept checks that every lock in hs is still held: no guard reported
// Lost, each reports Acquired with a live context, and nobody else can take
// the lock. A loss or a failed renewal since from, while p measured at
// least the time it had to spare (a renewal's budget; for a renewal alone,
// the replica's acknowledgement timeout), may be the machine's doing: the
// test then releases every guard and skips, saying so.
func checkKept(t *testing.T, p *schedProbe, from time.Time, c Client, w *lossWatch, hs []held) {
	t.Helper()
	_, errs, lost := w.snapshot()
	if len(lost) > 0 || len(errs) > 0 {
		budget := renewalBudget(clusterTTL)
		if len(lost) == 0 {
			budget = ackTimeout
		}
		if late := p.delay(from, time.Now()); late >= budget {
			for _, h := range hs {
				_, _ = h.g.Release(context.WithoutCancel(t.Context()))
			}
		}
		skipIfStarved(t, p, from, budget, fmt.Sprintf("%d guards reported Lost and %d renewals failed (%v)", len(lost), len(errs), errs))
		if late := p.delay(from, time.Now()); len(lost) == 0 && late >= ackTimeout/3 && allTimeouts(errs) {
			// The servers wait for CPUs as this process does, and the
			// probe sees only this process: on a machine loaded enough to
			// keep it from running for a third of the replicas' timeout, a
			// failover's renewals may time out on the servers' side (the
			// new replica syncing). A renewal that timed out is reported
			// and sent again while the lease holds (L1b); the guards are
			// checked below to be Acquired, and nobody else to get in.
			t.Logf("%d renewals timed out (%v) while the probe measured a scheduling delay of %v: a loaded machine; "+
				"no guard was Lost", len(errs), errs, late.Round(time.Millisecond))
			errs = nil
		}
	}
	assert.Empty(t, lost, "guards reported Lost")
	assert.Empty(t, errs, "renewals failed")
	for _, h := range hs {
		assert.Equal(t, distlock.Acquired, h.g.State(), "guard of %s", h.name)
		assert.NoError(t, h.g.Context().Err(), "context of %s", h.name)
		_, err := newMutex(t, c, h.name).TryLock(t.Context())
		assert.ErrorIs(t, err, distlock.ErrNotAcquired, "someone else took %s", h.name)
	}
}

// namesOn returns n lock names of the form prefix-i whose slots the
// primary p serves.
func namesOn(t *testing.T, cl *redistest.Cluster, p *redistest.Server, prefix string, n int) []string {
	t.Helper()
	var names []string
	for i := 0; len(names) < n; i++ {
		name := fmt.Sprint(prefix, "-", i)
		k, err := lease.NewKeys(distlock.DefaultNamespace, name)
		require.NoError(t, err)
		if cl.PrimaryOf(k.Lease) == p {
			names = append(names, name)
		}
	}
	return names
}

// clusterFailoverKeepsLocks holds locks on every primary, with and without
// replica acknowledgement, and fails one primary over to its replica with
// CLUSTER FAILOVER. The replica has every write of the old primary by then
// (a manual failover waits for it), so every lock survives: no guard may
// report Lost, the locks renew on the new primary, and nobody else can
// take them. A client that has not seen the change yet (it learnt the
// layout before, and its next commands are the renewals after the
// failover) reaches the new primary through MOVED, for plain and for
// acknowledged writes; a waiter stands in line across the failover.
func clusterFailoverKeepsLocks(t *testing.T, lib Library, cl *redistest.Cluster, c Client) {
	target := Target{Cluster: cl.Addrs()}
	w := newLossWatch()
	var names []string
	for i := range 12 {
		names = append(names, fmt.Sprint("failover-", i))
	}
	p, from := startSchedProbe(t), time.Now()
	hs := holdAcross(t, c, w, names...)
	old := cl.PrimaryOf(hs[0].g.Key())
	replica := cl.ReplicasOf(old)
	require.Len(t, replica, 1)
	// The stale client holds a plain and an acknowledged lock on the
	// primary that fails over.
	stale := lib.Connect(t, target)
	staleHeld := holdAcross(t, stale, w, namesOn(t, cl, old, "stale", 2)...)
	hs = append(hs, staleHeld...)
	keys := keysOf(hs)
	var onOld []held
	for _, h := range hs {
		if cl.PrimaryOf(h.g.Key()) == old {
			onOld = append(onOld, h)
		}
	}
	base, _, _ := w.snapshot()
	w.waitRenewals(t, keys, base, 1)
	// A waiter of another process stands in line, across the failover, for
	// a lock on the primary that fails over.
	waiterCtx, cancelWaiter := context.WithCancel(t.Context())
	defer cancelWaiter()
	waiter := lockAsync(t, waiterCtx, newMutex(t, lib.Connect(t, target), onOld[0].name))
	waitUntil(t, eventually, func() bool {
		n, err := old.MustDo("ZCARD", onOld[0].g.Key()+":queue").ToInt64()
		return err == nil && n == 1
	}, func() string { return "the waiter never stood in line" })

	base, _, _ = w.snapshot()
	cl.Failover(replica[0])
	require.Equal(t, replica[0], cl.PrimaryOf(onOld[0].g.Key()), "the replica should serve the slot now")

	// Every guard renews twice more, without a single failure, and the
	// moved leases are on the new primary.
	w.waitRenewals(t, keys, base, 2)
	checkKept(t, p, from, c, w, hs)
	for _, h := range onOld {
		assert.Equal(t, []string{h.g.Key()}, keysOn(t, replica[0], h.g.Key()), "lease on the new primary")
	}
	for _, h := range hs {
		assert.Equal(t, distlock.Released, release(t, h.g))
	}
	o := await(t, waiter, 2*eventually, "the waiter after the failover")
	require.NoError(t, o.err, "the waiter across the failover")
	assert.Equal(t, distlock.Released, release(t, o.g))
}

// clusterReshardingKeepsLocks moves the slots of held locks to other
// primaries, pausing half-way. Two locks (one plain, one with replica
// acknowledgement) have their lease key moved and their fencing key not
// yet: their renewals get ASK while the slot migrates and MOVED after, and
// neither may show as a loss. An acquisition half-way gets TRYAGAIN (its
// two keys are on two nodes), which it retries until the migration is
// over. A third lock, whose keys have not moved, is released half-way: the
// release script names the release channel as a key, which is never
// present, so it gets TRYAGAIN as well, and retries until the migration is
// over.
func clusterReshardingKeepsLocks(t *testing.T, lib Library, cl *redistest.Cluster, c Client) {
	w := newLossWatch()
	p, from := startSchedProbe(t), time.Now()
	hs := holdAcross(t, c, w, "reshard-plain", "reshard-acked", "reshard-release")
	keys := keysOf(hs)
	base, _, _ := w.snapshot()
	w.waitRenewals(t, keys, base, 1)
	// A waiter of another process stands in line for the lock released
	// half-way, and waits across the migration: its refreshes get TRYAGAIN
	// and its room's subscription is moved off the old primary.
	waiterCtx, cancelWaiter := context.WithCancel(t.Context())
	defer cancelWaiter()
	waiter := lockAsync(t, waiterCtx, newMutex(t, lib.Connect(t, Target{Cluster: cl.Addrs()}), hs[2].name))
	waitUntil(t, eventually, func() bool {
		n, err := cl.PrimaryOf(keys[2]).MustDo("ZCARD", keys[2]+":queue").ToInt64()
		return err == nil && n == 1
	}, func() string { return "the waiter never stood in line" })

	var migs []*redistest.Migration
	for i, k := range keys {
		from := cl.PrimaryOf(k)
		var to *redistest.Server
		for _, p := range cl.Primaries() {
			if p != from {
				to = p
				break
			}
		}
		m := cl.StartMigration(cl.Slot(k), to)
		if i < 2 {
			m.Move(k) // the lease moves; its fencing key stays behind for now
		}
		migs = append(migs, m)
	}
	moving := hs[:2]
	base, _, _ = w.snapshot()
	w.waitRenewals(t, keys, base, 2)
	_, errs, lost := w.snapshot()
	assert.Empty(t, lost, "guards reported Lost while their slots migrate")
	assert.Empty(t, errs, "renewals failed while their slots migrate")
	for _, h := range hs {
		assert.Equal(t, distlock.Acquired, h.g.State(), "guard of %s", h.name)
	}

	// tryAgains counts the TRYAGAIN replies of both ends of migration m.
	// Redis 7.0 and later answer a script whose keys are partly moved
	// with TRYAGAIN at the source; Redis 6.2 answers ASK there, and
	// TRYAGAIN at the target, which has the rest of the keys missing.
	tryAgains := func(m *redistest.Migration) int {
		var sum int
		for _, n := range []*redistest.Server{m.From(), m.To()} {
			stats, err := n.Info("errorstats")
			require.NoError(t, err)
			var count int
			_, _ = fmt.Sscanf(stats["errorstat_TRYAGAIN"], "count=%d", &count)
			sum += count
		}
		return sum
	}
	// A competitor half-way: Redis answers TRYAGAIN until the fencing key
	// has moved too, and then the lock is found held.
	before := tryAgains(migs[0])
	competitor := async(t, t.Context(), newMutex(t, c, hs[0].name).TryLock)
	require.Eventually(t, func() bool { return tryAgains(migs[0]) > before }, eventually, pollEvery,
		"the competitor never got TRYAGAIN")
	// A release half-way.
	type released struct {
		st  distlock.State
		err error
	}
	releasedc := make(chan released, 1)
	before = tryAgains(migs[2])
	go func() {
		st, err := hs[2].g.Release(t.Context())
		releasedc <- released{st, err}
	}()
	require.Eventually(t, func() bool { return tryAgains(migs[2]) > before }, eventually, pollEvery,
		"the release never got TRYAGAIN")

	for i, m := range migs {
		if i < 2 {
			m.Move(keys[i] + ":fence")
		} else {
			m.Move(keys[i], keys[i]+":fence", keys[i]+":queue", keys[i]+":waiters")
		}
		m.Finish()
	}
	oc := await(t, competitor, eventually, "the competitor after the migration")
	require.ErrorIs(t, oc.err, distlock.ErrNotAcquired, "competitor after the migration")
	select {
	case r := <-releasedc:
		require.NoError(t, r.err, "release across the migration")
		assert.Equal(t, distlock.Released, r.st)
	case <-time.After(eventually):
		t.Fatal("the release is still waiting after the migration")
	}
	o := await(t, waiter, 2*eventually, "the waiter after the migration")
	require.NoError(t, o.err, "the waiter across the migration")
	assert.Equal(t, migs[2].To(), cl.PrimaryOf(keys[2]))
	assert.Equal(t, distlock.Released, release(t, o.g))
	assert.Empty(t, keysOn(t, migs[2].To(), keys[2]), "the released lease is still there")

	base, _, _ = w.snapshot()
	w.waitRenewals(t, keysOf(moving), base, 2)
	checkKept(t, p, from, c, w, moving)
	for i, h := range moving {
		assert.NotEqual(t, migs[i].From(), cl.PrimaryOf(h.g.Key()), "slot of %s did not move", h.name)
		assert.Equal(t, distlock.Released, release(t, h.g))
	}
}

// allTimeouts reports whether every error in errs is a call's deadline:
// its context's, or the client's own timeout (lease.IsTimeout).
func allTimeouts(errs []error) bool {
	for _, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) && !lease.IsTimeout(err) {
			return false
		}
	}
	return true
}
