package suite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Faults runs the key scenarios of the fault suite (SAFETY.md, scenarios
// 2, 3, 5 and 8) on the library's client: a holder cut off for longer than
// its lease, a holder cut off briefly, replies held past the deadline,
// Redis stopped, and Redis restarted without persistence. The deep
// harness of the distlock package (a wire recorder, holders in processes
// of their own, the history checker) runs on rueidis alone; these check
// the same clauses from outside, with what any client shows: the guard's
// State, events and Deadline, and Redis's own view of the lease.
//
// A holder is measured against the earliest moment Redis can expire its
// lease: Redis's PEXPIRETIME, read once nothing the holder sends can reach
// Redis any more (after the cut; or, where Redis is stopped, right before
// the stop and before the holder's first renewal, which the test checks
// was never confirmed). State() reads the clock, so a sample that says
// Acquired must precede that moment exactly, and the guard's deadline,
// counted from a send before Redis ran the write, comes at least the
// margin before it; the Lost event comes from the guard's goroutine, which
// a loaded machine may run late, so it gets [slack].
func Faults(t *testing.T, lib Library) {
	t.Run("PartitionLongerThanTTL", func(t *testing.T) { faultPartitionLongerThanTTL(t, lib) })
	t.Run("ShortPartitionIsRiddenOut", func(t *testing.T) { faultShortPartition(t, lib) })
	t.Run("RegainAfterRepliesHeldPastTheDeadline", func(t *testing.T) { faultRegainAfterRepliesHeld(t, lib) })
	t.Run("RedisStopped", func(t *testing.T) { faultRedisStopped(t, lib) })
	t.Run("TokensIncreaseAcrossRestart", func(t *testing.T) { faultTokensIncreaseAcrossRestart(t, lib) })
	t.Run("WaitersSurviveARestart", func(t *testing.T) { faultWaitersSurviveARestart(t, lib) })
	t.Run("HolderNoticesARestart", func(t *testing.T) { faultHolderNoticesARestart(t, lib) })
}

// faultTTL is the holder's TTL in the fault scenarios, as in the fault
// suite's: renewals every 333 ms, margin 40 ms.
const faultTTL = time.Second

// watchGuard samples g's State every millisecond until stopped, reading
// the clock just before each call, and keeps the time of the last sample
// that said Acquired and the last deadline the guard gave.
type watchGuard struct {
	stop chan struct{}
	done chan struct{}
	// Read after done is closed.
	lastAcquired time.Time
	lastDeadline time.Time
	other        int // samples that did not say Acquired
}

func watch(g *distlock.Guard) *watchGuard {
	w := &watchGuard{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			asked := time.Now()
			if g.State() == distlock.Acquired {
				w.lastAcquired = asked
			} else {
				w.other++
			}
			if d := g.Deadline(); !d.IsZero() {
				w.lastDeadline = d
			}
			select {
			case <-w.stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return w
}

// end stops the sampling and waits for it.
func (w *watchGuard) end() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// untilState returns the first event on events in state want, failing the
// test after within.
func untilState(t *testing.T, events <-chan distlock.Event, want distlock.State, within time.Duration, what string) distlock.Event {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case ev, ok := <-events:
			require.True(t, ok, "%s: the subscription closed", what)
			if ev.State == want {
				return ev
			}
		case <-deadline:
			t.Fatalf("%s: no %v event within %v", what, want, within)
			return distlock.Event{}
		}
	}
}

// lostReason returns the reason of a Lost event.
func lostReason(t *testing.T, ev distlock.Event) distlock.LostReason {
	t.Helper()
	var le *distlock.LostError
	require.ErrorAs(t, ev.Err, &le, "the Lost event's error")
	return le.Reason
}

// warm runs a few dozen scripts at once through c, on keys of their own,
// so that the client has dialled every connection it pools before a test
// holds Redis's replies: a connection dialled while replies are held
// cannot finish its handshake, and what is sent on it never reaches Redis.
func warm(t *testing.T, c Client) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range 32 {
		m := newMutex(t, c, fmt.Sprint("warm-", i))
		wg.Go(func() {
			if g, err := m.TryLock(t.Context()); assert.NoError(t, err, "warming") {
				release(t, g)
			}
		})
	}
	wg.Wait()
}

