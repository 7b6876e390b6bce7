package suite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Mutex runs the core tests of the Mutex and its guards against a
// redis-server of each test's own: acquire and release, refusals, waits
// and their limits, contention, losses and what each face of the guard
// (State, Context, Subscribe, Release) says of them, Redis's errors.
func Mutex(t *testing.T, lib Library) {
	t.Run("LockAndRelease", func(t *testing.T) { mutexLockAndRelease(t, lib) })
	t.Run("TryLockHeld", func(t *testing.T) { mutexTryLockHeld(t, lib) })
	t.Run("WaitingAcquiresAfterRelease", func(t *testing.T) { mutexWaitingAcquiresAfterRelease(t, lib) })
	t.Run("Timeouts", func(t *testing.T) { mutexTimeouts(t, lib) })
	t.Run("ContentionNoOverlap", func(t *testing.T) { mutexContention(t, lib) })
	t.Run("LostWhenKeyDeleted", func(t *testing.T) { mutexLostWhenKeyDeleted(t, lib) })
	t.Run("LostWhenOverwrittenAndReleaseSparesNewHolder", func(t *testing.T) { mutexLostWhenOverwritten(t, lib) })
	t.Run("ContextCancelReleases", func(t *testing.T) { mutexContextCancelReleases(t, lib) })
	t.Run("Subscribe", func(t *testing.T) { mutexSubscribe(t, lib) })
	t.Run("ReleaseWithRedisDown", func(t *testing.T) { mutexReleaseWithRedisDown(t, lib) })
	t.Run("RedisErrorIsReturned", func(t *testing.T) { mutexRedisErrorIsReturned(t, lib) })
	t.Run("InvalidOptionSendsNothing", func(t *testing.T) { mutexInvalidOption(t, lib) })
	t.Run("OwnerOfAnotherLibraryValue", func(t *testing.T) { mutexOwnerOfAnotherLibraryValue(t, lib) })
	t.Run("TryLockAgainstStoppedRedis", func(t *testing.T) { mutexTryLockAgainstStoppedRedis(t, lib) })
	t.Run("StateIsLostOnceTheContextSaysSo", func(t *testing.T) { mutexStateIsLostOnceTheContextSaysSo(t, lib) })
	t.Run("ContextIsCancelledOnceTheLostEventComes", func(t *testing.T) { mutexContextIsCancelledOnceTheLostEventComes(t, lib) })
}

func mutexLockAndRelease(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	m := newMutex(t, connect(t, lib, srv), "job", distlock.WithOwner("worker-1"), distlock.WithTTL(2*time.Second))
	require.Equal(t, "distlock:{job}", m.Key())
	require.Equal(t, "worker-1", m.Owner())

	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	assert.Equal(t, distlock.Acquired, g.State())
	assert.Equal(t, m.Key(), g.Key())
	assert.Equal(t, 0, g.Attempt())
	assert.Greater(t, g.Token(), time.Now().Add(-tokenWindow).UnixMicro(), "token should be the server's clock in µs")
	require.NoError(t, g.Context().Err())

	value, ok := get(t, srv, m.Key())
	require.True(t, ok, "lease key missing while held")
	assert.True(t, strings.HasPrefix(value, "worker-1#"), "value %q should start with the owner id", value)
	pttl, err := srv.MustDo("PTTL", m.Key()).ToInt64()
	require.NoError(t, err)
	assert.InDelta(t, 2000, pttl, 500, "lease TTL in ms")

	assert.Equal(t, distlock.Released, release(t, g))
	assert.Equal(t, distlock.Released, g.State())
	_, ok = get(t, srv, m.Key())
	assert.False(t, ok, "lease key still there after release")
	select {
	case <-g.Done():
	default:
		t.Fatal("Done not closed after Release returned")
	}
	assert.ErrorIs(t, context.Cause(g.Context()), distlock.ErrReleased)

	// A second Release is harmless and reports the same outcome.
	assert.Equal(t, distlock.Released, release(t, g))
}

