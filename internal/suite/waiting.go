package suite

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Waiting runs the tests of waiting in line (SAFETY.md, W1 to W5, and L1
// for a lease passed to a waiter), against real redis-server processes. A
// client stands for a process: waiters of two clients can only learn of
// each other through Redis. A waiter cut off from Redis (its client's
// path through a fault proxy blackholed) stands for one that died, froze
// or was partitioned: to Redis and to the other waiters they look the
// same.
func Waiting(t *testing.T, lib Library) {
	t.Run("InOrderAcrossProcesses", func(t *testing.T) { waitInOrderAcrossProcesses(t, lib) })
	t.Run("WaiterTakesCrashedHoldersLeaseAtExpiry", func(t *testing.T) { waitCrashedHoldersLeaseAtExpiry(t, lib) })
	t.Run("DeadWaiterCostsAtMostTheClaimWindow", func(t *testing.T) { waitDeadWaiter(t, lib) })
	t.Run("Quiet", func(t *testing.T) { waitQuiet(t, lib) })
	t.Run("PassWithinAProcessThenToAnother", func(t *testing.T) { waitPassWithinAProcessThenToAnother(t, lib) })
	t.Run("GiveUpWhileRedisIsStopped", func(t *testing.T) { waitGiveUpWhileRedisIsStopped(t, lib) })
	t.Run("LostGuardDoesNotBlockWaitersOfItsProcess", func(t *testing.T) { waitLostGuardDoesNotBlock(t, lib) })
	t.Run("WithoutPubSub", func(t *testing.T) { waitWithoutPubSub(t, lib) })
	t.Run("PassedLeaseDeadlinePrecedesItsExpiry", func(t *testing.T) { waitPassedLeaseDeadline(t, lib) })
	t.Run("TryLockAndPollingDoNotQueueOrBarge", func(t *testing.T) { waitTryLockAndPollingDoNotQueueOrBarge(t, lib) })
	t.Run("SettleWaitsForTheCleanUp", func(t *testing.T) { waitSettle(t, lib) })
}

// W1, W2: a release in one process wakes the first waiter in another at
// once, and waiters in several processes get the lock in the order they
// came.
func waitInOrderAcrossProcesses(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	clients := []Client{connect(t, lib, srv), connect(t, lib, srv), connect(t, lib, srv)}
	holder := newMutex(t, clients[0], "line", distlock.WithTTL(longTTL))
	g, err := holder.Lock(t.Context())
	require.NoError(t, err)

	const waiters = 6
	results := make([]<-chan outcome, waiters)
	for i := range waiters {
		// Round robin over the processes, the holder's own included.
		m := newMutex(t, clients[i%len(clients)], "line", distlock.WithTTL(longTTL))
		results[i] = lockAsync(t, t.Context(), m)
		waitInLine(t, srv, holder.Key(), int64(i+1))
	}
	released := time.Now()
	release(t, g)
	var order []int
	var tokens []int64
	for range waiters {
		// Whoever holds the lock now must be next in line; it releases at
		// once, passing the lock on.
		got := -1
		deadline := time.After(promptly)
		for got < 0 {
			for i, ch := range results {
				if got >= 0 {
					break // one at a time: its release wakes the next
				}
				select {
				case o := <-ch:
					require.NoError(t, o.err, "waiter %d", i)
					if len(order) == 0 {
						assert.Less(t, o.at.Sub(released), promptly, "the first waiter woke %v after the release", o.at.Sub(released))
					}
					got = i
					tokens = append(tokens, o.g.Token())
					assert.Equal(t, distlock.Released, release(t, o.g))
				default:
				}
			}
			if got < 0 {
				select {
				case <-deadline:
					t.Fatalf("no waiter acquired within %v of the previous release; order so far %v", promptly, order)
				case <-time.After(pollEvery):
				}
			}
		}
		order = append(order, got)
	}
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5}, order, "order in which the waiters acquired")
	assert.IsIncreasing(t, tokens, "tokens in order of acquisition")
	requireNothingLeft(t, lib, srv, holder.Key())
}

