package distlock_test

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

// Tests of how a guard ends: Release and Leave, what State, Subscribe,
// Done and Context say meanwhile, and the words of the errors a user sees.

// atOnce bounds a call that must not wait on the network: a scheduling
// delay on a loaded 2-core machine, with room to spare, and far below the
// network waits it is compared with (a TTL of several seconds).
const atOnce = 1500 * time.Millisecond

// pausedTTL is the TTL of the tests that stop Redis while a guard holds a
// lock: the final delete then hangs for about this long, four times atOnce.
const pausedTTL = 6 * time.Second

func TestReleaseNilContextDoesNothing(t *testing.T) {
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "res")
	g, err := m.Lock(t.Context())
	require.NoError(t, err)

	//lint:ignore SA1012 testing the nil check
	st, err := g.Release(nil)
	require.ErrorIs(t, err, distlock.ErrInvalidArgument)
	assert.ErrorIs(t, err, distlock.ErrInvalidOption, "still matches, for compatibility")
	var ae *distlock.ArgumentError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, "ctx", ae.Arg)
	assert.Equal(t, distlock.Acquired, st, "state returned by Release(nil)")
	assert.Equal(t, distlock.Acquired, g.State(), "Release(nil) must not release")
	require.NoError(t, g.Context().Err(), "Release(nil) cancelled the guard's context")
	_, ok := get(t, srv, m.Key())
	assert.True(t, ok, "Release(nil) deleted the lease")
	select {
	case <-g.Done():
		t.Fatal("Release(nil) ended the guard")
	default:
	}
	assert.Equal(t, distlock.Released, release(t, g))
}

func TestSubscribeDoesNotWaitForTheFinalDelete(t *testing.T) {
	// The scene of the report: Redis stops, the holder releases, and the
	// final delete hangs until the end of the lease. Meanwhile the guard's
	// local methods answer at once.
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "res", distlock.WithTTL(pausedTTL))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	before := g.Subscribe(t.Context())
	require.Equal(t, distlock.Acquired, nextEvent(t, before).State)

	srv.Pause()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			srv.Resume()
		}
	}
	defer resume()
	type result struct {
		st  distlock.State
		err error
	}
	released := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*pausedTTL)
		defer cancel()
		st, err := g.Release(ctx)
		released <- result{st, err}
	}()
	waitState(t, g, distlock.Released)

	start := time.Now()
	subCtx, cancelSub := context.WithCancel(t.Context())
	during := g.Subscribe(subCtx)
	assert.Less(t, time.Since(start), atOnce, "Subscribe waited for the final delete")
	start = time.Now()
	assert.Equal(t, distlock.Released, g.State())
	assert.ErrorIs(t, context.Cause(g.Context()), distlock.ErrReleased)
	select {
	case <-g.Done():
		t.Fatal("Done closed while the delete is still in flight")
	default:
	}
	assert.Less(t, time.Since(start), atOnce, "State, Context or Done waited")

	// A subscription made during the release never says Acquired, and its
	// own ctx still ends it while the delete hangs.
	cancelSub()
	start = time.Now()
	for ev := range during {
		assert.NotEqual(t, distlock.Acquired, ev.State, "event of a subscription made after Release")
	}
	assert.Less(t, time.Since(start), atOnce, "cancelling a subscription waited for the final delete")

	resume()
	var r result
	select {
	case r = <-released:
	case <-time.After(2 * pausedTTL):
		t.Fatal("Release did not return after Redis came back")
	}
	require.NoError(t, r.err)
	assert.Equal(t, distlock.Released, r.st)
	var got []distlock.State
	for ev := range before {
		got = append(got, ev.State)
	}
	assert.Equal(t, []distlock.State{distlock.Released}, got, "events after Release of a subscription made before it")
}

// scriptsRun returns how many scripts srv has run: every command distlock
// sends for a lock is one (a client's own count would include the PINGs
// that rueidis sends on idle connections).
func scriptsRun(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	info, err := srv.MustDo("INFO", "commandstats").ToString()
	require.NoError(t, err)
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
		c, err := strconv.ParseInt(calls, 10, 64)
		require.NoError(t, err, "parsing %q", line)
		n += c
	}
	return n
}

// leaveTTL is the TTL of the Leave tests: the key is watched until it
// expires, so it is short, yet a renewal period (TTL/3) is far above a
// scheduling delay.
const leaveTTL = 1500 * time.Millisecond

func TestLeaveKeepsTheKeyUntilItExpires(t *testing.T) {
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "job", distlock.WithTTL(leaveTTL))
	g, err := m.TryLock(t.Context())
	require.NoError(t, err)
	value, ok := get(t, srv, m.Key())
	require.True(t, ok)
	// Wait for a renewal, so that Leave has renewals to stop.
	waitRenewed(t, srv, m.Key(), leaveTTL)

	st, err := g.Leave(t.Context())
	left := time.Now()
	require.NoError(t, err)
	assert.Equal(t, distlock.Released, st)
	atLeave := scriptsRun(t, srv)
	assert.Equal(t, distlock.Released, g.State())
	assert.Zero(t, g.Deadline())
	assert.ErrorIs(t, context.Cause(g.Context()), distlock.ErrReleased)
	select {
	case <-g.Done():
	default:
		t.Fatal("Done not closed after Leave returned")
	}

	// The key is still ours, with what is left of its TTL.
	got, ok := get(t, srv, m.Key())
	require.True(t, ok, "Leave deleted the key")
	assert.Equal(t, value, got)
	pttl, err := srv.MustDo("PTTL", m.Key()).ToInt64()
	require.NoError(t, err)
	assert.Positive(t, pttl, "the key lost its expiry")
	assert.LessOrEqual(t, time.Duration(pttl)*time.Millisecond, leaveTTL)

	// It expires by itself, one TTL after the last renewal: nothing renewed
	// it after Leave, and the guard sent nothing at all.
	require.Eventually(t, func() bool { _, ok := get(t, srv, m.Key()); return !ok },
		leaveTTL+eventually, pollEvery, "the key never expired")
	t.Logf("the key expired %v after Leave", time.Since(left))
	// And still nothing, a renewal period later.
	time.Sleep(leaveTTL / 3) // nothing to wait for: checking that nothing happens
	assert.Equal(t, atLeave, scriptsRun(t, srv), "scripts run after Leave")

	// Release after Leave is harmless and sends nothing either.
	st, err = g.Release(t.Context())
	require.NoError(t, err)
	assert.Equal(t, distlock.Released, st)
	assert.Equal(t, atLeave, scriptsRun(t, srv), "scripts run by Release after Leave")
}