// Scenario 2 (L1, L2, L3): the holder's path is dropped both ways for
// longer than the TTL. It reports Lost by its deadline, counted from the
// send of its last confirmed renewal, before Redis can expire the lease;
// the waiter in another process acquires only after that, with a larger
// token; after the heal the old holder stays Lost, and its Release leaves
// the new holder's key alone.
func faultPartitionLongerThanTTL(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	srv.SkipUnless(t, redistest.ExpireTime) // measured against the lease's exact expiry
	proxy, ca := throughProxy(t, lib, srv)
	a := newMutex(t, ca, "res", distlock.WithTTL(faultTTL), distlock.WithOwner("a"))
	b := newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(faultTTL), distlock.WithOwner("b"))
	ga, err := a.Lock(t.Context())
	require.NoError(t, err)
	events := ga.Subscribe(t.Context())
	var bFailed atomic.Int64
	bw := lockRetrying(t, t.Context(), b, &bFailed)
	waitInLine(t, srv, a.Key(), 1)
	waitDeadlineMoves(t, ga, ga.Deadline(), faultTTL, "a's first renewal")

	w := watch(ga)
	proxy.SetBoth(faultproxy.Blackhole)
	cut := time.Now()
	// Nothing a sends reaches Redis from now on, so the lease's expiry can
	// only stay where it is; a chunk the proxy let through just before the
	// cut is written within microseconds, and a second look, still well
	// before the lease can end, sees it.
	time.Sleep(20 * time.Millisecond)
	expiry, ok := leaseExpiry(t, srv, a.Key())
	require.True(t, ok, "a's lease is gone right after the cut")
	time.Sleep(80 * time.Millisecond)
	if later, ok := leaseExpiry(t, srv, a.Key()); ok && later.After(expiry) {
		expiry = later
	}
	ev := untilState(t, events, distlock.Lost, eventually, "a after the cut")
	w.end()

	assert.Equal(t, distlock.LostDeadline, lostReason(t, ev), "reason: %v", ev.Err)
	require.False(t, w.lastAcquired.IsZero(), "a never said Acquired after the cut")
	assert.True(t, w.lastAcquired.Before(expiry), "a said Acquired %v after the earliest expiry", w.lastAcquired.Sub(expiry))
	// The deadline counts from the send of the renewal Redis confirmed,
	// which Redis ran after: it is at least the margin before the expiry
	// (a millisecond for Redis's rounding). One counted from the reply
	// would be later by a round trip.
	assert.False(t, w.lastDeadline.After(expiry.Add(-margin(faultTTL)+time.Millisecond)),
		"a's deadline is %v after the expiry less the margin", w.lastDeadline.Sub(expiry.Add(-margin(faultTTL))))
	assertSoon(t, p, expiry, ev.Time.Sub(expiry), slack, "a's Lost event after the earliest expiry")

	o := await(t, bw, faultTTL+eventually, "b")
	require.NoError(t, o.err)
	assert.False(t, o.at.Before(expiry), "b acquired %v before a's lease could expire", expiry.Sub(o.at))
	assert.Greater(t, o.g.Token(), ga.Token())
	t.Logf("a lost %v after the cut, %v before the earliest expiry (deadline %v before it); b acquired %v after it, %d failed Lock calls",
		ev.Time.Sub(cut), expiry.Sub(ev.Time), expiry.Sub(w.lastDeadline), o.at.Sub(expiry), bFailed.Load())

	proxy.Heal()
	assert.Equal(t, distlock.Lost, ga.State(), "a after the heal")
	assert.Equal(t, distlock.Lost, release(t, ga))
	v, ok := get(t, srv, a.Key())
	require.True(t, ok, "a's release deleted b's key")
	assert.True(t, strings.HasPrefix(v, "b#"), "lease value %q after a's release", v)
	assert.Equal(t, distlock.Acquired, o.g.State())
	assert.Equal(t, distlock.Released, release(t, o.g))
	requireNothingLeft(t, lib, srv, a.Key())
}

