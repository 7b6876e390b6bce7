package distlock_test

// MultiMutex on a Redis Cluster (issue 25): names spread over three
// primaries, so that a set is taken one slot (one script) at a time. The
// tests check that giving up mid-way gives back what the set held at once,
// that a slot migrating under a set neither stops it nor makes two holders,
// and that sets over shared names, given in opposite orders, never
// deadlock and never share a name.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// Timing of the Cluster tests of MultiMutex.
const (
	// mcHoldTTL is the TTL of holds that must not run out during a test.
	mcHoldTTL = 6 * time.Second
	// mcCancelClaim is the claim window of the set that gives up: the
	// names it holds while it waits lapse only after it, far later than
	// mcFreeBound, so a name free within that bound was given back.
	mcCancelClaim = 2 * time.Second
	// mcFreeBound is issue 25's bound: the names a set held while it
	// waited are free this soon after its Lock gave up.
	mcFreeBound = 100 * time.Millisecond
	// mcGiveUp bounds how long Lock takes to return once its ctx is
	// cancelled: a scheduling delay on a loaded machine, not a network
	// wait (the suite's giveUpBound).
	mcGiveUp = 200 * time.Millisecond
)

// mcKey returns the lease key of name, as a Mutex of the default namespace
// has it.
func mcKey(name string) string { return distlock.DefaultNamespace + ":{" + name + "}" }

// mcNames returns perNode names of the form prefix-i on every primary of
// cl, in the order a set takes them (by slot, see lease.SortSet), and the
// primary of each.
func mcNames(t *testing.T, cl *redistest.Cluster, prefix string, perNode int) ([]string, []*redistest.Server) {
	t.Helper()
	primaries := cl.Primaries()
	count := map[*redistest.Server]int{}
	var ks []lease.Keys
	for i := 0; len(ks) < perNode*len(primaries); i++ {
		name := fmt.Sprint(prefix, "-", i)
		node := cl.PrimaryOf(mcKey(name))
		if count[node] == perNode {
			continue
		}
		count[node]++
		k, err := lease.NewKeys(distlock.DefaultNamespace, name)
		require.NoError(t, err)
		ks = append(ks, k)
	}
	require.NoError(t, lease.SortSet(ks))
	names := make([]string, len(ks))
	nodes := make([]*redistest.Server, len(ks))
	for i, k := range ks {
		names[i] = k.Lease[len(distlock.DefaultNamespace)+2 : len(k.Lease)-1]
		nodes[i] = cl.PrimaryOf(k.Lease)
	}
	return names, nodes
}

// mcOwnerOn returns the owner (WithOwner) of the lease of name on node, ""
// when the name is free there.
func mcOwnerOn(t *testing.T, node *redistest.Server, name string) string {
	t.Helper()
	v, ok := get(t, node, mcKey(name))
	if !ok {
		return ""
	}
	return lease.Owner(v)
}

// mcHolders records, in memory, who believes it holds each name: a
// holder takes its names once its Lock has returned and drops them before
// it calls Release, so a name taken while another holds it is an overlap
// that Redis let happen.
type mcHolders struct {
	mu       sync.Mutex
	by       map[string]string
	overlaps []string
}

func (h *mcHolders) take(who string, names ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.by == nil {
		h.by = map[string]string{}
	}
	for _, n := range names {
		if other, ok := h.by[n]; ok {
			h.overlaps = append(h.overlaps, fmt.Sprintf("%s: %s took %s while %s held it", time.Now().Format("15:04:05.000000"), who, n, other))
		}
		h.by[n] = who
	}
}

func (h *mcHolders) drop(who string, names ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range names {
		if h.by[n] == who {
			delete(h.by, n)
		}
	}
}

func (h *mcHolders) check(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	assert.Empty(t, h.overlaps, "two holders of one name")
}

