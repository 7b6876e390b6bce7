package suite

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// RWMutex runs the tests of the RWMutex against a redis-server of each
// test's own: sharing, exclusion, arrival order, per-reader leases,
// Downgrade, one lock with a Mutex of the same name, the refusals of a
// Semaphore, and quiet waiting.
func RWMutex(t *testing.T, lib Library) {
	t.Run("ReadersShareWritersExclude", func(t *testing.T) { rwReadersShareWritersExclude(t, lib) })
	t.Run("ArrivalOrder", func(t *testing.T) { rwArrivalOrder(t, lib) })
	t.Run("CrashedReaderStopsCounting", func(t *testing.T) { rwCrashedReaderStopsCounting(t, lib) })
	t.Run("Downgrade", func(t *testing.T) { rwDowngrade(t, lib) })
	t.Run("DowngradeOfALostGuard", func(t *testing.T) { rwDowngradeOfALostGuard(t, lib) })
	t.Run("OneLockWithMutex", func(t *testing.T) { rwOneLockWithMutex(t, lib) })
	t.Run("AndSemaphoreRefuseEachOther", func(t *testing.T) { rwAndSemaphoreRefuseEachOther(t, lib) })
	t.Run("WaitingIsQuietAndGivesUpAtOnce", func(t *testing.T) { rwWaitingIsQuietAndGivesUpAtOnce(t, lib) })
}

func rwReadersShareWritersExclude(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	rw := newRWMutex(t, connect(t, lib, srv), "cfg", distlock.WithTTL(longTTL))
	r1, err := rw.RLock(t.Context())
	require.NoError(t, err)
	r2, err := rw.TryRLock(t.Context())
	require.NoError(t, err, "a second reader shares the lock")
	assert.Greater(t, r2.Token(), r1.Token())

	_, err = rw.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "a writer while readers hold")
	w := async(t, t.Context(), rw.Lock)
	waitInLine(t, srv, rw.Key(), 1)
	_, err = rw.TryRLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "TryRLock never gets ahead of a waiting writer")
	r3 := async(t, t.Context(), rw.RLock)
	waitInLine(t, srv, rw.Key(), 2)

	release(t, r1)
	notYet(t, w, "the writer, with a reader still holding")
	release(t, r2)
	ow := await(t, w, promptly, "the writer after the last reader's release")
	require.NoError(t, ow.err)
	assert.Greater(t, ow.g.Token(), r2.Token(), "a writer's token is above every earlier reader's")
	assert.Equal(t, distlock.Acquired, ow.g.State())
	notYet(t, r3, "the reader, with a writer holding")
	release(t, ow.g)
	or3 := await(t, r3, promptly, "the reader after the writer's release")
	require.NoError(t, or3.err)
	assert.Greater(t, or3.g.Token(), ow.g.Token())
	release(t, or3.g)
	requireNothingLeft(t, lib, srv, rw.Key())
	assert.False(t, exists(t, srv, rw.Key()), "the holders' hash outlived them")
}

// A writer's release grants the whole run of readers at the head of the
// line at once, and stops at the next writer, which the last reader of the
// run's release grants.
func rwArrivalOrder(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	rw := newRWMutex(t, connect(t, lib, srv), "order", distlock.WithTTL(longTTL))
	other := newRWMutex(t, connect(t, lib, srv), "order", distlock.WithTTL(longTTL)) // another client
	w0, err := rw.Lock(t.Context())
	require.NoError(t, err)
	runThenWriter(t, srv, w0, rw.RLock, other.RLock, rw.Lock)
	requireNothingLeft(t, lib, srv, rw.Key())
}