func mutexTryLockHeld(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	c := connect(t, lib, srv)
	a := newMutex(t, c, "res", distlock.WithOwner("alice"))
	b := newMutex(t, c, "res", distlock.WithOwner("bob"))

	g, err := a.TryLock(t.Context())
	require.NoError(t, err)
	defer release(t, g)

	_, err = b.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired)
	var nae *distlock.NotAcquiredError
	require.ErrorAs(t, err, &nae)
	assert.Equal(t, "alice", nae.Holder)
	assert.Greater(t, nae.Remaining, time.Duration(0))
	assert.Contains(t, err.Error(), `"alice"`)

	// The same Mutex cannot take it twice either: each acquisition is its own.
	_, err = a.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired)

	// TryLockFor with a zero timeout is a single attempt.
	_, err = b.TryLockFor(t.Context(), 0, time.Millisecond)
	require.ErrorIs(t, err, distlock.ErrNotAcquired)
}

func mutexWaitingAcquiresAfterRelease(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	a := newMutex(t, connect(t, lib, srv), "res")
	b := newMutex(t, connect(t, lib, srv), "res", distlock.WithRetryInterval(10*time.Millisecond))

	ga, err := a.Lock(t.Context())
	require.NoError(t, err)

	before := scriptsRun(t, srv)
	got := lockAsync(t, t.Context(), b)
	// Let b make attempts that are refused while a holds the lock (a fixed
	// sleep is not enough on a busy machine, where b may not even have
	// started). b polls, and nobody else sends anything: the scripts Redis
	// runs now are b's, a first one maybe answered NOSCRIPT.
	require.Eventually(t, func() bool { return scriptsRun(t, srv) >= before+3 }, eventually, pollEvery,
		"b made no attempt that was refused")
	notYet(t, got, "b, while a holds the lock")
	tokenA := ga.Token()
	release(t, ga)
	o := await(t, got, eventually, "b after a's release")
	require.NoError(t, o.err)
	assert.Greater(t, o.g.Token(), tokenA)
	assert.Positive(t, o.g.Attempt(), "b should have needed more than one attempt")
	release(t, o.g)
}

func mutexTimeouts(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	c := connect(t, lib, srv)
	holder := newMutex(t, c, "res")
	g, err := holder.Lock(t.Context())
	require.NoError(t, err)
	defer release(t, g)

	const wait = 150 * time.Millisecond
	t.Run("max wait", func(t *testing.T) {
		m := newMutex(t, c, "res", distlock.WithMaxWait(wait), distlock.WithRetryInterval(20*time.Millisecond))
		start := time.Now()
		_, err := m.Lock(t.Context())
		require.ErrorIs(t, err, distlock.ErrTimeout)
		var te *distlock.TimeoutError
		require.ErrorAs(t, err, &te)
		assert.GreaterOrEqual(t, te.Waited, wait)
		assert.GreaterOrEqual(t, time.Since(start), wait)
		assert.Greater(t, te.Attempts, 1)
	})
	t.Run("try lock for", func(t *testing.T) {
		m := newMutex(t, c, "res")
		_, err := m.TryLockFor(t.Context(), wait, 0) // spin
		require.ErrorIs(t, err, distlock.ErrTimeout)
		var te *distlock.TimeoutError
		require.ErrorAs(t, err, &te)
		assert.GreaterOrEqual(t, te.Waited, wait)
	})
	t.Run("context deadline", func(t *testing.T) {
		m := newMutex(t, c, "res")
		ctx, cancel := context.WithTimeout(t.Context(), wait)
		defer cancel()
		_, err := m.Lock(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.NotErrorIs(t, err, distlock.ErrTimeout)
	})
	t.Run("context cancel with cause", func(t *testing.T) {
		m := newMutex(t, c, "res")
		ctx, cancel := context.WithCancelCause(t.Context())
		shutdown := errors.New("shutting down")
		time.AfterFunc(wait, func() { cancel(shutdown) })
		_, err := m.Lock(ctx)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, err, shutdown)
	})
	t.Run("context already cancelled", func(t *testing.T) {
		free := newMutex(t, c, "free")
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := free.Lock(ctx)
		require.ErrorIs(t, err, context.Canceled)
		_, ok := get(t, srv, free.Key())
		assert.False(t, ok, "a cancelled Lock wrote the lease")
	})
}

