package distlock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// TestCluster runs distlock on a Redis Cluster of three primaries, each with
// one replica, built by redis-cli --cluster create. The cluster is built
// once and shared by the subtests, which run in order: some of them move
// slots or primaries around, and each leaves the cluster settled.
func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 1)
	c := cl.Client()

	t.Run("KeysShareASlot", func(t *testing.T) {
		for _, name := range []string{"job", "a:b", "with space", "ünïcødé", "x"} {
			k, err := lease.NewKeys("distlock", name)
			require.NoError(t, err)
			slot := cl.Slot(k.Lease)
			assert.Equal(t, slot, cl.Slot(k.Fence), "slot of %s", k.Fence)
			for _, key := range []string{k.Queue, k.Waiters, k.WakeChannel("0123456789abcdef")} {
				assert.Equal(t, slot, cl.Slot(key), "slot of %s", key)
			}
		}
	})

	t.Run("LocksSpreadOverPrimaries", func(t *testing.T) {
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
	})

	t.Run("Contention", func(t *testing.T) {
		// Each worker has its own client, as separate processes would.
		checkContention(t, func(int) rueidis.Client { return cl.Client() }, "contended", 4, 8)
	})

	t.Run("WaiterHearsReleaseOnTheShard", func(t *testing.T) {
		// A waiter in another process (another client) subscribes to its
		// room's wake channel with SSUBSCRIBE, on the primary that serves
		// the lock's slot, and the release script publishes the grant there.
		// While subscribed, the waiter does not poll: besides its first
		// call, it only refreshes its place every half claim window.
		obs := &acquireWatch{}
		ma := newMutex(t, cl.Client(), "notify", distlock.WithTTL(30*time.Second))
		mb := newMutex(t, cl.Client(), "notify", distlock.WithObserver(obs))
		ga, err := ma.Lock(t.Context())
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel() // before the wait: it ends a Lock still waiting
		got := make(chan *distlock.Guard, 1)
		wg.Go(func() {
			g, err := mb.Lock(ctx)
			assert.NoError(t, err)
			got <- g
		})
		k, err := lease.NewKeys(distlock.DefaultNamespace, "notify")
		require.NoError(t, err)
		owner := cl.PrimaryOf(k.Lease)
		require.Eventually(t, func() bool {
			chans, err := owner.MustDo("PUBSUB", "SHARDCHANNELS", k.Wake+":*").AsStrSlice()
			return err == nil && len(chans) == 1
		}, eventually, pollEvery, "the waiter never subscribed on the lock's primary")

		const hold = 300 * time.Millisecond // six polls' worth at the default interval
		// The first call, one after the subscription is confirmed, the
		// refreshes of the hold, and one to spare for a slow machine.
		maxAttempts := 3 + int(hold/(distlock.DefaultClaimWindow/2))
		time.Sleep(hold)
		start := time.Now()
		release(t, ga)
		var gb *distlock.Guard
		select {
		case gb = <-got:
		case <-time.After(eventually):
			t.Fatal("the waiter did not acquire after the release")
		}
		require.NotNil(t, gb)
		assert.Less(t, time.Since(start), 10*time.Second, "the waiter took as long as the holder's lease")
		// Polling would have made one every 50ms.
		assert.LessOrEqual(t, obs.attempts(), maxAttempts, "attempts of the waiter")
		release(t, gb)
	})

	t.Run("ReplicaAckGoesToTheSlotsPrimary", func(t *testing.T) {
		// WAIT has no key, so only the lease key can route it: if it went to
		// another primary, it would count that primary's replica, which
		// never saw the write. Stopping the replica of the lock's own
		// primary must make the acquisition fail; a lock on another primary
		// is unaffected.
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
	})

	t.Run("FailoverKeepsLocks", func(t *testing.T) {
		failoverKeepsLocks(t, cl, c)
	})

	t.Run("ReshardingKeepsLocks", func(t *testing.T) {
		reshardingKeepsLocks(t, cl, c)
	})
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