// runThenWriter checks arrival order behind hold, an exclusive hold of
// the lock: two readers (rlock, then rlock2), an exclusive waiter (lock)
// and a third reader stand in line in that order; hold's release grants
// the two readers at once, the last of their releases the exclusive
// waiter, and its release the third reader. Their tokens increase in that
// order.
func runThenWriter(t *testing.T, srv *redistest.Server, hold *distlock.Guard, rlock, rlock2, lock func(context.Context) (*distlock.Guard, error)) {
	t.Helper()
	key := hold.Key()
	in := inLine(t, srv, key)
	a := async(t, t.Context(), rlock)
	waitInLine(t, srv, key, in+1)
	b := async(t, t.Context(), rlock2)
	waitInLine(t, srv, key, in+2)
	w1 := async(t, t.Context(), lock)
	waitInLine(t, srv, key, in+3)
	c := async(t, t.Context(), rlock)
	waitInLine(t, srv, key, in+4)

	release(t, hold)
	oa := await(t, a, promptly, "the first reader")
	ob := await(t, b, promptly, "the second reader, in the same run")
	require.NoError(t, errors.Join(oa.err, ob.err))
	notYet(t, w1, "the writer behind the run")
	notYet(t, c, "the reader behind the writer")
	release(t, oa.g)
	release(t, ob.g)
	ow := await(t, w1, promptly, "the writer after the run")
	require.NoError(t, ow.err)
	notYet(t, c, "the reader behind the writer")
	release(t, ow.g)
	oc := await(t, c, promptly, "the last reader")
	require.NoError(t, oc.err)
	assert.IsIncreasing(t, []int64{hold.Token(), oa.g.Token(), ow.g.Token(), oc.g.Token()})
	assert.Less(t, ob.g.Token(), ow.g.Token())
	release(t, oc.g)
}

// A reader whose lease ends (it crashed, here written by hand) stops
// counting at that moment, while another reader holds on: the writer first
// in line gets the lock when the crashed reader's lease ends, not at a
// release of its own.
func rwCrashedReaderStopsCounting(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	const ttl = 700 * time.Millisecond
	rw := newRWMutex(t, connect(t, lib, srv), "crash", distlock.WithTTL(longTTL))
	live, err := rw.RLock(t.Context())
	require.NoError(t, err)
	written := time.Now()
	end := srvMillis(t, srv) + ttl.Milliseconds()
	srv.MustDo("HSET", rw.Key(), "crashed#1", strconv.FormatInt(end, 10)+" 1")
	w := async(t, t.Context(), rw.Lock)
	waitInLine(t, srv, rw.Key(), 1)
	release(t, live)
	notYet(t, w, "the writer, with the crashed reader's lease running")
	o := await(t, w, ttl+promptly, "the writer after the crashed reader's lease")
	require.NoError(t, o.err)
	late := o.at.Sub(written) - ttl
	t.Logf("the writer got the lock %v after the crashed reader's lease ended", late)
	assert.GreaterOrEqual(t, late, time.Duration(0), "granted before the lease ended")
	assertSoon(t, p, written.Add(ttl), late, 300*time.Millisecond, "the writer's grant after the crashed reader's lease ended")
	release(t, o.g)
	requireNothingLeft(t, lib, srv, rw.Key())
}

func rwDowngrade(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	c := connect(t, lib, srv)
	rw := newRWMutex(t, c, "down", distlock.WithTTL(longTTL))
	g, err := rw.Lock(t.Context())
	require.NoError(t, err)
	r := async(t, t.Context(), rw.RLock)
	waitInLine(t, srv, rw.Key(), 1)
	w := async(t, t.Context(), rw.Lock)
	waitInLine(t, srv, rw.Key(), 2)
	dl := g.Deadline()

	require.NoError(t, g.Downgrade(t.Context()))
	assert.Equal(t, distlock.Acquired, g.State(), "a downgraded guard is still Acquired")
	assert.Equal(t, dl, g.Deadline(), "a downgrade does not move the deadline")
	or := await(t, r, promptly, "the reader at the head after the downgrade")
	require.NoError(t, or.err)
	notYet(t, w, "the writer behind")
	assert.ErrorIs(t, g.Downgrade(t.Context()), distlock.ErrNotWriteLock, "a second downgrade")
	assert.ErrorIs(t, or.g.Downgrade(t.Context()), distlock.ErrNotWriteLock, "a read guard")
	assert.Equal(t, distlock.Acquired, or.g.State())

	mg, err := newMutex(t, c, "down-mutex").TryLock(t.Context())
	require.NoError(t, err)
	assert.ErrorIs(t, mg.Downgrade(t.Context()), distlock.ErrNotWriteLock, "a Mutex's guard")
	release(t, mg)

	release(t, g)
	release(t, or.g)
	ow := await(t, w, promptly, "the writer after both readers")
	require.NoError(t, ow.err)
	release(t, ow.g)
	assert.ErrorIs(t, ow.g.Downgrade(t.Context()), distlock.ErrReleased, "a released guard")
	requireNothingLeft(t, lib, srv, rw.Key())
}