// W1: a holder that died without releasing is taken over as soon as its
// lease expires, by the first waiter in line, without polling.
func waitCrashedHoldersLeaseAtExpiry(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	m := newMutex(t, connect(t, lib, srv), "res")
	const ttl = 700 * time.Millisecond
	// Read before the SET: the lease cannot expire before written + ttl.
	written := time.Now()
	srv.MustDo("SET", m.Key(), "crashed#1", "PX", strconv.Itoa(int(ttl.Milliseconds())))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	late := time.Since(written) - ttl
	t.Logf("acquired %v after the crashed holder's lease expired", late)
	assert.GreaterOrEqual(t, late, time.Duration(0), "acquired before the lease expired")
	assertSoon(t, p, written.Add(ttl), late, 300*time.Millisecond, "the grant after the crashed holder's lease expired")
	// The first call, a poll or two until the room's subscription is up and
	// one when it is, a refresh every half claim window, the one at expiry;
	// polling would have made one every 50ms.
	assert.LessOrEqual(t, g.Attempt(), 4+int(ttl/(distlock.DefaultClaimWindow/2)))
	release(t, g)
	requireNothingLeft(t, lib, srv, m.Key())
}

// W1 with a dead waiter ahead: a waiter whose process can no longer reach
// Redis (killed, frozen or cut off) is passed the lock, cannot claim it, and
// the next waiter gets it once the claim window has passed, not a TTL later.
// Also W3: the dead waiter's own Lock, cancelled, returns at once although
// its clean-up cannot reach Redis.
func waitDeadWaiter(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	const claim = 300 * time.Millisecond
	holder := newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(longTTL))
	g, err := holder.Lock(t.Context())
	require.NoError(t, err)

	proxy, cut := throughProxy(t, lib, srv)
	dead := newMutex(t, cut, "res", distlock.WithTTL(longTTL), distlock.WithClaimWindow(claim))
	deadCtx, cancelDead := context.WithCancel(t.Context())
	deadResult := lockAsync(t, deadCtx, dead)
	waitInLine(t, srv, holder.Key(), 1)
	live := lockAsync(t, t.Context(), newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, holder.Key(), 2)

	proxy.SetBoth(faultproxy.Blackhole)
	cancelled := time.Now()
	cancelDead()
	o := await(t, deadResult, promptly, "the cut-off waiter's Lock after cancel")
	require.ErrorIs(t, o.err, context.Canceled)
	assertSoon(t, p, cancelled, o.at.Sub(cancelled), giveUpBound, "the cut-off waiter's Lock returning after its ctx was cancelled")

	released := time.Now()
	release(t, g) // passes the lock to the cut-off waiter, who never answers
	o = await(t, live, 5*time.Second, "the live waiter")
	require.NoError(t, o.err)
	idle := o.at.Sub(released)
	t.Logf("the live waiter acquired %v after the release", idle)
	assertSoon(t, p, released, idle, claim+distlock.DefaultClaimWindow/2+300*time.Millisecond,
		"the live waiter's grant after the release, with a dead waiter ahead")
	release(t, o.g)
	proxy.Heal()
	requireNothingLeft(t, lib, srv, holder.Key())
}