// Scenario 3 (L1b): the holder's path is dropped both ways while a renewal
// is in flight, for less than what the deadline leaves. The failure is
// reported at once and the renewal retried: the guard stays Acquired, its
// context alive, and a renewal confirmed after the heal moves its deadline
// on. Nobody else acquires, and the token does not change.
func faultShortPartition(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	proxy, ca := throughProxy(t, lib, srv)
	obs := &renewWatch{}
	a := newMutex(t, ca, "res", distlock.WithTTL(faultTTL), distlock.WithObserver(obs), distlock.WithLogger(testLogger(t)))
	ga, err := a.Lock(t.Context())
	require.NoError(t, err)
	token := ga.Token()
	events := ga.Subscribe(t.Context())
	require.Equal(t, distlock.Acquired, nextEvent(t, events).State)
	bctx, stopB := context.WithCancel(t.Context())
	defer stopB()
	bw := lockAsync(t, bctx, newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(faultTTL)))
	waitInLine(t, srv, a.Key(), 1)

	// Cut right after a renewal is confirmed, for a third of the TTL and
	// 150 ms more: the next renewal, due a third of the TTL after the
	// last one's send, is sent into the cut, and the cut ends T/3 + 150 ms
	// after that send, 477 ms before the deadline at T − 40 ms.
	waitDeadlineMoves(t, ga, ga.Deadline(), faultTTL, "a's first renewal")
	proxy.SetBoth(faultproxy.Blackhole)
	cut := time.Now()
	time.Sleep(faultTTL/3 + 150*time.Millisecond)
	before := ga.Deadline()
	proxy.Heal() // resets the connections: a renewal still waiting fails now
	healed := time.Now()
	require.Eventually(t, func() bool { return ga.Deadline().After(before) || ga.State() != distlock.Acquired },
		faultTTL, time.Millisecond, "a renewal confirmed after the heal")
	if ga.State() != distlock.Acquired {
		// The deadline left this much after the planned cut.
		skipIfStarved(t, p, cut, faultTTL-margin(faultTTL)-(faultTTL/3+150*time.Millisecond),
			fmt.Sprintf("a lost its lease in a cut of %v (planned %v)", healed.Sub(cut).Round(time.Millisecond), faultTTL/3+150*time.Millisecond))
	}
	renewed := time.Now()

	_, failed, lost := obs.counts()
	assert.Zero(t, lost, "a cut shorter than the deadline lost the lease")
	assert.NoError(t, ga.Context().Err(), "the guard's context must live through the cut")
	assert.Equal(t, distlock.Acquired, ga.State())
	assert.Equal(t, token, ga.Token())
	var reported bool
	for len(events) > 0 {
		ev := <-events
		require.Equal(t, distlock.Acquired, ev.State, "event during the cut: %v", ev.Err)
		reported = reported || errors.Is(ev.Err, distlock.ErrRenewFailed)
	}
	// The renewal caught in the cut fails when the heal resets its
	// connection. A client that sends a command again on its own after a
	// reset (go-redis, MaxRetries) turns that into one slow renewal that
	// distlock sees succeed; one that does not (rueidis) hands the failure
	// to distlock, which must report it (L1b).
	if lib.RetriesOnItsOwn {
		assert.Equal(t, failed > 0, reported, "a failed renewal was reported to the Observer but not to the subscribers, or the other way round")
		// A batched confirmation reaches the Observer when the actor next
		// wakes, up to a renewal period after its answer.
		assert.Eventually(t, func() bool { return obs.inFlightAt(healed) }, faultTTL, time.Millisecond,
			"no renewal was in flight when the cut ended (slowest: %v)", obs.slowest())
	} else {
		assert.Positive(t, failed, "no failed renewal was reported (was one caught in the cut?)")
		assert.True(t, reported, "no Acquired event carried the failed renewal")
	}
	t.Logf("cut for %v; %d failed renewals reported; slowest renewal %v; renewed %v after the heal", healed.Sub(cut), failed, obs.slowest(), renewed.Sub(healed))

	notYet(t, bw, "b, while a's lease was alive")
	assert.Equal(t, distlock.Released, release(t, ga))
	o := await(t, bw, promptly, "b after a's release")
	require.NoError(t, o.err)
	assert.Greater(t, o.g.Token(), token)
	release(t, o.g)
	requireNothingLeft(t, lib, srv, a.Key())
}