func mutexContention(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	c := connect(t, lib, srv)
	checkContention(t, func(int) Client { return c }, "counter", 6, 15)
}

func mutexLostWhenKeyDeleted(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	m := newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(shortTTL))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	events := g.Subscribe(t.Context())
	require.Equal(t, distlock.Acquired, nextEvent(t, events).State)

	srv.MustDo("DEL", m.Key())
	ev := nextEvent(t, events)
	require.Equal(t, distlock.Lost, ev.State)
	require.ErrorIs(t, ev.Err, distlock.ErrLost)
	var le *distlock.LostError
	require.ErrorAs(t, ev.Err, &le)
	assert.Equal(t, distlock.LostRefused, le.Reason)
	assert.Equal(t, distlock.Lost, g.State())
	assert.ErrorIs(t, context.Cause(g.Context()), distlock.ErrLost)

	// A renewal never re-creates the key: watch it over more than a
	// renewal period.
	deadline := time.Now().Add(shortTTL / 2)
	for time.Now().Before(deadline) {
		require.False(t, exists(t, srv, m.Key()), "a renewal re-created a deleted lease")
		time.Sleep(20 * time.Millisecond)
	}

	assert.Equal(t, distlock.Lost, release(t, g))
	ev = nextEvent(t, events)
	assert.Equal(t, distlock.Released, ev.State)
	_, open := <-events
	assert.False(t, open, "subscription not closed after Released")
}

func mutexLostWhenOverwritten(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	m := newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(shortTTL))
	p := startSchedProbe(t)
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	locked := time.Now()

	// An operator (or a bug elsewhere) hands the key to someone else.
	srv.MustDo("SET", m.Key(), "intruder#1", "PX", "60000")
	waitState(t, g, distlock.Lost)
	var le *distlock.LostError
	require.ErrorAs(t, context.Cause(g.Context()), &le)
	if late, budget := p.delay(locked, time.Now()), renewalBudget(shortTTL); le.Reason != distlock.LostRefused && late >= budget {
		// The guard's deadline came before a renewal could be sent and
		// answered: the machine's doing, and a loss all the same (no
		// breach). Release must still spare the new holder's key.
		t.Logf("lost for %v, not refused: the probe measured a scheduling delay of %v, at least the %v a renewal had to spare",
			le.Reason, late.Round(time.Millisecond), budget)
	} else {
		assert.Equal(t, distlock.LostRefused, le.Reason, "the reason of the loss (scheduling delay meanwhile %v)", late.Round(time.Millisecond))
		assert.Equal(t, "intruder#1", le.Holder)
	}

	assert.Equal(t, distlock.Lost, release(t, g))
	v, ok := get(t, srv, m.Key())
	require.True(t, ok, "release deleted the new holder's key")
	assert.Equal(t, "intruder#1", v)
}

func mutexContextCancelReleases(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	c := connect(t, lib, srv)
	m := newMutex(t, c, "res")
	ctx, cancel := context.WithCancel(t.Context())
	g, err := m.Lock(ctx)
	require.NoError(t, err)
	events := g.Subscribe(t.Context())
	require.Equal(t, distlock.Acquired, nextEvent(t, events).State)

	cancel()
	select {
	case <-g.Done():
	case <-time.After(eventually):
		t.Fatal("cancelling the Lock context did not release the guard")
	}
	assert.Equal(t, distlock.Released, nextEvent(t, events).State)
	_, ok := get(t, srv, m.Key())
	assert.False(t, ok, "lease still in Redis after the context was cancelled")
	assert.ErrorIs(t, g.Context().Err(), context.Canceled)
	assert.Equal(t, distlock.Released, release(t, g))

	// The lock is free for the next one at once.
	g2, err := newMutex(t, c, "res").TryLock(t.Context())
	require.NoError(t, err)
	release(t, g2)
}