// W4, and regression 1 of issue 9: a waiter sleeps without using CPU and
// sends a few commands per second at most, also after its subscription was
// cut (CLIENT KILL TYPE pubsub), while a guard of its own process holds the
// lock.
func waitQuiet(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	c := connect(t, lib, srv)
	holder := newMutex(t, c, "res", distlock.WithTTL(longTTL))
	g, err := holder.Lock(t.Context())
	require.NoError(t, err)
	waitWatched(t, srv, holder.Key())
	result := lockAsync(t, t.Context(), newMutex(t, c, "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, holder.Key(), 1)
	waitSubscribed(t, srv, holder.Key(), 1)

	requireQuiet(t, srv, "waiting")

	killed, err := srv.MustDo("CLIENT", "KILL", "TYPE", "pubsub").ToInt64()
	require.NoError(t, err)
	require.Positive(t, killed)
	require.Eventually(t, func() bool { return len(wakeChannels(t, srv, holder.Key())) == 1 }, eventually, pollEvery,
		"the room never subscribed again")
	// CLIENT KILL TYPE pubsub cut the holder's keeper too: it subscribes
	// again, and, since a restart may have gone unheard meanwhile, has
	// the holder's guard renew at once. Two commands of the holder's, not
	// the waiter's.
	requireQuietBut(t, srv, "waiting after the subscription was cut", 2)

	released := time.Now()
	release(t, g)
	o := await(t, result, promptly, "the waiter")
	require.NoError(t, o.err)
	assert.Less(t, o.at.Sub(released), promptly)
	release(t, o.g)
	requireNothingLeft(t, lib, srv, holder.Key())
}

// Regression 2 of issue 9: the lock passes from a holder to a waiter of the
// same process, which releases it in turn; the waiter of another process is
// next and wakes at once (it used to wait for the first holder's value to be
// announced, up to a whole TTL).
func waitPassWithinAProcessThenToAnother(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p1, p2 := connect(t, lib, srv), connect(t, lib, srv)
	g, err := newMutex(t, p1, "res", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	local := lockAsync(t, t.Context(), newMutex(t, p1, "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, g.Key(), 1)
	remote := lockAsync(t, t.Context(), newMutex(t, p2, "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, g.Key(), 2)

	release(t, g)
	o := await(t, local, promptly, "the waiter of the holder's process")
	require.NoError(t, o.err)
	released := time.Now()
	release(t, o.g)
	o = await(t, remote, promptly, "the waiter of the other process")
	require.NoError(t, o.err)
	assert.Less(t, o.at.Sub(released), promptly)
	release(t, o.g)
	requireNothingLeft(t, lib, srv, g.Key())
}

// Regression 5 of issue 9 and W3: with Redis stopped, a waiting Lock whose
// ctx ends returns at once; once Redis is back, nothing of it holds up the
// next waiter.
func waitGiveUpWhileRedisIsStopped(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	const ttl = 3 * time.Second
	g, err := newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(ttl)).Lock(t.Context())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	result := lockAsync(t, ctx, newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(ttl)))
	waitInLine(t, srv, g.Key(), 1)

	srv.Pause()
	cancelled := time.Now()
	cancel()
	o := await(t, result, promptly, "the cancelled waiter")
	srv.Resume()
	require.ErrorIs(t, o.err, context.Canceled)
	assertSoon(t, p, cancelled, o.at.Sub(cancelled), giveUpBound, "Lock returning after its ctx was cancelled, Redis stopped")

	// The clean-up reaches Redis once it is back (or the place lapses
	// within the claim window): the line empties.
	require.Eventually(t, func() bool { return inLine(t, srv, g.Key()) == 0 }, eventually, pollEvery)
	next := lockAsync(t, t.Context(), newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(ttl)))
	waitInLine(t, srv, g.Key(), 1)
	released := time.Now()
	release(t, g)
	o = await(t, next, promptly, "the next waiter")
	require.NoError(t, o.err)
	assert.Less(t, o.at.Sub(released), promptly)
	release(t, o.g)
	requireNothingLeft(t, lib, srv, g.Key())
}

// Regression 6 of issue 9: a guard that became Lost (its key was deleted by
// an operator) does not keep the waiters of its own process from the free
// lock until it is released.
func waitLostGuardDoesNotBlock(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	c := connect(t, lib, srv)
	g, err := newMutex(t, c, "res", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	result := lockAsync(t, t.Context(), newMutex(t, c, "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, g.Key(), 1)

	srv.MustDo("DEL", g.Key())
	deleted := time.Now()
	o := await(t, result, promptly+distlock.DefaultClaimWindow, "the waiter")
	require.NoError(t, o.err)
	// The waiter finds the lock free at its next refresh at the latest.
	assert.Less(t, o.at.Sub(deleted), distlock.DefaultClaimWindow/2+promptly)
	assert.Equal(t, distlock.Acquired, o.g.State())
	release(t, o.g)
	assert.Equal(t, distlock.Lost, release(t, g), "the first guard's lease had been deleted")
	requireNothingLeft(t, lib, srv, g.Key())
}

// Regression 7 of issue 9: where the server refuses pub/sub, waiters poll,
// get the lock, and leave nothing behind, over many distinct locks.
func waitWithoutPubSub(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	c := lib.Connect(t, withoutPubSub(t, srv))
	const locks = 20
	var wg sync.WaitGroup
	for i := range locks {
		key := fmt.Sprintf("res-%d", i)
		g, err := newMutex(t, c, key, distlock.WithTTL(longTTL)).Lock(t.Context())
		require.NoError(t, err)
		result := lockAsync(t, t.Context(), newMutex(t, c, key, distlock.WithTTL(longTTL)))
		waitInLine(t, srv, g.Key(), 1)
		wg.Go(func() {
			release(t, g)
			o := await(t, result, promptly, "waiter of "+key)
			if assert.NoError(t, o.err) {
				release(t, o.g)
			}
		})
	}
	wg.Wait()
	for i := range locks {
		requireNothingLeft(t, lib, srv, fmt.Sprintf("distlock:{res-%d}", i))
	}
}

// The lease contract for a lease passed to a waiter (SAFETY.md, L1 for
// grants): the waiter did not send the write that granted it, so it counts
// its deadline from the send time of a call known to precede the grant. A
// waiter that hears of its grant but cannot reach Redis to renew it reports
// Lost before Redis can expire the lease.
func waitPassedLeaseDeadline(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	// Long enough that the grant reaches the waiter before the first
	// renewal of the lease passed to it is due (a third of the window after
	// its last call), however the waiter's refreshes fall.
	const claim = 2 * time.Second
	g, err := newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	proxy, cut := throughProxy(t, lib, srv)
	waiter := newMutex(t, cut, "res", distlock.WithTTL(longTTL), distlock.WithClaimWindow(claim))
	result := lockAsync(t, t.Context(), waiter)
	waitInLine(t, srv, g.Key(), 1)
	waitSubscribed(t, srv, g.Key(), 1)

	// The waiter still hears announcements, but nothing it sends reaches
	// Redis: it cannot renew the short lease it is passed.
	proxy.Set(faultproxy.Up, faultproxy.Blackhole)
	released := time.Now()
	release(t, g)
	releaseEnd := time.Now()
	o := await(t, result, promptly, "the cut-off waiter")
	require.NoError(t, o.err, "the waiter heard of its grant")
	wg := o.g
	d := wg.Deadline()
	require.False(t, d.IsZero(), "the waiter's deadline right after its Lock returned (state %v)", wg.State())
	assert.False(t, d.After(releaseEnd.Add(claim-margin(claim))),
		"deadline %v after the release's end; it must count from before the grant", d.Sub(releaseEnd))

	// The earliest moment Redis can expire the passed lease.
	events := wg.Subscribe(t.Context())
	expiry, ok := leaseExpiry(t, srv, g.Key())
	if ok {
		// D counts from a send before the grant ran: it is at least the
		// margin before the expiry (a millisecond for Redis's rounding).
		assert.False(t, d.After(expiry.Add(-margin(claim)+time.Millisecond)),
			"deadline %v after the earliest expiry less the margin", d.Sub(expiry.Add(-margin(claim))))
		// Every State() that says Acquired was asked before the expiry.
		for {
			asked := time.Now()
			if wg.State() != distlock.Acquired {
				break
			}
			require.True(t, asked.Before(expiry), "Acquired %v after the earliest expiry", asked.Sub(expiry))
			time.Sleep(time.Millisecond)
		}
		t.Logf("passed %v after the release began; deadline %v before the earliest expiry", o.at.Sub(released), expiry.Sub(d))
	}
	assert.NotEqual(t, distlock.Acquired, wg.State())
	ev := nextEvent(t, events)
	for ; ev.State != distlock.Lost; ev = nextEvent(t, events) {
		require.Equal(t, distlock.Acquired, ev.State, "events before Lost")
	}
	// The Lost event follows the deadline, but for the scheduling delay of
	// the guard's goroutine (L1).
	assertSoon(t, p, d, ev.Time.Sub(d), slack, "the Lost event after the deadline")
	if ok {
		assertSoon(t, p, expiry, ev.Time.Sub(expiry), slack, "the Lost event after the earliest expiry")
	}
	proxy.Heal()
	ctx, cancel := context.WithTimeout(t.Context(), eventually)
	defer cancel()
	st, _ := wg.Release(ctx) // the connections were just reset: the delete may fail
	assert.Equal(t, distlock.Lost, st)
	requireNothingLeft(t, lib, srv, g.Key())
}

// TryLock and polling never stand in line, and a free lock goes to the
// waiter first in line rather than to them.
func waitTryLockAndPollingDoNotQueueOrBarge(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	const claim = 200 * time.Millisecond
	g, err := newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	c := connect(t, lib, srv) // another process: TryLock, a poller
	_, err = newMutex(t, c, "res").TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = newMutex(t, c, "res", distlock.WithRetryInterval(10*time.Millisecond)).Lock(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Zero(t, inLine(t, srv, g.Key()), "TryLock or polling stood in line")

	// A waiter in line whose process was cut off: the lock passed to it
	// lapses, and then a poller may take it, but not before.
	proxy, cut := throughProxy(t, lib, srv)
	waiterCtx, cancelWaiter := context.WithCancel(t.Context())
	waiter := lockAsync(t, waiterCtx, newMutex(t, cut, "res", distlock.WithClaimWindow(claim)))
	waitInLine(t, srv, g.Key(), 1)
	proxy.SetBoth(faultproxy.Blackhole)
	released := time.Now()
	release(t, g)
	poller, err := newMutex(t, c, "res", distlock.WithRetryInterval(5*time.Millisecond)).Lock(t.Context())
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(released), claim-margin(claim), "the poller took the lock from the waiter first in line")
	release(t, poller)
	// W3 while the waiter's client reconnects through a dead path (a
	// client library may not watch ctx while it dials): Lock still returns
	// at once.
	cancelled := time.Now()
	cancelWaiter()
	o := await(t, waiter, promptly, "the cut-off waiter")
	require.ErrorIs(t, o.err, context.Canceled)
	assertSoon(t, p, cancelled, o.at.Sub(cancelled), giveUpBound, "the cut-off waiter's Lock returning after its ctx was cancelled")
	proxy.Heal()
	requireNothingLeft(t, lib, srv, g.Key())
}

// Settle waits for the clean-up of a wait that gave up: once it returns, the
// waiter's place is gone from the line (a program may exit then).
func waitSettle(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	g, err := newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	result := lockAsync(t, ctx, newMutex(t, connect(t, lib, srv), "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, g.Key(), 1)
	cancel()
	require.ErrorIs(t, (<-result).err, context.Canceled)
	sctx, scancel := context.WithTimeout(t.Context(), eventually)
	defer scancel()
	require.NoError(t, distlock.Settle(sctx))
	assert.Zero(t, inLine(t, srv, g.Key()), "the waiter's place outlived Settle")
	release(t, g)
	requireNothingLeft(t, lib, srv, g.Key())
}