// L4: Redis's replies stop coming back while requests still reach it, so
// the key keeps being renewed there while the guard cannot confirm it. The
// guard reports Lost at its deadline; once replies flow again, a renewal
// finds the key still holding this acquisition's value and the guard is
// Acquired again, with its token. Its context stays cancelled (the time in
// between was unprotected), and nobody else acquired.
func faultRegainAfterRepliesHeld(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	proxy, ca := throughProxy(t, lib, srv)
	warm(t, ca)
	const ttl = 900 * time.Millisecond
	m := newMutex(t, ca, "res", distlock.WithTTL(ttl), distlock.WithLogger(testLogger(t)))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	token := g.Token()
	events := g.Subscribe(t.Context())
	require.Equal(t, distlock.Acquired, nextEvent(t, events).State)
	bctx, stopB := context.WithCancel(t.Context())
	defer stopB()
	bw := lockAsync(t, bctx, newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(ttl)))
	waitInLine(t, srv, m.Key(), 1)
	waitDeadlineMoves(t, g, g.Deadline(), ttl, "the first renewal")

	w := watch(g)
	proxy.Set(faultproxy.Down, faultproxy.Pause)
	ev := untilState(t, events, distlock.Lost, eventually, "with replies held")
	w.end()
	assert.Equal(t, distlock.LostDeadline, lostReason(t, ev), "reason: %v", ev.Err)
	assert.True(t, w.lastAcquired.Before(w.lastDeadline), "Acquired %v after the deadline", w.lastAcquired.Sub(w.lastDeadline))
	assertSoon(t, p, w.lastDeadline, ev.Time.Sub(w.lastDeadline), slack, "the Lost event after the deadline")
	proxy.Set(faultproxy.Down, faultproxy.Pass)

	ev = nextEvent(t, events)
	require.Equal(t, distlock.Acquired, ev.State, "the guard should regain its lease")
	assert.Equal(t, distlock.Acquired, g.State())
	assert.Equal(t, token, g.Token())
	assert.ErrorIs(t, context.Cause(g.Context()), distlock.ErrLost, "the context stays cancelled")
	notYet(t, bw, "b, while a kept its lease")
	// Release reports the state at release time: held again.
	assert.Equal(t, distlock.Released, release(t, g))
	o := await(t, bw, promptly, "b after the release")
	require.NoError(t, o.err)
	release(t, o.g)
	requireNothingLeft(t, lib, srv, m.Key())
}

// Scenario 5 (L1): Redis is stopped (SIGSTOP) for twice the TTL before the
// holder's first renewal. The holder reports Lost by its deadline although
// its renewal is still in flight, before Redis could expire the lease; the
// waiter acquires only after Redis resumes, with a larger token; the old
// holder stays Lost.
func faultRedisStopped(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	srv.SkipUnless(t, redistest.ExpireTime) // measured against the lease's exact expiry
	// Renewals every 500 ms: Redis is stopped long before the first.
	const ttl = 1500 * time.Millisecond
	obs := &renewWatch{}
	a := newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(ttl), distlock.WithObserver(obs))
	b := newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(ttl))
	ga, err := a.Lock(t.Context())
	require.NoError(t, err)
	events := ga.Subscribe(t.Context())
	require.Equal(t, distlock.Acquired, nextEvent(t, events).State)
	var bFailed atomic.Int64
	bw := lockRetrying(t, t.Context(), b, &bFailed)
	waitInLine(t, srv, a.Key(), 1)
	// The lease as the acquisition wrote it: no renewal is due before a
	// third of the TTL, and none may have been confirmed (checked below).
	expiry, ok := leaseExpiry(t, srv, a.Key())
	require.True(t, ok, "a's lease has no expiry")

	w := watch(ga)
	srv.Pause()
	paused := time.Now()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	ev := untilState(t, events, distlock.Lost, eventually, "a with Redis stopped")
	w.end()
	renewed, _, _ := obs.counts()
	require.Zero(t, renewed, "a renewal was confirmed before Redis stopped (%v before the lease's end): the bound below would not hold",
		expiry.Sub(paused))
	assert.Contains(t, []distlock.LostReason{distlock.LostDeadline, distlock.LostRenewFailed}, lostReason(t, ev), "reason: %v", ev.Err)
	assert.True(t, w.lastAcquired.Before(expiry), "a said Acquired %v after the earliest expiry", w.lastAcquired.Sub(expiry))
	assert.False(t, w.lastDeadline.After(expiry.Add(-margin(ttl)+time.Millisecond)),
		"a's deadline is %v after the expiry less the margin", w.lastDeadline.Sub(expiry.Add(-margin(ttl))))
	assertSoon(t, p, expiry, ev.Time.Sub(expiry), slack, "the Lost event after the earliest expiry")
	notYet(t, bw, "b, with Redis stopped")

	time.Sleep(time.Until(paused.Add(2 * ttl)))
	at := time.Now() // read before the signal: Redis may answer b before this goroutine runs again
	srv.Resume()
	resumed = true
	o := await(t, bw, ttl+eventually, "b after the resume")
	require.NoError(t, o.err)
	assert.True(t, o.at.After(at), "b acquired while Redis was stopped")
	assert.Greater(t, o.g.Token(), ga.Token())
	t.Logf("a lost %v after the stop, %v before the earliest expiry; b acquired %v after the resume, %d failed Lock calls",
		ev.Time.Sub(paused), expiry.Sub(ev.Time), o.at.Sub(at), bFailed.Load())
	assert.Equal(t, distlock.Lost, ga.State())
	assert.Equal(t, distlock.Lost, release(t, ga))
	assert.Equal(t, distlock.Acquired, o.g.State())
	assert.Equal(t, distlock.Released, release(t, o.g))
	requireNothingLeft(t, lib, srv, a.Key())
}

