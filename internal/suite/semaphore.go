package suite

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Semaphore runs the tests of the Semaphore against a redis-server of each
// test's own; a client stands for a process.
func Semaphore(t *testing.T, lib Library) {
	t.Run("BoundsHoldersAndTokensIncrease", func(t *testing.T) { semBounds(t, lib) })
	t.Run("FIFOAcrossClients", func(t *testing.T) { semFIFOAcrossClients(t, lib) })
	t.Run("CrashedHoldersPermitsReturnAtExpiry", func(t *testing.T) { semCrashedHolders(t, lib) })
	t.Run("LoweredPermits", func(t *testing.T) { semLoweredPermits(t, lib) })
	t.Run("RaisedPermitsGoToTheLine", func(t *testing.T) { semRaisedPermits(t, lib) })
	t.Run("SemaphoreAndMutexOfOneNameRefuseEachOther", func(t *testing.T) { semAndMutexRefuseEachOther(t, lib) })
	t.Run("WaiterGivesUp", func(t *testing.T) { semWaiterGivesUp(t, lib) })
}

func semBounds(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	SemaphoreBounds(t, newSemaphore(t, connect(t, lib, srv), "pool", 3, distlock.WithTTL(2*time.Second)))
}

// SemaphoreBounds checks that s, a fresh semaphore of 3 permits, admits
// three holders with increasing tokens, refuses a fourth, and admits one
// again, with a higher token, once a permit is released. The root package
// runs it on distlocktest's in-process server as well.
func SemaphoreBounds(t *testing.T, s *distlock.Semaphore) {
	ctx := t.Context()
	var guards []*distlock.Guard
	var last int64
	for range 3 {
		g, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		require.Greater(t, g.Token(), last)
		last = g.Token()
		guards = append(guards, g)
	}
	_, err := s.TryAcquire(ctx)
	var nae *distlock.NotAcquiredError
	require.ErrorAs(t, err, &nae)
	assert.Equal(t, 3, nae.Permits)
	assert.ErrorIs(t, err, distlock.ErrNotAcquired)

	assert.Equal(t, distlock.Released, release(t, guards[1]))
	g, err := s.TryAcquire(ctx)
	require.NoError(t, err)
	assert.Greater(t, g.Token(), last)
	guards[1] = g
	for _, g := range guards {
		assert.Equal(t, distlock.Released, release(t, g))
	}
}

func semFIFOAcrossClients(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	ctx := t.Context()
	const permits = 2
	// A claim window far above a loaded machine's scheduling delay: with
	// the default (500 ms), a waiter starved that long loses its turn or,
	// passed a permit, its lease, and either changes the order this test
	// checks without any fault of the protocol.
	newSem := func() *distlock.Semaphore {
		return newSemaphore(t, connect(t, lib, srv), "fifo", permits, distlock.WithTTL(longTTL),
			distlock.WithClaimWindow(starvedClaim))
	}
	holder := newSem()
	var held []*distlock.Guard
	for range permits {
		g, err := holder.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, g)
	}
	// Four waiters in four clients, in order.
	type res struct {
		i  int
		g  *distlock.Guard
		at time.Time // when Acquire returned
	}
	got := make(chan res, 4)
	var wg sync.WaitGroup
	for i := range 4 {
		s := newSem()
		wg.Go(func() {
			g, err := s.Acquire(ctx)
			if assert.NoError(t, err) {
				got <- res{i, g, time.Now()}
			}
		})
		waitInLine(t, srv, "distlock:{fifo}", int64(i+1))
	}
	for _, g := range held {
		release(t, g)
	}
	var order []int
	var firsts []res // the first two grants
	take := func() *distlock.Guard {
		select {
		case r := <-got:
			order = append(order, r.i)
			if len(firsts) < 2 {
				firsts = append(firsts, r)
			}
			return r.g
		case <-time.After(eventually):
			t.Fatalf("no waiter got a permit within %v; order so far %v", eventually, order)
			return nil
		}
	}
	a, b := take(), take()
	// Both were passed by concurrent releases, so their results may come
	// in either order; the pair after them is granted later, with larger
	// tokens.
	last := max(a.Token(), b.Token())
	assert.ElementsMatch(t, []int{0, 1}, order, "the two oldest waiters get the two freed permits")
	select {
	case r := <-got:
		what, breach := thirdPermit(r.i, r.g, r.at, firsts[0].i, a, firsts[1].i, b)
		if breach {
			t.Fatalf("SAFETY BREACH: %s: three holders at once", what)
		}
		// The precondition failed, not the protocol: end the run cleanly
		// and say what happened.
		for _, g := range []*distlock.Guard{r.g, a, b} {
			release(t, g)
		}
		release(t, take()) // the last waiter's
		wg.Wait()
		t.Skipf("not a breach: %s: a lease lost to scheduling delay passed its permit on (claim window %v); the order cannot be checked",
			what, starvedClaim)
	case <-time.After(100 * time.Millisecond):
	}
	for _, g := range []*distlock.Guard{a, b} {
		release(t, g)
	}
	c, d := take(), take()
	assert.Greater(t, min(c.Token(), d.Token()), last, "the second pair's tokens")
	assert.Equal(t, []int{0, 1, 2, 3}, append(sortPair(order[:2]), sortPair(order[2:])...))
	release(t, c)
	release(t, d)
	wg.Wait()
	requireNothingLeft(t, lib, srv, "distlock:{fifo}")
}