// A writer whose key was taken away is told Lost by the downgrade, and
// nothing is written.
func rwDowngradeOfALostGuard(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	rw := newRWMutex(t, connect(t, lib, srv), "lost", distlock.WithTTL(longTTL))
	g, err := rw.Lock(t.Context())
	require.NoError(t, err)
	srv.MustDo("DEL", rw.Key())
	err = g.Downgrade(t.Context())
	require.ErrorIs(t, err, distlock.ErrLost)
	assert.Equal(t, distlock.Lost, g.State())
	assert.False(t, exists(t, srv, rw.Key()), "the downgrade wrote the key")
	release(t, g)
}

// A Mutex and an RWMutex of one name are one lock: a Mutex's hold keeps
// readers and writers out and theirs keep it out; they stand in one line
// in arrival order, so a Mutex waits behind the readers that hold and the
// readers that arrive behind it wait for it; and the hand-offs between
// them are made in the release's script, as within one kind: the last
// reader's release passes to the Mutex, whose release passes to the run of
// readers at the head of the line, and the last of those readers' release
// to a Mutex waiting behind them. One fencing sequence: every grant's
// token is above the one before.
func rwOneLockWithMutex(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	rw := newRWMutex(t, connect(t, lib, srv), "one", distlock.WithTTL(longTTL))
	other := newRWMutex(t, connect(t, lib, srv), "one", distlock.WithTTL(longTTL)) // another client
	m := newMutex(t, connect(t, lib, srv), "one", distlock.WithTTL(longTTL))
	key := rw.Key()
	require.Equal(t, key, m.Key())

	r1, err := rw.RLock(t.Context())
	require.NoError(t, err)
	_, err = m.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "a Mutex while a reader holds")
	mo := lockAsync(t, t.Context(), m)
	waitInLine(t, srv, key, 1)
	_, err = rw.TryRLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "TryRLock never gets ahead of a waiting Mutex")
	r2 := async(t, t.Context(), other.RLock)
	waitInLine(t, srv, key, 2)

	release(t, r1)
	om := await(t, mo, promptly, "the Mutex after the last reader's release")
	require.NoError(t, om.err)
	assert.Greater(t, om.g.Token(), r1.Token())
	notYet(t, r2, "the reader behind the Mutex")
	for name, try := range map[string]func(context.Context) (*distlock.Guard, error){"TryRLock": rw.TryRLock, "TryLock": rw.TryLock} {
		_, err := try(t.Context())
		var na *distlock.NotAcquiredError
		require.ErrorAs(t, err, &na, "%s while a Mutex holds", name)
	}
	release(t, om.g)
	or2 := await(t, r2, promptly, "the reader behind the Mutex, after its release")
	require.NoError(t, or2.err)
	assert.Greater(t, or2.g.Token(), om.g.Token())
	release(t, or2.g)

	// Behind a Mutex's hold: two readers, a Mutex, a reader.
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	assert.Greater(t, g.Token(), or2.g.Token())
	runThenWriter(t, srv, g, rw.RLock, other.RLock, newMutex(t, connect(t, lib, srv), "one", distlock.WithTTL(longTTL)).Lock)
	requireNothingLeft(t, lib, srv, key)
}

