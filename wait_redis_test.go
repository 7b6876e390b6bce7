package distlock_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Tests of waiting (SAFETY.md, W1-W5), against real redis-server processes.
// A separate rueidis client stands for a separate process: waiters of two
// clients can only learn of each other through Redis.

const (
	// longTTL is a holder's TTL when only a release, never an expiry, may
	// explain how soon a waiter acquires.
	longTTL = 30 * time.Second
	// promptly bounds a wake-up that takes a push and a round trip: far
	// above that on an idle machine, far below longTTL.
	promptly = 2 * time.Second
	// giveUpBound bounds how long Lock may take to return once its ctx is
	// done. A network wait would take the clean-up's timeout (250ms) or the
	// call's deadline (seconds here); a scheduling delay on a loaded 2-core
	// machine stays well below.
	giveUpBound = 200 * time.Millisecond
)

// outcome is what a Lock call in the background returned, and when.
type outcome struct {
	g   *distlock.Guard
	err error
	at  time.Time
}

// lockAsync runs m.Lock(ctx) in the background. The test waits for the
// result (or the goroutine) before it ends.
func lockAsync(t *testing.T, ctx context.Context, m *distlock.Mutex) <-chan outcome {
	t.Helper()
	ch := make(chan outcome, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		g, err := m.Lock(ctx)
		ch <- outcome{g: g, err: err, at: time.Now()}
	})
	t.Cleanup(wg.Wait)
	return ch
}

// await returns the outcome, failing the test if it takes longer than within.
func await(t *testing.T, ch <-chan outcome, within time.Duration, what string) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(within):
		t.Fatalf("%s: no result within %v", what, within)
		return outcome{}
	}
}

// inLine returns how many waiters stand in the line of the lock at key.
func inLine(t *testing.T, srv *redistest.Server, key string) int64 {
	t.Helper()
	n, err := srv.MustDo("ZCARD", key+":queue").ToInt64()
	require.NoError(t, err)
	return n
}

// waitInLine waits until n waiters stand in the line of the lock at key.
func waitInLine(t *testing.T, srv *redistest.Server, key string, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return inLine(t, srv, key) == n }, eventually, pollEvery,
		"waiting for %d in line at %s", n, key)
}

// wakeChannels returns the wake channels of the lock at key that have a
// subscriber.
func wakeChannels(t *testing.T, srv *redistest.Server, key string) []string {
	t.Helper()
	chans, err := srv.MustDo("PUBSUB", "SHARDCHANNELS", key+":wake:*").AsStrSlice()
	require.NoError(t, err)
	return chans
}

// exists reports whether key exists.
func exists(t *testing.T, srv *redistest.Server, key string) bool {
	t.Helper()
	n, err := srv.MustDo("EXISTS", key).ToInt64()
	require.NoError(t, err)
	return n == 1
}

// requireNothingLeft checks W5: once every waiter has left and the rooms
// have lingered, the lock leaves no line, no subscription and no room.
func requireNothingLeft(t *testing.T, srv *redistest.Server, key string) {
	t.Helper()
	require.Eventually(t, func() bool {
		return !exists(t, srv, key+":queue") && !exists(t, srv, key+":waiters") &&
			len(wakeChannels(t, srv, key)) == 0 && distlock.Rooms() == 0
	}, eventually, pollEvery, "left behind: queue %v, waiters %v, subscriptions %v, rooms %d",
		exists(t, srv, key+":queue"), exists(t, srv, key+":waiters"), wakeChannels(t, srv, key), distlock.Rooms())
}

// throughProxy returns a fault proxy in front of srv and the options of a
// client that reaches srv through it.
func throughProxy(t *testing.T, srv *redistest.Server) (*faultproxy.Proxy, rueidis.ClientOption) {
	t.Helper()
	proxy := faultproxy.New(t, srv.Addr())
	opt := srv.ClientOption()
	opt.InitAddress = []string{proxy.Addr()}
	return proxy, opt
}