// thirdPermit judges a third grant of a 2-permit semaphore, to waiter i
// at at, while waiters ia and ib had the two permits, and describes it. It
// is a breach of the bound only if both of them still vouch for their
// leases: a guard reports Acquired exactly while its deadline, which comes
// before Redis can expire its lease, lies ahead, and never again once it
// has passed; so one that is Acquired when read after the grant was
// Acquired at the grant. A guard starved of CPU past its deadline (a
// renewal not sent or not confirmed in time) is Lost, and its permit
// rightly went to the next in line.
func thirdPermit(i int, g *distlock.Guard, at time.Time, ia int, a *distlock.Guard, ib int, b *distlock.Guard) (what string, breach bool) {
	sa, sb := a.State(), b.State()
	desc := func(i int, g *distlock.Guard, st distlock.State) string {
		d := fmt.Sprintf("waiter %d (token %d) is %v", i, g.Token(), st)
		if dl := g.Deadline(); !dl.IsZero() {
			d += fmt.Sprintf(" until %v after the third grant", dl.Sub(at).Round(time.Millisecond))
		}
		return d
	}
	what = fmt.Sprintf("waiter %d got a third permit of 2 (token %d); %s; %s", i, g.Token(), desc(ia, a, sa), desc(ib, b, sb))
	return what, sa == distlock.Acquired && sb == distlock.Acquired
}

func sortPair(p []int) []int {
	if p[0] > p[1] {
		return []int{p[1], p[0]}
	}
	return []int{p[0], p[1]}
}

// A holder that crashed gives its permit back when its lease ends, with
// nobody running anything first: the waiter first in line wakes at that
// moment; and when two leases end together, both waiters get a permit.
func semCrashedHolders(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	// Both waiters must stand in line before the leases end, each on a
	// client of its own: at 700 ms, a loaded machine (load 12 on two
	// cores) took longer, and both got a permit before the second was
	// seen in line.
	const ttl = 2 * time.Second
	key := "distlock:{crash}"
	// Two crashed holders of the two permits, written by hand; read the
	// clock before: their leases cannot end before written + ttl.
	written := time.Now()
	end := strconv.FormatInt(srvMillis(t, srv)+ttl.Milliseconds(), 10)
	srv.MustDo("ZADD", key, end, "crashed#1", end, "crashed#2")
	srv.MustDo("PEXPIRE", key, strconv.FormatInt(ttl.Milliseconds(), 10))
	first := async(t, t.Context(), newSemaphore(t, connect(t, lib, srv), "crash", 2, distlock.WithTTL(longTTL)).Acquire)
	waitInLine(t, srv, key, 1)
	second := async(t, t.Context(), newSemaphore(t, connect(t, lib, srv), "crash", 2, distlock.WithTTL(longTTL)).Acquire)
	waitInLine(t, srv, key, 2)
	for _, ch := range []<-chan outcome{first, second} {
		o := await(t, ch, ttl+promptly, "a waiter after the crashed holders' leases ended")
		require.NoError(t, o.err)
		late := o.at.Sub(written) - ttl
		t.Logf("a permit %v after the crashed holders' leases ended", late)
		assert.GreaterOrEqual(t, late, time.Duration(0), "granted before the lease ended")
		assertSoon(t, p, written.Add(ttl), late, 300*time.Millisecond, "a permit after the crashed holders' leases ended")
		release(t, o.g)
	}
	requireNothingLeft(t, lib, srv, key)
}

// Lowering the number of permits: holders above the new number keep their
// permits and keep renewing; a caller with the new number is granted one
// only once fewer than that remain.
func semLoweredPermits(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	// Long enough for renewals to stay on time on a loaded machine under
	// -race: a holder that lost its lease would prove nothing.
	const ttl = time.Second
	old := newSemaphore(t, connect(t, lib, srv), "pool", 4, distlock.WithTTL(ttl))
	lowered := newSemaphore(t, connect(t, lib, srv), "pool", 2, distlock.WithTTL(ttl))
	var held []*distlock.Guard
	for range 3 {
		g, err := old.TryAcquire(t.Context())
		require.NoError(t, err)
		held = append(held, g)
	}
	_, err := lowered.TryAcquire(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "3 held, the new limit is 2")
	// The old holders keep renewing past two TTLs.
	since := time.Now()
	time.Sleep(2*ttl + ttl/4)
	for i, g := range held {
		if st := g.State(); st != distlock.Acquired {
			skipIfStarved(t, p, since, renewalBudget(ttl), fmt.Sprintf("holder %d above the new limit is %v", i, st))
			t.Errorf("holder %d above the new limit is %v after %v, want Acquired (its renewals must go on)", i, st, time.Since(since).Round(time.Millisecond))
		}
	}
	release(t, held[0])
	_, err = lowered.TryAcquire(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "2 held, the new limit is 2")
	release(t, held[1])
	g, err := lowered.TryAcquire(t.Context())
	require.NoError(t, err, "1 held, the new limit is 2")
	limit, err := srv.MustDo("GET", "distlock:{pool}:permits").AsInt64()
	require.NoError(t, err)
	assert.EqualValues(t, 2, limit, "the limit of the last grant is recorded")
	release(t, g)
	release(t, held[2])
}