// TestMultiMutexCluster runs the MultiMutex on a Redis Cluster of three
// primaries (no replicas), built once for its subtests, which run in
// order; each uses names of its own, and each migration leaves the
// cluster settled.
//
// The cluster is shared, one start for all, with the fairness test
// (multi_fair_test.go) and the holder cut off from one node
// (multi_fault_test.go), which run here as subtests.
func TestMultiMutexCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	t.Run("FairOverSlots", func(t *testing.T) { mcFair(t, cl) })
	t.Run("HolderCutOffFromOneNode", func(t *testing.T) { mfCutOff(t, cl) })
	t.Run("CancelGivesEverythingBack", func(t *testing.T) { mcCancel(t, cl) })
	t.Run("KeepsHeldNamesWhileWaiting", func(t *testing.T) { mcKeepsHeld(t, cl) })
	t.Run("OppositeOrders", func(t *testing.T) { mcOppositeOrders(t, cl) })
	t.Run("SlotMigrates", func(t *testing.T) {
		for i, m := range mcMigrations {
			t.Run(m.name, func(t *testing.T) { mcSlotMigrates(t, cl, fmt.Sprint("mig", i), m.migrate, m.first) })
		}
	})
}

// Issue 25, on a Cluster: a Mutex holds b; a MultiMutex on {a, b, c}
// (one name on each primary, taken in that order) holds a and waits in
// b's line; its context is cancelled. Lock returns at once with
// context.Canceled; within 100 ms a and c can be taken by anyone; b's
// holder keeps its lease, untouched; and the set's place is gone from b's
// line (and from its waiters).
func mcCancel(t *testing.T, cl *redistest.Cluster) {
	names, nodes := mcNames(t, cl, "cancel", 1)
	a, b, c := names[0], names[1], names[2]

	// The tester's Mutexes, warmed up (topology, connections, scripts) so
	// that their TryLocks below take a round trip, not a dial.
	tester := cl.Client()
	ma, mc := newMutex(t, tester, a, distlock.WithTTL(mcHoldTTL)), newMutex(t, tester, c, distlock.WithTTL(mcHoldTTL))
	for _, m := range []*distlock.Mutex{ma, mc} {
		g, err := m.TryLock(t.Context())
		require.NoError(t, err)
		release(t, g)
	}

	gb, err := newMutex(t, cl.Client(), b, distlock.WithTTL(mcHoldTTL), distlock.WithOwner("holder")).Lock(t.Context())
	require.NoError(t, err)
	bValue, _ := get(t, nodes[1], mcKey(b))

	set, err := distlock.NewMultiMutex(cl.Client(), []string{c, a, b}, distlock.WithTTL(mcHoldTTL),
		distlock.WithClaimWindow(mcCancelClaim), distlock.WithOwner("set"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	result := acquireAsync(t, ctx, set.Lock)
	require.Eventually(t, func() bool {
		return inLine(t, nodes[1], mcKey(b)) == 1 && mcOwnerOn(t, nodes[0], a) == "set"
	}, eventually, pollEvery, "the set never held %s while waiting in %s's line", a, b)
	assert.Empty(t, mcOwnerOn(t, nodes[2], c), "the set holds %s, which comes after the name it waits for", c)
	setValue, _ := get(t, nodes[0], mcKey(a))

	cancelled := time.Now()
	cancel()
	o := await(t, result, time.Second, "the set's Lock after cancel")
	require.ErrorIs(t, o.Err(), context.Canceled)
	require.Nil(t, o.Guard())
	assert.Less(t, o.At().Sub(cancelled), mcGiveUp, "Lock took %v to give up", o.At().Sub(cancelled))

	// Anyone can take a and c within 100 ms of the cancel.
	var ga, gc *distlock.Guard
	for (ga == nil || gc == nil) && time.Since(cancelled) < mcCancelClaim/2 {
		if ga == nil {
			ga, _ = ma.TryLock(t.Context())
		}
		if gc == nil {
			gc, _ = mc.TryLock(t.Context())
		}
	}
	free := time.Since(cancelled)
	require.NotNil(t, ga, "%s could not be taken", a)
	require.NotNil(t, gc, "%s could not be taken", c)
	t.Logf("Lock returned %v after the cancel; %s and %s free %v after it", o.At().Sub(cancelled), a, c, free)
	assert.Less(t, free, mcFreeBound, "%s and %s were free %v after the cancel", a, c, free)

	// The set's place leaves b's line, and b's holder is untouched.
	require.Eventually(t, func() bool {
		return inLine(t, nodes[1], mcKey(b)) == 0 && !exists(t, nodes[1], mcKey(b)+":waiters")
	}, eventually, time.Millisecond, "the set's place is still in %s's line", b)
	gone := time.Since(cancelled)
	t.Logf("the set's place left %s's line %v after the cancel", b, gone)
	// (Each look is a command on a connection of its own, so the figure
	// includes the looks' own time; a place that lapsed rather than left
	// would take the claim window.)
	assert.Less(t, gone, mcCancelClaim/2, "the set's place left %s's line %v after the cancel", b, gone)
	// It leaves its void marker on the names it reached, a and b, and
	// nothing on c, which it never reached (issue 32).
	for i, n := range []string{a, b} {
		assert.True(t, exists(t, nodes[i], mcKey(n)+":void:"+setValue), "the set's void marker on %s", n)
	}
	assert.False(t, exists(t, nodes[2], mcKey(c)+":void:"+setValue), "the set voided %s, which it never reached", c)
	assert.Equal(t, distlock.Acquired, gb.State(), "%s's holder", b)
	got, _ := get(t, nodes[1], mcKey(b))
	assert.Equal(t, bValue, got, "%s's lease", b)
	pttl, err := nodes[1].MustDo("PTTL", mcKey(b)).AsInt64()
	require.NoError(t, err)
	assert.Greater(t, time.Duration(pttl)*time.Millisecond, mcHoldTTL/2, "%s's lease was shortened", b)
	for _, g := range []*distlock.Guard{gb, ga, gc} {
		assert.Equal(t, distlock.Released, release(t, g))
	}
}

// mcKeepWait is how long the set of mcKeepsHeld waits for its second
// name while it holds the first: eight claim windows of the default 500 ms,
// so each of the 16 renewals of the held name must come in time.
const mcKeepWait = 4 * time.Second

// Issue 31, fault 2: a set across groups keeps the names it holds while it
// waits, as long as every node answers. On a Cluster, a Mutex holds y; a
// MultiMutex on {x, y} (x on one primary, y on another; the set takes x
// first) holds x with its claim window (the default 500 ms) and stands in
// y's line; a Mutex asks for x after it, and waits in x's line. For 4 s
// x stays the set's and the later Mutex waits (before the fix the set's
// hold of x lapsed within a few claim windows: it gave x back, to the later
// Mutex, and started again). Once y's holder releases, the set holds both;
// once the set releases, the later Mutex gets x.
func mcKeepsHeld(t *testing.T, cl *redistest.Cluster) {
	names, nodes := mcNames(t, cl, "keep", 1)
	x, y := names[0], names[1]
	opts := func(owner string) []distlock.Option {
		return []distlock.Option{distlock.WithTTL(mcHoldTTL), distlock.WithOwner(owner)}
	}
	gy, err := newMutex(t, cl.Client(), y, opts("holder")...).Lock(t.Context())
	require.NoError(t, err)
	set, err := distlock.NewMultiMutex(cl.Client(), []string{y, x}, opts("set")...)
	require.NoError(t, err)
	setLock := acquireAsync(t, t.Context(), set.Lock)
	require.Eventually(t, func() bool {
		return inLine(t, nodes[1], mcKey(y)) == 1 && mcOwnerOn(t, nodes[0], x) == "set"
	}, eventually, pollEvery, "the set never held %s while waiting in %s's line", x, y)
	later := acquireAsync(t, t.Context(), newMutex(t, cl.Client(), x, opts("later")...).Lock)
	waitInLine(t, nodes[0], mcKey(x), 1)

	// The fault's length: the set waits for y while it holds x. Every look
	// at x's owner is a command of its own; any look must find the set.
	waiting := time.Now()
	looks := 0
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for ; time.Since(waiting) < mcKeepWait; looks++ {
		select {
		case o := <-later:
			t.Fatalf("the later Mutex took %s %v into the set's wait (err %v): the set let its hold lapse", x, o.At().Sub(waiting), o.Err())
		case o := <-setLock:
			t.Fatalf("the set's Lock returned while %s was held: %v", y, o.Err())
		case <-tick.C:
		}
		if owner := mcOwnerOn(t, nodes[0], x); owner != "set" {
			t.Fatalf("%s's owner %v into the set's wait: %q, want the set", x, time.Since(waiting), owner)
		}
	}
	t.Logf("%s stayed the set's for %v (%d looks)", x, time.Since(waiting), looks)

	assert.Equal(t, distlock.Released, release(t, gy))
	o := await(t, setLock, eventually, "the set's Lock once "+y+" was released")
	require.NoError(t, o.Err())
	for i, n := range []string{x, y} {
		assert.Equal(t, "set", mcOwnerOn(t, nodes[i], n), "owner of %s", n)
	}
	select {
	case o := <-later:
		t.Fatalf("the later Mutex took %s while the set held it: %v", x, o.Err())
	default:
	}
	assert.Equal(t, distlock.Released, release(t, o.Guard()))
	ol := await(t, later, eventually, "the later Mutex once the set released")
	require.NoError(t, ol.Err())
	assert.Equal(t, distlock.Released, release(t, ol.Guard()))
}

// Timing of the migration tests.
const (
	// mcMigClaim is the sets' claim window: the names a set holds while
	// it waits, and its place in line, last that long unless renewed; the
	// set refreshes its place every half of it.
	mcMigClaim = 250 * time.Millisecond
	// mcMigTTL is the TTL of the sets and the contender: a call that
	// takes the last name rides out TRYAGAIN for that long (less the
	// margin), far longer than mcMigOpen.
	mcMigTTL = 3 * time.Second
	// mcMigOpen is how long the slot stays half-moved: a few claim
	// windows, as a slot with many keys takes (redis-cli moves ten keys
	// per MIGRATE), and shorter than the TTLs and ReleaseTimeout.
	mcMigOpen = time.Second
)

// mcMigrations are the migrations of TestMultiMutexCluster/SlotMigrates:
// which name's slot moves (0, held by the set while it waits; 1, the one
// it waits for; 2, the one it takes last), and what moves at once (the
// lease key, the fencing key or nothing; the rest moves just before the
// slot changes hands, as redis-cli moves every key first).
var mcMigrations = []struct {
	name    string
	migrate int
	first   string // the key suffix moved at once; "-" for none
}{
	{"HeldNameLeaseMoved", 0, ""},
	{"WaitedNameNothingMoved", 1, "-"},
	{"NextNameFenceMoved", 2, ":fence"},
}

// mcMoveRest moves every key of slot still on mig's source to its target,
// as redis-cli does before it gives the slot to the target. A key may go
// (a release) between the listing and the move: MIGRATE then moves the
// others, or answers NOKEY when none is left.
func mcMoveRest(t *testing.T, mig *redistest.Migration, slot int) {
	t.Helper()
	keys, err := mig.From().MustDo("CLUSTER", "GETKEYSINSLOT", fmt.Sprint(slot), "1000").AsStrSlice()
	require.NoError(t, err)
	if len(keys) == 0 {
		return
	}
	args := append([]string{"MIGRATE", "127.0.0.1", fmt.Sprint(mig.To().Port()), "", "0", "5000", "KEYS"}, keys...)
	got, err := mig.From().MustDo(args...).ToString()
	require.NoError(t, err)
	require.Contains(t, []string{"OK", "NOKEY"}, got, "MIGRATE %v", keys)
}

// A slot of one of a set's names migrates to another primary while the
// set waits and acquires: the set's holds, its place in line and its
// calls meet ASK and TRYAGAIN until the migration ends, which takes longer
// than the set's claim window. The set must still get every name (the
// holder of b releases it mid-migration), keep them, renew them and
// release them, and nobody may hold a name the set holds (a contender
// keeps trying to take each name, and every holder is recorded in memory).
func mcSlotMigrates(t *testing.T, cl *redistest.Cluster, prefix string, migrate int, first string) {
	names, nodes := mcNames(t, cl, prefix, 1)
	a, b := names[0], names[1]
	opts := func(owner string, ttl time.Duration) []distlock.Option {
		return []distlock.Option{distlock.WithTTL(ttl), distlock.WithClaimWindow(mcMigClaim), distlock.WithOwner(owner)}
	}
	// Every name has its fencing key, so that something of each slot is
	// there to move.
	setup := cl.Client()
	for _, n := range names {
		g, err := newMutex(t, setup, n, opts("setup", mcMigTTL)...).TryLock(t.Context())
		require.NoError(t, err)
		release(t, g)
	}
	var holders mcHolders

	// b's holder's lease outlasts the migration, during which its release
	// waits for the slot (TRYAGAIN).
	gb, err := newMutex(t, cl.Client(), b, opts("holder", mcHoldTTL)...).Lock(t.Context())
	require.NoError(t, err)
	holders.take("holder", b)

	// The contender tries each name in turn, holds what it gets briefly,
	// and records it.
	stop, stopContender := context.WithCancel(t.Context())
	defer stopContender()
	var contended sync.WaitGroup
	var contenderHeld atomic.Int64
	contender := cl.Client()
	contended.Go(func() {
		ms := make([]*distlock.Mutex, len(names))
		for i, n := range names {
			ms[i], _ = distlock.NewMutex(contender, n, opts("contender", mcMigTTL)...)
		}
		for i := 0; stop.Err() == nil; i++ {
			n := i % len(names)
			// The TryLock context bounds the hold too: it ends after the
			// release.
			ctx, cancel := context.WithTimeout(stop, 2*mcMigTTL)
			g, err := ms[n].TryLock(ctx)
			if err != nil {
				cancel()
				continue
			}
			holders.take("contender", names[n])
			contenderHeld.Add(1)
			time.Sleep(time.Millisecond) // the contender's work
			holders.drop("contender", names[n])
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(stop), mcMigTTL)
			_, _ = g.Release(rctx)
			rcancel()
			cancel()
		}
	})

	set, err := distlock.NewMultiMutex(cl.Client(), []string{names[2], a, b}, opts("set", mcMigTTL)...)
	require.NoError(t, err)
	lockCtx, cancelLock := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancelLock()
	result := acquireAsync(t, lockCtx, set.Lock)
	require.Eventually(t, func() bool {
		return inLine(t, nodes[1], mcKey(b)) == 1 && mcOwnerOn(t, nodes[0], a) == "set"
	}, eventually, pollEvery, "the set never held %s while waiting in %s's line", a, b)

	// Migrate the slot, half-way.
	moving := names[migrate]
	from, to := nodes[migrate], nodes[(migrate+1)%len(nodes)]
	slot := cl.Slot(mcKey(moving))
	mig := cl.StartMigration(slot, to)
	require.Equal(t, from, mig.From())
	if first != "-" {
		require.True(t, exists(t, from, mcKey(moving)+first), "%s is not there to move", mcKey(moving)+first)
		mig.Move(mcKey(moving) + first)
	}
	migrating := time.Now()
	// b's holder releases mid-migration, passing b to the set.
	released := acquireAsync(t, t.Context(), func(ctx context.Context) (*distlock.Guard, error) {
		holders.drop("holder", b)
		ctx, cancel := context.WithTimeout(ctx, mcMigOpen+eventually)
		defer cancel()
		st, err := gb.Release(ctx)
		if err == nil && st != distlock.Released {
			err = fmt.Errorf("released with state %v", st)
		}
		return nil, err
	})
	// The slot stays half-moved for mcMigOpen (the length of the fault,
	// not a wait for something to happen); the set may get its names
	// meanwhile, and then holds and renews them across the rest.
	var o outcome
	var got bool
	open := time.After(mcMigOpen)
	for waiting := true; waiting; {
		select {
		case o = <-result:
			got = true
			if o.Err() != nil {
				waiting = false // it failed: nothing to wait for
			}
		case <-open:
			waiting = false
		}
	}
	mcMoveRest(t, mig, slot)
	mig.Finish()
	t.Logf("the slot of %s moved from %s to %s in %v", moving, from.Addr(), to.Addr(), time.Since(migrating))
	if !got {
		o = await(t, result, eventually, "the set's Lock after the migration")
	}
	require.NoError(t, o.Err(), "the set's Lock, %v after the migration began", o.At().Sub(migrating))
	t.Logf("the set acquired %v after the migration began", o.At().Sub(migrating))
	g := o.Guard()
	holders.take("set", names...)
	require.NoError(t, await(t, released, eventually, "b's release").Err(), "b's holder's release")
	assert.Equal(t, distlock.Acquired, g.State(), "the set's guard after the migration")
	for _, n := range names {
		assert.Equal(t, "set", mcOwnerOn(t, cl.PrimaryOf(mcKey(n)), n), "owner of %s", n)
	}
	// The set renews every name after the migration.
	d := g.Deadline()
	require.Eventually(t, func() bool { return g.Deadline().After(d) }, eventually, time.Millisecond,
		"the set never renewed after the migration")
	for _, n := range names {
		pttl, err := cl.PrimaryOf(mcKey(n)).MustDo("PTTL", mcKey(n)).AsInt64()
		require.NoError(t, err)
		assert.Greater(t, time.Duration(pttl)*time.Millisecond, mcMigTTL/2, "%s's lease after a renewal", n)
	}
	holders.drop("set", names...)
	assert.Equal(t, distlock.Released, release(t, g), "the set's release")
	stopContender()
	contended.Wait()
	holders.check(t)
	t.Logf("the contender held a name %d times", contenderHeld.Load())
	for _, n := range names {
		assert.NotEqual(t, "set", mcOwnerOn(t, cl.PrimaryOf(mcKey(n)), n), "%s is still the set's after its release", n)
	}
}

// Timing of the contention test.
const (
	mcContendFor = 2 * time.Second
	// mcNoDeadlock bounds one Lock: every worker holds for about a
	// millisecond, so a Lock that waits this long waits in a circle.
	mcNoDeadlock = 5 * time.Second
	// mcMinRounds is the fewest acquisitions each worker must make in
	// mcContendFor; a 2-core machine makes 13 to 33 per set (with other
	// processes busy on it, under -race), four times that for the Mutex.
	mcMinRounds = 5
)

// Two MultiMutexes over overlapping names spread over the three primaries,
// given in opposite orders, each used by two workers with clients of their
// own (as four processes would), and a Mutex on one of the shared names,
// lock and release in a loop for a few seconds: no Lock waits in a circle,
// no name has two holders at once (counted in memory), and every worker
// makes progress.
func mcOppositeOrders(t *testing.T, cl *redistest.Cluster) {
	names, _ := mcNames(t, cl, "contend", 2) // two per primary, by slot
	up := []string{names[0], names[2], names[3], names[4]}
	down := []string{names[5], names[4], names[3], names[2], names[1]}
	t.Logf("sets %v and %v", up, down)
	type worker struct {
		who   string
		names []string
		lock  func(context.Context) (*distlock.Guard, error)
	}
	var workers []worker
	opts := []distlock.Option{distlock.WithTTL(mcHoldTTL), distlock.WithClaimWindow(mcMigClaim)}
	for i, set := range [][]string{up, down, up, down} {
		m, err := distlock.NewMultiMutex(cl.Client(), set, opts...)
		require.NoError(t, err)
		workers = append(workers, worker{fmt.Sprint("set", i), set, m.Lock})
	}
	single := newMutex(t, cl.Client(), names[3], opts...)
	workers = append(workers, worker{"mutex", names[3:4], single.Lock})

	var holders mcHolders
	rounds := make([]int, len(workers))
	longest := make([]time.Duration, len(workers))
	errs := make([]error, len(workers))
	end := time.Now().Add(mcContendFor)
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Go(func() {
			for time.Now().Before(end) {
				// The Lock context bounds the hold too: it ends after the
				// release.
				ctx, cancel := context.WithTimeout(t.Context(), mcNoDeadlock)
				start := time.Now()
				g, err := w.lock(ctx)
				if err != nil {
					cancel()
					errs[i] = fmt.Errorf("%s %v: Lock after %v: %w", w.who, w.names, time.Since(start), err)
					return
				}
				longest[i] = max(longest[i], time.Since(start))
				who := fmt.Sprintf("%s (token %d)", w.who, g.TokenOf(w.names[0]))
				holders.take(who, w.names...)
				time.Sleep(time.Millisecond) // the work under the locks
				holders.drop(who, w.names...)
				st, err := g.Release(context.WithoutCancel(t.Context()))
				cancel()
				if err == nil && st != distlock.Released {
					err = fmt.Errorf("released with state %v", st)
				}
				if err != nil {
					errs[i] = fmt.Errorf("%s %v: Release: %w", w.who, w.names, err)
					return
				}
				rounds[i]++
			}
		})
	}
	wg.Wait()
	for i, w := range workers {
		require.NoError(t, errs[i])
		t.Logf("%s %v: %d acquisitions, the longest Lock %v", w.who, w.names, rounds[i], longest[i])
		assert.GreaterOrEqual(t, rounds[i], mcMinRounds, "acquisitions of %s", w.who)
	}
	holders.check(t)
	for _, n := range names {
		assert.Empty(t, mcOwnerOn(t, cl.PrimaryOf(mcKey(n)), n), "%s held after every worker released", n)
	}
}