// openAllConnections makes c open every pooled connection (keyed commands
// pick one at random), so that a reset breaks them all while idle.
func openAllConnections(t *testing.T, c rueidis.Client) {
	t.Helper()
	for i := range 64 {
		require.NoError(t, c.Do(t.Context(), c.B().Exists().Key(strconv.Itoa(i)).Build()).Error())
	}
}

// cpuTime returns the CPU time this process has used.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// W1, W2: a release in one process wakes the first waiter in another at
// once, and waiters in several processes get the lock in the order they
// came.
func TestWaitersAcquireInOrderAcrossProcesses(t *testing.T) {
	srv := redistest.Start(t)
	clients := []rueidis.Client{srv.Client(), srv.Client(), srv.Client()}
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
	requireNothingLeft(t, srv, holder.Key())
}

// W1: a holder that died without releasing is taken over as soon as its
// lease expires, by the first waiter in line, without polling.
func TestWaiterTakesCrashedHoldersLeaseAtExpiry(t *testing.T) {
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "res")
	const ttl = 700 * time.Millisecond
	// Read before the SET: the lease cannot expire before written + ttl.
	written := time.Now()
	srv.MustDo("SET", m.Key(), "crashed#1", "PX", strconv.Itoa(int(ttl.Milliseconds())))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	late := time.Since(written) - ttl
	t.Logf("acquired %v after the crashed holder's lease expired", late)
	assert.GreaterOrEqual(t, late, time.Duration(0), "acquired before the lease expired")
	assert.Less(t, late, 300*time.Millisecond, "took too long after expiry")
	// The first call, a poll or two until the room's subscription is up and
	// one when it is, a refresh every half claim window, the one at expiry;
	// polling would have made one every 50ms.
	assert.LessOrEqual(t, g.Attempt(), 4+int(ttl/(distlock.DefaultClaimWindow/2)))
	release(t, g)
	requireNothingLeft(t, srv, m.Key())
}