func mutexSubscribe(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	c := connect(t, lib, srv)
	m := newMutex(t, c, "res")
	g, err := m.Lock(t.Context())
	require.NoError(t, err)

	t.Run("ctx ends", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		ch := g.Subscribe(ctx)
		assert.Equal(t, distlock.Acquired, nextEvent(t, ch).State)
		cancel()
		select {
		case _, ok := <-ch:
			assert.False(t, ok, "unexpected event after cancel")
		case <-time.After(eventually):
			t.Fatal("subscription not closed after its ctx ended")
		}
	})
	t.Run("ctx already done", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, ok := <-g.Subscribe(ctx)
		assert.False(t, ok)
	})
	t.Run("slow subscriber does not block", func(t *testing.T) {
		// A subscription nobody reads must not hold up the actor: the
		// lease of another guard, subscribed but never read, keeps being
		// renewed.
		short := newMutex(t, c, "short", distlock.WithTTL(shortTTL))
		gs, err := short.Lock(t.Context())
		require.NoError(t, err)
		_ = gs.Subscribe(t.Context()) // never read
		waitRenewed(t, srv, short.Key(), shortTTL)
		assert.Equal(t, distlock.Acquired, gs.State())
		release(t, gs)
	})

	release(t, g)
	t.Run("after release", func(t *testing.T) {
		ch := g.Subscribe(t.Context())
		ev := nextEvent(t, ch)
		assert.Equal(t, distlock.Released, ev.State)
		_, ok := <-ch
		assert.False(t, ok)
	})
}

func mutexReleaseWithRedisDown(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	m := newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(shortTTL))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	srv.Kill()
	ctx, cancel := context.WithTimeout(t.Context(), eventually)
	defer cancel()
	st, err := g.Release(ctx)
	require.Error(t, err, "release cannot succeed without Redis")
	assert.NoError(t, ctx.Err(), "Release ran until the caller's ctx ended")
	// The error says why: Redis cannot be reached. It must not read as
	// the caller's own ctx ending, which a caller tests with errors.Is.
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "release should fail by itself, not by the caller's ctx")
	assert.Contains(t, []distlock.State{distlock.Released, distlock.Lost}, st)
	assert.Equal(t, distlock.Released, g.State())
}

func mutexRedisErrorIsReturned(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	c := connect(t, lib, srv)
	m := newMutex(t, c, "res")
	// The lease key holds a hash: a wrong type is an error, not "held".
	srv.MustDo("HSET", m.Key(), "f", "v")
	_, err := m.TryLock(t.Context())
	require.Error(t, err)
	assert.NotErrorIs(t, err, distlock.ErrNotAcquired)
	assert.Contains(t, err.Error(), "holds a hash, not a lock")
	// Nothing was written next to it.
	n, err := srv.MustDo("DBSIZE").ToInt64()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)

	// Same for a fencing key that holds garbage.
	m2 := newMutex(t, c, "other")
	srv.MustDo("SET", "distlock:{other}:fence", "not-a-number")
	_, err = m2.TryLock(t.Context())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "fencing key")
	_, ok := get(t, srv, m2.Key())
	assert.False(t, ok)
}

// mutexInvalidOption: the library's constructors pass the options on to
// distlock's checks (the checks themselves are tested once, in the
// distlock package): a bad one is refused with an *OptionError, and
// nothing reaches Redis.
func mutexInvalidOption(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	c := connect(t, lib, srv)
	bad := distlock.WithTTL(-time.Second)
	_, errM := c.NewMutex("k", bad)
	_, errS := c.NewSemaphore("k", 2, bad)
	_, errE := c.NewElection("k", bad)
	_, errRW := c.NewRWMutex("k", bad)
	_, errKey := c.NewMutex("a{b")
	_, errPermits := c.NewSemaphore("k", 0)
	for name, err := range map[string]error{"NewMutex": errM, "NewSemaphore": errS, "NewElection": errE,
		"NewRWMutex": errRW, "NewMutex with a bad key": errKey, "NewSemaphore of 0 permits": errPermits} {
		require.ErrorIs(t, err, distlock.ErrInvalidOption, name)
		var oe *distlock.OptionError
		require.ErrorAs(t, err, &oe, name)
	}
	assert.Zero(t, scriptsRun(t, srv), "a script ran for bad input")
	n, err := srv.MustDo("DBSIZE").ToInt64()
	require.NoError(t, err)
	assert.Zero(t, n)
}