func TestLeaveThenAWaiterOfTheSameProcessAcquires(t *testing.T) {
	// A waiter in this process queues behind a holder of this process that
	// got the lock through the queue; the holder leaves. The waiter must
	// not wait for a release that never comes: it takes the lock once the
	// key expires.
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "job", distlock.WithTTL(leaveTTL), distlock.WithMaxWait(leaveTTL+eventually))
	g0, err := m.Lock(t.Context())
	require.NoError(t, err)

	lockInBackground := func() <-chan *distlock.Guard {
		ch := make(chan *distlock.Guard, 1)
		before := scriptsRun(t, srv)
		go func() {
			g, err := m.Lock(t.Context())
			assert.NoError(t, err)
			ch <- g
		}()
		// The waiter's first attempt has run.
		require.Eventually(t, func() bool { return scriptsRun(t, srv) > before }, eventually, pollEvery)
		return ch
	}
	first := lockInBackground()
	release(t, g0)
	g1 := <-first
	require.NotNil(t, g1)
	v1, ok := get(t, srv, m.Key())
	require.True(t, ok)

	second := lockInBackground()
	_, err = g1.Leave(t.Context())
	require.NoError(t, err)
	left := time.Now()
	g2 := <-second
	require.NotNil(t, g2, "the waiter never got the lock after Leave")
	took := time.Since(left)
	v2, ok := get(t, srv, m.Key())
	require.True(t, ok)
	assert.NotEqual(t, v1, v2)
	assert.Greater(t, g2.Token(), g1.Token())
	assert.Less(t, took, leaveTTL+eventually)
	release(t, g2)
}

func TestDeadline(t *testing.T) {
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "job", distlock.WithTTL(leaveTTL))
	before := time.Now()
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	after := time.Now()
	d := g.Deadline()
	// Counted from the send time of the acquisition, which lies between
	// before and after.
	assert.False(t, d.Before(before.Add(leaveTTL-distlock.Margin(leaveTTL))), "deadline %v too early", d)
	assert.False(t, d.After(after.Add(leaveTTL-distlock.Margin(leaveTTL))), "deadline %v too late", d)
	assert.Equal(t, distlock.Acquired, g.State())
	release(t, g)
	assert.Zero(t, g.Deadline(), "after Release")
}

func TestErrorWords(t *testing.T) {
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "res")

	t.Run("nil ctx is an argument, not an option", func(t *testing.T) {
		//lint:ignore SA1012 testing the nil check
		_, err := m.Lock(nil)
		require.ErrorIs(t, err, distlock.ErrInvalidOption, "kept for compatibility")
		assert.NotContains(t, err.Error(), "option")
		assert.Equal(t, "distlock: ctx is nil", err.Error())
	})
	t.Run("TryLock with a cancelled ctx does not say waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := m.TryLock(ctx)
		require.ErrorIs(t, err, context.Canceled)
		assert.NotContains(t, err.Error(), "waiting")
		assert.Equal(t, 1, strings.Count(err.Error(), "distlock: "), "prefixes in %q", err)
	})
	t.Run("options say which one", func(t *testing.T) {
		_, err := distlock.NewMutex(srv.Client(), "", distlock.WithTTL(time.Second))
		require.ErrorIs(t, err, distlock.ErrInvalidOption)
		assert.Equal(t, "distlock: key is empty", err.Error())
		_, err = distlock.NewMutex(srv.Client(), "k", distlock.WithTTL(0))
		assert.Equal(t, "distlock: invalid ttl: 0s is not positive", err.Error())
		_, err = distlock.NewMutex(srv.Client(), "k", distlock.WithLogger(nil))
		assert.Equal(t, "distlock: logger is nil", err.Error())
	})
	t.Run("replica ack names the key once", func(t *testing.T) {
		// A lone primary has no replica to acknowledge anything.
		ma := newMutex(t, srv.Client(), "acked", distlock.WithReplicaAck(1, 5*time.Millisecond))
		_, err := ma.TryLock(t.Context())
		require.ErrorIs(t, err, distlock.ErrNotReplicated)
		msg := err.Error()
		assert.Equal(t, 1, strings.Count(msg, "distlock: "), "prefixes in %q", msg)
		assert.Equal(t, 1, strings.Count(msg, ma.Key()), "key repeated in %q", msg)
		var ae *distlock.ReplicaAckError
		require.True(t, errors.As(err, &ae))
		assert.Equal(t, ma.Key(), ae.Key, "the key is still in the error's fields")
	})
}