// W1 with a dead waiter ahead: a waiter whose process can no longer reach
// Redis (killed, frozen or cut off) is passed the lock, cannot claim it, and
// the next waiter gets it once the claim window has passed, not a TTL later.
// Also W3: the dead waiter's own Lock, cancelled, returns at once although
// its clean-up cannot reach Redis.
func TestDeadWaiterCostsAtMostTheClaimWindow(t *testing.T) {
	srv := redistest.Start(t)
	const claim = 300 * time.Millisecond
	holder := newMutex(t, srv.Client(), "res", distlock.WithTTL(longTTL))
	g, err := holder.Lock(t.Context())
	require.NoError(t, err)

	proxy, opt := throughProxy(t, srv)
	dead := newMutex(t, redistest.NewClient(t, opt), "res", distlock.WithTTL(longTTL), distlock.WithClaimWindow(claim))
	deadCtx, cancelDead := context.WithCancel(t.Context())
	deadResult := lockAsync(t, deadCtx, dead)
	waitInLine(t, srv, holder.Key(), 1)
	live := lockAsync(t, t.Context(), newMutex(t, srv.Client(), "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, holder.Key(), 2)

	proxy.SetBoth(faultproxy.Blackhole)
	cancelled := time.Now()
	cancelDead()
	o := await(t, deadResult, promptly, "the cut-off waiter's Lock after cancel")
	require.ErrorIs(t, o.err, context.Canceled)
	assert.Less(t, o.at.Sub(cancelled), giveUpBound, "Lock waited %v to give up", o.at.Sub(cancelled))

	released := time.Now()
	release(t, g) // passes the lock to the cut-off waiter, who never answers
	o = await(t, live, 5*time.Second, "the live waiter")
	require.NoError(t, o.err)
	idle := o.at.Sub(released)
	t.Logf("the live waiter acquired %v after the release", idle)
	assert.Less(t, idle, claim+distlock.DefaultClaimWindow/2+300*time.Millisecond,
		"a dead waiter ahead held the lock up for %v", idle)
	release(t, o.g)
	proxy.Heal()
	requireNothingLeft(t, srv, holder.Key())
}

// W4, and regression 1 of issue 9: a waiter sleeps without using CPU and
// sends a few commands per second at most, also after its subscription was
// cut (CLIENT KILL TYPE pubsub), while a guard of its own process holds the
// lock.
func TestWaitingIsQuiet(t *testing.T) {
	srv := redistest.Start(t)
	c, counter := srv.CountingClient(t)
	holder := newMutex(t, c, "res", distlock.WithTTL(longTTL))
	g, err := holder.Lock(t.Context())
	require.NoError(t, err)
	result := lockAsync(t, t.Context(), newMutex(t, c, "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, holder.Key(), 1)
	require.Eventually(t, func() bool { return len(wakeChannels(t, srv, holder.Key())) == 1 }, eventually, pollEvery)

	measure := func(what string) {
		const window = 2 * time.Second
		cmds, cpu := counter.Load(), cpuTime(t)
		time.Sleep(window)
		cmds, cpu = counter.Load()-cmds, cpuTime(t)-cpu
		t.Logf("%s: %d commands and %v of CPU in %v", what, cmds, cpu, window)
		// A refresh every half claim window; and three to spare for what a
		// (re)subscription can add as the window opens: the waiter's call
		// when its room's subscription is confirmed, and rueidis's own
		// commands on a new connection. Polling would send one every 50ms,
		// and the spinning this replaced used 60% of a core.
		assert.LessOrEqual(t, cmds, int64(window/(distlock.DefaultClaimWindow/2))+3, "%s: commands while waiting", what)
		assert.Less(t, cpu, window/5, "%s: CPU while waiting", what)
	}
	measure("waiting")

	killed, err := srv.MustDo("CLIENT", "KILL", "TYPE", "pubsub").ToInt64()
	require.NoError(t, err)
	require.Positive(t, killed)
	require.Eventually(t, func() bool { return len(wakeChannels(t, srv, holder.Key())) == 1 }, eventually, pollEvery,
		"the room never subscribed again")
	measure("waiting after the subscription was cut")

	released := time.Now()
	release(t, g)
	o := await(t, result, promptly, "the waiter")
	require.NoError(t, o.err)
	assert.Less(t, o.at.Sub(released), promptly)
	release(t, o.g)
	requireNothingLeft(t, srv, holder.Key())
}

// Regression 2 of issue 9: the lock passes from a holder to a waiter of the
// same process, which releases it in turn; the waiter of another process is
// next and wakes at once (it used to wait for the first holder's value to be
// announced, up to a whole TTL).
func TestPassWithinAProcessThenToAnother(t *testing.T) {
	srv := redistest.Start(t)
	p1, p2 := srv.Client(), srv.Client()
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
	requireNothingLeft(t, srv, g.Key())
}

// Regression 3 of issue 9: the release that passes the lock to a waiter of
// the same process goes out on a pooled connection that died while idle. It
// is retried, and the waiter gets the lock at once, not after the TTL.
func TestPassAfterIdleConnectionsDied(t *testing.T) {
	srv := redistest.Start(t)
	proxy, opt := throughProxy(t, srv)
	opt.PipelineMultiplex = 2 // four connections, chosen at random per command
	c := redistest.NewClient(t, opt)
	g, err := newMutex(t, c, "res", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	result := lockAsync(t, t.Context(), newMutex(t, c, "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, g.Key(), 1)
	openAllConnections(t, c)

	proxy.Reset()
	released := time.Now()
	assert.Equal(t, distlock.Released, release(t, g))
	o := await(t, result, promptly, "the waiter")
	require.NoError(t, o.err)
	assert.Less(t, o.at.Sub(released), promptly)
	release(t, o.g)
	requireNothingLeft(t, srv, g.Key())
}

// Regression 5 of issue 9 and W3: with Redis stopped, a waiting Lock whose
// ctx ends returns at once; once Redis is back, nothing of it holds up the
// next waiter.
func TestGiveUpWhileRedisIsStopped(t *testing.T) {
	srv := redistest.Start(t)
	const ttl = 3 * time.Second
	g, err := newMutex(t, srv.Client(), "res", distlock.WithTTL(ttl)).Lock(t.Context())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	result := lockAsync(t, ctx, newMutex(t, srv.Client(), "res", distlock.WithTTL(ttl)))
	waitInLine(t, srv, g.Key(), 1)

	srv.Pause()
	cancelled := time.Now()
	cancel()
	o := await(t, result, promptly, "the cancelled waiter")
	srv.Resume()
	require.ErrorIs(t, o.err, context.Canceled)
	assert.Less(t, o.at.Sub(cancelled), giveUpBound, "Lock took %v to give up", o.at.Sub(cancelled))

	// The clean-up reaches Redis once it is back (or the place lapses
	// within the claim window): the line empties.
	require.Eventually(t, func() bool { return inLine(t, srv, g.Key()) == 0 }, eventually, pollEvery)
	next := lockAsync(t, t.Context(), newMutex(t, srv.Client(), "res", distlock.WithTTL(ttl)))
	waitInLine(t, srv, g.Key(), 1)
	released := time.Now()
	release(t, g)
	o = await(t, next, promptly, "the next waiter")
	require.NoError(t, o.err)
	assert.Less(t, o.at.Sub(released), promptly)
	release(t, o.g)
	requireNothingLeft(t, srv, g.Key())
}

// Regression 6 of issue 9: a guard that became Lost (its key was deleted by
// an operator) does not keep the waiters of its own process from the free
// lock until it is released.
func TestLostGuardDoesNotBlockWaitersOfItsProcess(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
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
	requireNothingLeft(t, srv, g.Key())
}

// Regression 7 of issue 9: where the server refuses pub/sub, waiters poll,
// get the lock, and leave nothing behind, over many distinct locks.
func TestWaitingWithoutPubSub(t *testing.T) {
	srv := redistest.Start(t)
	srv.MustDo("ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-@pubsub")
	opt := srv.ClientOption()
	opt.Username, opt.Password = "app", "secret"
	c := redistest.NewClient(t, opt)
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
		requireNothingLeft(t, srv, fmt.Sprintf("distlock:{res-%d}", i))
	}
}

// A restart without persistence loses the lease and the line: the waiters
// ask again, one takes the free lock, the other stands in line again, and
// nobody sleeps forever.
func TestWaitersSurviveARestart(t *testing.T) {
	srv := redistest.Start(t)
	g, err := newMutex(t, srv.Client(), "res", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	first := lockAsync(t, t.Context(), newMutex(t, srv.Client(), "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, g.Key(), 1)
	second := lockAsync(t, t.Context(), newMutex(t, srv.Client(), "res", distlock.WithTTL(longTTL)))
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
	select {
	case o2 := <-other:
		t.Fatalf("the other waiter acquired too (err %v)", o2.err)
	default:
	}
	release(t, o.g)
	o = await(t, other, promptly, "the other waiter")
	require.NoError(t, o.err)
	release(t, o.g)
	assert.Equal(t, distlock.Lost, release(t, g), "the holder's lease died with the restart")
	requireNothingLeft(t, srv, g.Key())
}

// The lease contract for a lease passed to a waiter (SAFETY.md, L1 for
// grants): the waiter did not send the write that granted it, so it counts
// its deadline from the send time of a call known to precede the grant. A
// waiter that hears of its grant but cannot reach Redis to renew it reports
// Lost before Redis can expire the lease.
func TestPassedLeaseDeadlinePrecedesItsExpiry(t *testing.T) {
	srv := redistest.Start(t)
	// Long enough that the grant reaches the waiter before the first
	// renewal of the lease passed to it is due (a third of the window after
	// its last call), however the waiter's refreshes fall.
	const claim = 2 * time.Second
	g, err := newMutex(t, srv.Client(), "res", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	proxy, opt := throughProxy(t, srv)
	waiter := newMutex(t, redistest.NewClient(t, opt), "res", distlock.WithTTL(longTTL), distlock.WithClaimWindow(claim))
	result := lockAsync(t, t.Context(), waiter)
	waitInLine(t, srv, g.Key(), 1)
	require.Eventually(t, func() bool { return len(wakeChannels(t, srv, g.Key())) == 1 }, eventually, pollEvery)

	// The waiter still hears announcements, but nothing it sends reaches
	// Redis: it cannot renew the short lease it is passed.
	proxy.Set(faultproxy.Up, faultproxy.Blackhole)
	released := time.Now()
	release(t, g)
	releaseEnd := time.Now()
	o := await(t, result, promptly, "the cut-off waiter")
	require.NoError(t, o.err, "the waiter heard of its grant")
	wg := o.g
	d := distlock.LeaseDeadline(wg)
	assert.False(t, d.After(releaseEnd.Add(claim-distlock.Margin(claim))),
		"deadline %v after the release's end; it must count from before the grant", d.Sub(releaseEnd))

	// The earliest moment Redis can expire the passed lease: PTTL counts
	// from when Redis ran it, which is after t0.
	t0 := time.Now()
	pttl, err := srv.MustDo("PTTL", g.Key()).ToInt64()
	require.NoError(t, err)
	events := wg.Subscribe(t.Context())
	if pttl > 0 {
		expiry := t0.Add(time.Duration(pttl) * time.Millisecond)
		assert.True(t, d.Before(expiry), "deadline %v after the earliest expiry", d.Sub(expiry))
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
	for ev := nextEvent(t, events); ev.State != distlock.Lost; ev = nextEvent(t, events) {
		require.Equal(t, distlock.Acquired, ev.State, "events before Lost")
	}
	proxy.Heal()
	ctx, cancel := context.WithTimeout(t.Context(), eventually)
	defer cancel()
	st, _ := wg.Release(ctx) // the connections were just reset: the delete may fail
	assert.Equal(t, distlock.Lost, st)
	requireNothingLeft(t, srv, g.Key())
}

// WithReplicaAck: a waiter passed the lock reports Acquired only after a
// write of its own that the replicas acknowledged. With the replica stopped,
// the claim is not acknowledged, Lock fails, and the lock goes on to the next
// waiter at once.
func TestPassedLeaseNeedsAnAcknowledgedClaim(t *testing.T) {
	rs := startReplicated(t)
	g, err := newMutex(t, rs.primary.Client(), "acked", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	key := g.Key()
	acked := lockAsync(t, t.Context(), newMutex(t, rs.primary.Client(), "acked", distlock.WithReplicaAck(1, ackTimeout)))
	waitInLine(t, rs.primary, key, 1)
	next := lockAsync(t, t.Context(), newMutex(t, rs.primary.Client(), "acked", distlock.WithTTL(longTTL)))
	waitInLine(t, rs.primary, key, 2)

	rs.replica.Pause()
	released := time.Now()
	release(t, g)
	o := await(t, acked, promptly+ackTimeout, "the waiter that needs an acknowledgement")
	rs.replica.Resume()
	require.ErrorIs(t, o.err, distlock.ErrNotReplicated, "with the replica stopped")
	o = await(t, next, promptly+ackTimeout, "the next waiter")
	require.NoError(t, o.err)
	t.Logf("the next waiter acquired %v after the release", o.at.Sub(released))
	release(t, o.g)

	// With the replica running, the waiter's Lock returns only once the
	// replica has its lease.
	g, err = newMutex(t, rs.primary.Client(), "acked", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	acked = lockAsync(t, t.Context(), newMutex(t, rs.primary.Client(), "acked", distlock.WithReplicaAck(1, ackTimeout)))
	waitInLine(t, rs.primary, key, 1)
	release(t, g)
	o = await(t, acked, promptly, "the acknowledged waiter")
	require.NoError(t, o.err)
	value, ok := get(t, rs.replica, key)
	require.True(t, ok, "the lease is not on the replica although Lock returned")
	primaryValue, _ := get(t, rs.primary, key)
	assert.Equal(t, primaryValue, value)
	release(t, o.g)
	requireNothingLeft(t, rs.primary, key)
}

// TryLock and polling never stand in line, and a free lock goes to the
// waiter first in line rather than to them.
func TestTryLockAndPollingDoNotQueueOrBarge(t *testing.T) {
	srv := redistest.Start(t)
	const claim = 200 * time.Millisecond
	g, err := newMutex(t, srv.Client(), "res", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	_, err = newMutex(t, srv.Client(), "res").TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = newMutex(t, srv.Client(), "res", distlock.WithRetryInterval(10*time.Millisecond)).Lock(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Zero(t, inLine(t, srv, g.Key()), "TryLock or polling stood in line")

	// A waiter in line whose process was cut off: the lock passed to it
	// lapses, and then a poller may take it, but not before.
	proxy, opt := throughProxy(t, srv)
	waiterCtx, cancelWaiter := context.WithCancel(t.Context())
	waiter := lockAsync(t, waiterCtx, newMutex(t, redistest.NewClient(t, opt), "res", distlock.WithClaimWindow(claim)))
	waitInLine(t, srv, g.Key(), 1)
	proxy.SetBoth(faultproxy.Blackhole)
	released := time.Now()
	release(t, g)
	poller, err := newMutex(t, srv.Client(), "res", distlock.WithRetryInterval(5*time.Millisecond)).Lock(t.Context())
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(released), claim-distlock.Margin(claim), "the poller took the lock from the waiter first in line")
	release(t, poller)
	// W3 while the waiter's client reconnects through a dead path (rueidis
	// does not watch ctx while it dials): Lock still returns at once.
	cancelled := time.Now()
	cancelWaiter()
	o := await(t, waiter, promptly, "the cut-off waiter")
	require.ErrorIs(t, o.err, context.Canceled)
	assert.Less(t, o.at.Sub(cancelled), giveUpBound, "Lock took %v to give up", o.at.Sub(cancelled))
	proxy.Heal()
	requireNothingLeft(t, srv, g.Key())
}

// A waiting Lock whose first call goes out on a pooled connection that died
// while idle sends it again, rather than fail with the connection's error.
func TestLockAfterIdleConnectionsDied(t *testing.T) {
	srv := redistest.Start(t)
	g, err := newMutex(t, srv.Client(), "res", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	proxy, opt := throughProxy(t, srv)
	opt.PipelineMultiplex = 2 // four connections, chosen at random per command
	c := redistest.NewClient(t, opt)
	openAllConnections(t, c)
	proxy.Reset()
	result := lockAsync(t, t.Context(), newMutex(t, c, "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, g.Key(), 1)
	release(t, g)
	o := await(t, result, promptly, "the waiter")
	require.NoError(t, o.err)
	release(t, o.g)
	requireNothingLeft(t, srv, g.Key())
}

// Settle waits for the clean-up of a wait that gave up: once it returns, the
// waiter's place is gone from the line (a program may exit then).
func TestSettleWaitsForTheCleanUp(t *testing.T) {
	srv := redistest.Start(t)
	g, err := newMutex(t, srv.Client(), "res", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	result := lockAsync(t, ctx, newMutex(t, srv.Client(), "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, g.Key(), 1)
	cancel()
	require.ErrorIs(t, (<-result).err, context.Canceled)
	sctx, scancel := context.WithTimeout(t.Context(), eventually)
	defer scancel()
	require.NoError(t, distlock.Settle(sctx))
	assert.Zero(t, inLine(t, srv, g.Key()), "the waiter's place outlived Settle")
	release(t, g)
	requireNothingLeft(t, srv, g.Key())
}