// Raising the number of permits takes effect at the next call made with
// it: the permits it frees go to the waiters in line first, in order.
func semRaisedPermits(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	small := newSemaphore(t, connect(t, lib, srv), "pool", 1, distlock.WithTTL(longTTL))
	g, err := small.Acquire(t.Context())
	require.NoError(t, err)
	w1 := async(t, t.Context(), newSemaphore(t, connect(t, lib, srv), "pool", 1, distlock.WithTTL(longTTL)).Acquire)
	waitInLine(t, srv, "distlock:{pool}", 1)
	w2 := async(t, t.Context(), newSemaphore(t, connect(t, lib, srv), "pool", 1, distlock.WithTTL(longTTL)).Acquire)
	waitInLine(t, srv, "distlock:{pool}", 2)

	big := newSemaphore(t, connect(t, lib, srv), "pool", 3, distlock.WithTTL(longTTL))
	_, err = big.TryAcquire(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "the two free permits went to the two waiters")
	o1 := await(t, w1, promptly, "the first waiter")
	o2 := await(t, w2, promptly, "the second waiter")
	require.NoError(t, o1.err)
	require.NoError(t, o2.err)
	assert.Less(t, o1.g.Token(), o2.g.Token(), "passed in the order of the line")
	for _, g := range []*distlock.Guard{g, o1.g, o2.g} {
		release(t, g)
	}
	requireNothingLeft(t, lib, srv, "distlock:{pool}")
}

// A Semaphore and a Mutex of one name cannot be used side by side: each
// refuses the other's lease with an error and writes nothing.
func semAndMutexRefuseEachOther(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	c := connect(t, lib, srv)
	m := newMutex(t, c, "shared", distlock.WithTTL(longTTL))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	s := newSemaphore(t, connect(t, lib, srv), "shared", 2)
	for _, acquire := range []func(context.Context) (*distlock.Guard, error){s.TryAcquire, s.Acquire} {
		_, err = acquire(t.Context())
		require.ErrorIs(t, err, distlock.ErrWrongKind)
		assert.NotErrorIs(t, err, distlock.ErrNotAcquired)
		var wk *distlock.WrongKindError
		require.ErrorAs(t, err, &wk)
		assert.Equal(t, [3]string{s.Key(), "semaphore", "lock"}, [3]string{wk.Key, wk.Want, wk.Found})
		assert.Equal(t, 1, strings.Count(err.Error(), "distlock:"+" "), "one prefix: %v", err)
	}
	assert.Equal(t, distlock.Acquired, g.State(), "the lock's holder is not disturbed")
	release(t, g)

	sg, err := s.TryAcquire(t.Context())
	require.NoError(t, err)
	for _, lock := range []func(context.Context) (*distlock.Guard, error){m.TryLock, m.Lock} {
		_, err = lock(t.Context())
		require.ErrorIs(t, err, distlock.ErrWrongKind)
		assert.NotErrorIs(t, err, distlock.ErrNotAcquired)
		var wk *distlock.WrongKindError
		require.ErrorAs(t, err, &wk)
		assert.Equal(t, [3]string{m.Key(), "lock", "semaphore"}, [3]string{wk.Key, wk.Want, wk.Found})
	}
	assert.Equal(t, distlock.Acquired, sg.State(), "the semaphore's holder is not disturbed")
	release(t, sg)
	requireNothingLeft(t, lib, srv, "distlock:{shared}")
}

// Waiters whose context ends leave the line at once and leave nothing
// behind; the next release still reaches the live waiter behind them.
func semWaiterGivesUp(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	s := newSemaphore(t, connect(t, lib, srv), "pool", 1, distlock.WithTTL(longTTL))
	g, err := s.Acquire(t.Context())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	gone := async(t, ctx, newSemaphore(t, connect(t, lib, srv), "pool", 1, distlock.WithTTL(longTTL)).Acquire)
	waitInLine(t, srv, "distlock:{pool}", 1)
	live := async(t, t.Context(), newSemaphore(t, connect(t, lib, srv), "pool", 1, distlock.WithTTL(longTTL)).Acquire)
	waitInLine(t, srv, "distlock:{pool}", 2)
	cancel()
	o := await(t, gone, giveUpBound+promptly, "the cancelled waiter")
	require.ErrorIs(t, o.err, context.Canceled)
	waitInLine(t, srv, "distlock:{pool}", 1)
	release(t, g)
	o = await(t, live, promptly, "the live waiter")
	require.NoError(t, o.err)
	release(t, o.g)
	requireNothingLeft(t, lib, srv, "distlock:{pool}")
}