func mutexOwnerOfAnotherLibraryValue(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	m := newMutex(t, connect(t, lib, srv), "res")
	// A value distlock did not write, with an expiry: an ordinary holder,
	// named as it is.
	srv.MustDo("SET", m.Key(), "manual-maintenance", "PX", "60000")
	_, err := m.TryLock(t.Context())
	var nae *distlock.NotAcquiredError
	require.ErrorAs(t, err, &nae)
	assert.Equal(t, "manual-maintenance", nae.Holder)
	assert.Positive(t, nae.Remaining)
	// Without an expiry it would never be free: refused as a key that
	// distlock did not write, and left alone.
	srv.MustDo("PERSIST", m.Key())
	_, err = m.TryLock(t.Context())
	var wke *distlock.WrongKindError
	require.ErrorAs(t, err, &wke)
	assert.ErrorIs(t, err, distlock.ErrWrongKind)
	assert.Contains(t, wke.Found, "manual-maintenance")
	// Nor does Lock wait for it.
	ctx, cancel := context.WithTimeout(t.Context(), eventually)
	defer cancel()
	_, err = m.Lock(ctx)
	require.ErrorIs(t, err, distlock.ErrWrongKind, "Lock on a key without expiry")
	assert.NoError(t, ctx.Err(), "Lock waited for its context to end")
	got, err := srv.MustDo("GET", m.Key()).ToString()
	require.NoError(t, err)
	assert.Equal(t, "manual-maintenance", got)
	require.NoError(t, distlock.Settle(ctx))
}

// noReplySlack is how much later than its bound an attempt against a
// stopped server may return on a loaded machine.
const noReplySlack = time.Second