// A Semaphore and an RWMutex of one name cannot be used side by side:
// each refuses the other's lease with an error matching ErrWrongKind and
// writes nothing.
func rwAndSemaphoreRefuseEachOther(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	rw := newRWMutex(t, connect(t, lib, srv), "shared", distlock.WithTTL(longTTL))
	s := newSemaphore(t, connect(t, lib, srv), "shared", 2)
	for _, hold := range []func(context.Context) (*distlock.Guard, error){rw.RLock, rw.Lock} {
		g, err := hold(t.Context())
		require.NoError(t, err)
		for name, try := range map[string]func(context.Context) (*distlock.Guard, error){"Acquire": s.Acquire, "TryAcquire": s.TryAcquire} {
			_, err := try(t.Context())
			require.ErrorIs(t, err, distlock.ErrWrongKind, name)
			var wk *distlock.WrongKindError
			require.ErrorAs(t, err, &wk)
			assert.Equal(t, [2]string{"semaphore", "rwmutex"}, [2]string{wk.Want, wk.Found}, name)
			assert.Equal(t, 1, strings.Count(err.Error(), "distlock:"+" "), "one prefix: %v", err)
		}
		assert.Equal(t, distlock.Acquired, g.State(), "the holder is not disturbed")
		release(t, g)
	}

	sg, err := s.Acquire(t.Context())
	require.NoError(t, err)
	for name, try := range map[string]func(context.Context) (*distlock.Guard, error){
		"RLock": rw.RLock, "Lock": rw.Lock, "TryRLock": rw.TryRLock, "TryLock": rw.TryLock,
	} {
		_, err := try(t.Context())
		require.ErrorIs(t, err, distlock.ErrWrongKind, name)
		var wk *distlock.WrongKindError
		require.ErrorAs(t, err, &wk)
		assert.Equal(t, [2]string{"rwmutex", "semaphore"}, [2]string{wk.Want, wk.Found}, name)
	}
	assert.Equal(t, distlock.Acquired, sg.State(), "the semaphore's holder is not disturbed")
	release(t, sg)
	requireNothingLeft(t, lib, srv, rw.Key())
}

// W4 for a read-write lock: a reader waiting behind a writer, and a writer
// waiting behind readers, sleep without CPU and send a refresh every half
// claim window at most; W3: a waiter whose ctx ends returns at once and
// leaves no place in line; W5: nothing is left.
func rwWaitingIsQuietAndGivesUpAtOnce(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	rw := newRWMutex(t, connect(t, lib, srv), "quiet", distlock.WithTTL(longTTL))
	holder := newRWMutex(t, connect(t, lib, srv), "quiet", distlock.WithTTL(longTTL))
	for _, tc := range []struct {
		name       string
		hold, wait func(context.Context) (*distlock.Guard, error)
	}{{"reader behind a writer", holder.Lock, rw.RLock}, {"writer behind a reader", holder.RLock, rw.Lock}} {
		g, err := tc.hold(t.Context())
		require.NoError(t, err)
		waitWatched(t, srv, rw.Key())
		ctx, cancel := context.WithCancel(t.Context())
		result := async(t, ctx, tc.wait)
		waitInLine(t, srv, rw.Key(), 1)
		waitSubscribed(t, srv, rw.Key(), 1)
		requireQuiet(t, srv, tc.name)
		cancelled := time.Now()
		cancel()
		o := await(t, result, promptly, tc.name+" giving up")
		require.ErrorIs(t, o.err, context.Canceled)
		assertSoon(t, p, cancelled, o.at.Sub(cancelled), giveUpBound, tc.name+": W3, Lock returning after its ctx was cancelled")
		release(t, g)
		// W5, and a clean start for the next case: no place, no room,
		// no subscription.
		requireNothingLeft(t, lib, srv, rw.Key())
	}
}