// keysOn returns the keys matching pattern on node n alone, whatever slots
// it serves (KEYS is never redirected). It reports errors to t, which may
// be a subtest of the one that started the node.
func keysOn(t *testing.T, n *redistest.Server, pattern string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), eventually)
	defer cancel()
	msg, err := n.Do(ctx, "KEYS", pattern)
	require.NoError(t, err, "KEYS %s on %s", pattern, n.Addr())
	keys, err := msg.AsStrSlice()
	require.NoError(t, err)
	return keys
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
func holdAcross(t *testing.T, c rueidis.Client, w *lossWatch, names ...string) []held {
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
// the lock.
func checkKept(t *testing.T, c rueidis.Client, w *lossWatch, hs []held) {
	t.Helper()
	_, errs, lost := w.snapshot()
	assert.Empty(t, lost, "guards reported Lost")
	assert.Empty(t, errs, "renewals failed")
	for _, h := range hs {
		assert.Equal(t, distlock.Acquired, h.g.State(), "guard of %s", h.name)
		assert.NoError(t, h.g.Context().Err(), "context of %s", h.name)
		_, err := newMutex(t, c, h.name).TryLock(t.Context())
		assert.ErrorIs(t, err, distlock.ErrNotAcquired, "someone else took %s", h.name)
	}
}

// failoverKeepsLocks holds locks on every primary, with and without replica
// acknowledgement, and fails one primary over to its replica with CLUSTER
// FAILOVER. The replica has every write of the old primary by then (a
// manual failover waits for it), so every lock survives: no guard may
// report Lost, the locks renew on the new primary, and nobody else can take
// them. A client that has not seen the change yet reaches the new primary
// through MOVED, for plain and for acknowledged writes.
func failoverKeepsLocks(t *testing.T, cl *redistest.Cluster, c rueidis.Client) {
	w := newLossWatch()
	var names []string
	for i := range 12 {
		names = append(names, fmt.Sprint("failover-", i))
	}
	hs := holdAcross(t, c, w, names...)
	keys := keysOf(hs)

	// A second client that learns the layout now and then sends nothing
	// until after the failover: its slot map is stale.
	stale := cl.Client()
	ack, err := lease.NewWithAck(stale, lease.Ack{Replicas: 1, Timeout: ackTimeout})
	require.NoError(t, err)
	plain := lease.New(stale)
	sk, err := lease.NewKeys("stale", "moved")
	require.NoError(t, err)
	g, err := plain.Acquire(t.Context(), sk, "s#1", time.Minute)
	require.NoError(t, err)
	require.True(t, g.Acquired)

	// Fail over the primary of the stale client's key; some of the held
	// locks live there too.
	old := cl.PrimaryOf(sk.Lease)
	replica := cl.ReplicasOf(old)
	require.Len(t, replica, 1)
	var onOld []held
	for _, h := range hs {
		if cl.PrimaryOf(h.g.Key()) == old {
			onOld = append(onOld, h)
		}
	}
	require.NotEmpty(t, onOld, "no lock on the primary that fails over")
	base, _, _ := w.snapshot()
	w.waitRenewals(t, keys, base, 1)
	// A waiter of another process stands in line, across the failover, for
	// a lock on the primary that fails over.
	waiterCtx, cancelWaiter := context.WithCancel(t.Context())
	defer cancelWaiter()
	waiter := lockAsync(t, waiterCtx, newMutex(t, cl.Client(), onOld[0].name))
	require.Eventually(t, func() bool {
		n, err := old.MustDo("ZCARD", onOld[0].g.Key()+":queue").ToInt64()
		return err == nil && n == 1
	}, eventually, pollEvery, "the waiter never stood in line")

	base, _, _ = w.snapshot()
	cl.Failover(replica[0])
	require.Equal(t, replica[0], cl.PrimaryOf(sk.Lease), "the replica should serve the slot now")

	// The stale client: a renewal with acknowledgement goes to the old
	// primary (now a replica), gets MOVED, and is redone with WAIT on the
	// new primary, whose replica is the old primary.
	ctx, cancel := context.WithTimeout(t.Context(), eventually)
	defer cancel()
	r, err := ack.Renew(ctx, sk, "s#1", time.Minute)
	require.NoError(t, err, "acknowledged renewal through a stale slot map")
	assert.True(t, r.OK)
	r, err = plain.Renew(ctx, sk, "s#1", time.Minute)
	require.NoError(t, err, "plain renewal through a stale slot map")
	assert.True(t, r.OK)
	rel, err := plain.Release(ctx, sk, "s#1")
	require.NoError(t, err)
	assert.True(t, rel.Deleted)

	// Every guard renews twice more, without a single failure, and the
	// moved leases are on the new primary.
	w.waitRenewals(t, keys, base, 2)
	checkKept(t, c, w, hs)
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

// reshardingKeepsLocks moves the slots of held locks to other primaries,
// pausing half-way. Two locks (one plain, one with replica acknowledgement)
// have their lease key moved and their fencing key not yet: their renewals
// get ASK while the slot migrates and MOVED after, and neither may show as a
// loss. An acquisition half-way gets TRYAGAIN (its two keys are on two
// nodes), which it retries until the migration is over. A third lock, whose
// keys have not moved, is released half-way: the release script names the
// release channel as a key, which is never present, so it gets TRYAGAIN as
// well, and retries until the migration is over.
func reshardingKeepsLocks(t *testing.T, cl *redistest.Cluster, c rueidis.Client) {
	w := newLossWatch()
	hs := holdAcross(t, c, w, "reshard-plain", "reshard-acked", "reshard-release")
	keys := keysOf(hs)
	base, _, _ := w.snapshot()
	w.waitRenewals(t, keys, base, 1)
	// A waiter of another process stands in line for the lock released
	// half-way, and waits across the migration: its refreshes get TRYAGAIN
	// and its room's subscription is moved off the old primary.
	waiterCtx, cancelWaiter := context.WithCancel(t.Context())
	defer cancelWaiter()
	waiter := lockAsync(t, waiterCtx, newMutex(t, cl.Client(), hs[2].name))
	require.Eventually(t, func() bool {
		n, err := cl.PrimaryOf(keys[2]).MustDo("ZCARD", keys[2]+":queue").ToInt64()
		return err == nil && n == 1
	}, eventually, pollEvery, "the waiter never stood in line")

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

	// tryAgains counts the TRYAGAIN replies of node n.
	tryAgains := func(n *redistest.Server) int {
		stats, err := n.Info("errorstats")
		require.NoError(t, err)
		var count int
		_, _ = fmt.Sscanf(stats["errorstat_TRYAGAIN"], "count=%d", &count)
		return count
	}
	// A competitor half-way: Redis answers TRYAGAIN until the fencing key
	// has moved too, and then the lock is found held.
	before := tryAgains(migs[0].From())
	competitor := make(chan error, 1)
	go func() {
		_, err := newMutex(t, c, hs[0].name).TryLock(t.Context())
		competitor <- err
	}()
	require.Eventually(t, func() bool { return tryAgains(migs[0].From()) > before }, eventually, pollEvery,
		"the competitor never got TRYAGAIN")
	// A release half-way.
	type outcome struct {
		st  distlock.State
		err error
	}
	released := make(chan outcome, 1)
	before = tryAgains(migs[2].From())
	go func() {
		st, err := hs[2].g.Release(t.Context())
		released <- outcome{st, err}
	}()
	require.Eventually(t, func() bool { return tryAgains(migs[2].From()) > before }, eventually, pollEvery,
		"the release never got TRYAGAIN")

	for i, m := range migs {
		if i < 2 {
			m.Move(keys[i] + ":fence")
		} else {
			m.Move(keys[i], keys[i]+":fence", keys[i]+":queue", keys[i]+":waiters")
		}
		m.Finish()
	}
	select {
	case err := <-competitor:
		require.ErrorIs(t, err, distlock.ErrNotAcquired, "competitor after the migration")
	case <-time.After(eventually):
		t.Fatal("the competitor is still waiting after the migration")
	}
	select {
	case r := <-released:
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
	checkKept(t, c, w, moving)
	for i, h := range moving {
		assert.NotEqual(t, migs[i].From(), cl.PrimaryOf(h.g.Key()), "slot of %s did not move", h.name)
		assert.Equal(t, distlock.Released, release(t, h.g))
	}
}