// mutexTryLockAgainstStoppedRedis stops the server (SIGSTOP: commands are
// sent and no reply ever comes) and checks that one TryLock, with a
// context that never ends and the client's default timeouts, returns an
// error matching ErrNoReply, never the client's raw timeout, within its
// bound: the lease deadline for a short TTL, and MaxReplyWait for a long
// one. A second TryLock, which may have to make a connection again, is
// bounded too, and so is a TryLockFor by its timeout.
func mutexTryLockAgainstStoppedRedis(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	ttls := []time.Duration{2 * time.Second, 10 * time.Second, 30 * time.Second}
	mutexes := make([]*distlock.Mutex, len(ttls))
	for i, ttl := range ttls {
		// A client each, connected before the server stops, so that one's
		// broken connection does not end another's call.
		mutexes[i] = newMutex(t, connect(t, lib, srv), fmt.Sprintf("stopped:%v", ttl), distlock.WithTTL(ttl))
		g, err := mutexes[i].TryLock(t.Context())
		require.NoError(t, err, "TryLock before the server stops")
		release(t, g)
	}
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	type result struct {
		took time.Duration
		err  error
	}
	results := make([]result, len(ttls))
	var wg sync.WaitGroup
	for i := range ttls {
		wg.Go(func() {
			start := time.Now()
			g, err := mutexes[i].TryLock(context.Background())
			results[i] = result{time.Since(start), err}
			if g != nil {
				_, _ = g.Release(context.Background())
			}
		})
	}
	wg.Wait()
	start := time.Now()
	_, againErr := mutexes[0].TryLock(context.Background())
	again := time.Since(start)
	const tryFor = 500 * time.Millisecond
	start = time.Now()
	_, forErr := mutexes[2].TryLockFor(context.Background(), tryFor, distlock.DefaultRetryInterval)
	forTook := time.Since(start)
	srv.Resume()
	resumed = true

	for i, ttl := range ttls {
		r := results[i]
		t.Logf("%s, TTL %v: TryLock returned after %v: %v", lib.Name, ttl, r.took.Round(time.Millisecond), r.err)
		require.ErrorIs(t, r.err, distlock.ErrNoReply, "TTL %v", ttl)
		assert.NotErrorIs(t, r.err, context.DeadlineExceeded, "TTL %v: no deadline of the caller's passed", ttl)
		bound := min(ttl, distlock.MaxReplyWait)
		assert.Less(t, r.took, bound+noReplySlack, "TTL %v: how long one attempt waited", ttl)
		// The client may give up before the bound (rueidis ends a
		// connection whose PING goes unanswered, 5 to 10 s in), not at once.
		assert.Greater(t, r.took, noReplySlack/2, "TTL %v: the attempt returned before waiting for a reply", ttl)
	}
	t.Logf("%s, TTL %v, again: TryLock returned after %v: %v", lib.Name, ttls[0], again.Round(time.Millisecond), againErr)
	require.ErrorIs(t, againErr, distlock.ErrNoReply, "TTL %v, again", ttls[0])
	assert.Less(t, again, ttls[0]+noReplySlack, "TTL %v, again: how long one attempt waited", ttls[0])
	t.Logf("%s, TTL %v: TryLockFor(%v) returned after %v: %v", lib.Name, ttls[2], tryFor, forTook.Round(time.Millisecond), forErr)
	require.ErrorIs(t, forErr, distlock.ErrTimeout, "TryLockFor against the stopped server")
	assert.Less(t, forTook, tryFor+noReplySlack, "TryLockFor's timeout did not bound the attempt in flight")

	// What the attempts may have written is cancelled in the background
	// once the server answers again.
	settle, cancel := context.WithTimeout(t.Context(), 2*distlock.MaxReplyWait)
	defer cancel()
	require.NoError(t, distlock.Settle(settle))
}

// Once the guard's context is cancelled by a loss, State no longer says
// Acquired: the actor publishes the state before it cancels the context.
func mutexStateIsLostOnceTheContextSaysSo(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	c := connect(t, lib, srv)
	for i := range 20 {
		m := newMutex(t, c, "res", distlock.WithTTL(300*time.Millisecond))
		g, err := m.Lock(t.Context())
		require.NoError(t, err)
		srv.MustDo("DEL", m.Key())
		select {
		case <-g.Context().Done():
		case <-time.After(eventually):
			t.Fatal("the loss went unnoticed")
		}
		if st := g.State(); st != distlock.Lost {
			// A guard starved past its deadline before the DEL is Lost by
			// that deadline, and a renewal's reply read after it finds the
			// key still its own and regains the lease (L4): the context
			// stays cancelled. That is not the loss this checks.
			var le *distlock.LostError
			cause := context.Cause(g.Context())
			if errors.As(cause, &le) && le.Reason == distlock.LostDeadline {
				t.Logf("run %d: lost by its deadline before the DEL (%v), then %v: a regain, not the refused renewal this checks", i, cause, st)
				release(t, g)
				continue
			}
			t.Fatalf("run %d: State right after the context was cancelled by the loss: %v, want %v (the context's cause: %v)", i, st, distlock.Lost, cause)
		}
		release(t, g)
	}
}

// The other way round: whoever receives the Lost event finds the guard's
// context cancelled, with the loss as its cause.
func mutexContextIsCancelledOnceTheLostEventComes(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	c := connect(t, lib, srv)
	for range 20 {
		m := newMutex(t, c, "res", distlock.WithTTL(300*time.Millisecond))
		g, err := m.Lock(t.Context())
		require.NoError(t, err)
		ctx := g.Context()
		events := g.Subscribe(t.Context())
		srv.MustDo("DEL", m.Key())
		for ev := range events {
			if ev.State == distlock.Lost {
				break
			}
		}
		require.ErrorIs(t, context.Cause(ctx), distlock.ErrLost, "the context right after the Lost event")
		release(t, g)
	}
}