// Scenario 8 (L3): a restart without persistence loses the fencing key;
// tokens still increase, because they are seeded from the server clock.
func faultTokensIncreaseAcrossRestart(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	m := newMutex(t, connect(t, lib, srv), "res")
	var last int64
	for range 3 {
		g, err := m.TryLock(t.Context())
		require.NoError(t, err)
		require.Greater(t, g.Token(), last)
		last = g.Token()
		release(t, g)
	}
	srv.Restart()
	// The client's connections break with the restart and come back one by
	// one, so the first commands may fail.
	var errs []error
	require.Eventually(t, func() bool {
		g, err := m.TryLock(t.Context())
		if err != nil {
			errs = append(errs, err)
			return false
		}
		defer func() { _, _ = g.Release(t.Context()) }()
		require.Greater(t, g.Token(), last)
		return true
	}, eventually, 20*time.Millisecond, "errors: %v", errs)
}

// Scenario 8, waiting (W2): a restart without persistence loses the lease
// and the line. The waiters ask again, one takes the free lock, the other
// stands in line again, and nobody sleeps forever; the holder's release
// reports its lease Lost.
func faultWaitersSurviveARestart(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	g, err := newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	first := lockAsync(t, t.Context(), newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, g.Key(), 1)
	second := lockAsync(t, t.Context(), newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, g.Key(), 2)

	srv.Restart()
	// The lock is free after the restart, and the line is gone: the first
	// waiter to ask again takes the lock (order among the waiters is kept
	// only for those still waiting), and the other stands in line again.
	var o outcome
	var other <-chan outcome
	select {
	case o = <-first:
		other = second
	case o = <-second:
		other = first
	case <-time.After(2 * eventually):
		t.Fatal("no waiter acquired after the restart")
	}
	require.NoError(t, o.err)
	waitInLine(t, srv, g.Key(), 1)
	notYet(t, other, "the other waiter, while the first holds")
	release(t, o.g)
	o = await(t, other, promptly, "the other waiter")
	require.NoError(t, o.err)
	release(t, o.g)
	assert.Equal(t, distlock.Lost, release(t, g), "the holder's lease died with the restart")
	requireNothingLeft(t, lib, srv, g.Key())
}

// noticeRestart bounds how long after a restarted Redis answers again a
// holder whose lease the server forgot turns Lost.
const noticeRestart = 500 * time.Millisecond

// Scenario 8 (the holder's side): Redis is restarted empty while a guard
// holds. Nothing a client does can keep a lease the server forgot, but the
// holder learns it within a round trip of the server answering again, not
// at its next renewal: its client's connection comes back, every guard
// with an actor renews at once, is refused, and is Lost.
func faultHolderNoticesARestart(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	// Renewals every 2 s: the restart comes right after the first one, so
	// the next scheduled renewal is far beyond the bound.
	const ttl = 6 * time.Second
	g, err := newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(ttl)).Lock(t.Context())
	require.NoError(t, err)
	events := g.Subscribe(t.Context())
	require.Equal(t, distlock.Acquired, (<-events).State)
	time.Sleep(ttl/3 + 100*time.Millisecond) // past the first renewal: the guard has its actor
	require.Equal(t, distlock.Acquired, g.State())
	srv.Restart()
	answering := time.Now()
	for {
		select {
		case ev := <-events:
			if ev.State == distlock.Acquired {
				continue // a failed renewal's report
			}
			require.Equal(t, distlock.Lost, ev.State, "event %v", ev)
			took := ev.Time.Sub(answering)
			t.Logf("Lost %v after the restarted server answered", took)
			assertSoon(t, p, answering, took, noticeRestart+slack, "the holder's Lost event after the restarted server answered")
			var le *distlock.LostError
			require.ErrorAs(t, ev.Err, &le)
			assert.Equal(t, distlock.LostRefused, le.Reason)
			assert.Equal(t, distlock.Lost, release(t, g))
			requireNothingLeft(t, lib, srv, g.Key())
			return
		case <-time.After(ttl):
			t.Fatalf("no Lost within %v of the restart; state %v", ttl, g.State())
		}
	}
}
