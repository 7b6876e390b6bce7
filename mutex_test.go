package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/history"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Timing used across the tests. Scheduling on a busy 2-core machine can add
// tens of milliseconds to any wake-up, so waits for an outcome are generous
// and assertions about "not before" use the contract's own bounds.
const (
	shortTTL    = 600 * time.Millisecond
	eventually  = 5 * time.Second // upper bound for something that should happen soon
	pollEvery   = 5 * time.Millisecond
	tokenWindow = 10 * time.Minute // tokens are server microseconds; they must be recent
)

// testLogger logs through t at debug level.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func newMutex(t *testing.T, c rueidis.Client, key string, opts ...distlock.Option) *distlock.Mutex {
	t.Helper()
	m, err := distlock.NewMutex(c, key, opts...)
	require.NoError(t, err)
	return m
}

func release(t *testing.T, g *distlock.Guard) distlock.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()
	st, err := g.Release(ctx)
	require.NoError(t, err)
	return st
}

// waitState waits until g reports want.
func waitState(t *testing.T, g *distlock.Guard, want distlock.State) {
	t.Helper()
	require.Eventually(t, func() bool { return g.State() == want }, eventually, pollEvery,
		"guard never reached state %v", want)
}

// nextEvent returns the next event on ch, failing the test after a while.
func nextEvent(t *testing.T, ch <-chan distlock.Event) distlock.Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		require.True(t, ok, "subscription closed early")
		return ev
	case <-time.After(eventually):
		t.Fatal("no event")
	}
	return distlock.Event{}
}

// waitRenewed waits until the lease key has been renewed at least once since
// it was written with ttl: its remaining TTL goes back up.
func waitRenewed(t *testing.T, srv *redistest.Server, key string, ttl time.Duration) {
	t.Helper()
	start := time.Now()
	require.Eventually(t, func() bool {
		pttl, err := srv.MustDo("PTTL", key).ToInt64()
		require.NoError(t, err)
		return time.Since(start) > ttl/3 && time.Duration(pttl)*time.Millisecond > ttl-time.Since(start)+ttl/10
	}, eventually, pollEvery, "lease %s was never renewed", key)
}

func get(t *testing.T, srv *redistest.Server, key string) (string, bool) {
	t.Helper()
	msg := srv.MustDo("GET", key)
	if msg.IsNil() {
		return "", false
	}
	s, err := msg.ToString()
	require.NoError(t, err)
	return s, true
}

func TestLockAndRelease(t *testing.T) {
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "job", distlock.WithOwner("worker-1"), distlock.WithTTL(2*time.Second))
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

func TestTryLockHeld(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
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

func TestWaitingAcquiresAfterRelease(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	// b's client records its lease script calls (not the handshakes of the
	// connections rueidis opens as it goes, which a count of commands would
	// take for attempts).
	wb := newWire(redistest.NewClient(t, srv.ClientOption()), &history.Recorder{}, newTokenBook())
	a := newMutex(t, c, "res")
	b := newMutex(t, wb, "res", distlock.WithRetryInterval(10*time.Millisecond))

	ga, err := a.Lock(t.Context())
	require.NoError(t, err)

	got := make(chan *distlock.Guard, 1)
	errc := make(chan error, 1)
	go func() {
		g, err := b.Lock(t.Context())
		errc <- err
		got <- g
	}()
	// Let b make an attempt that is refused while a holds the lock. (A
	// fixed sleep is not enough on a busy machine, where b may not even
	// have started.)
	require.Eventually(t, func() bool {
		return len(wb.find(func(c wireCall) bool { return c.kind == acquireCall && c.done && c.err == nil && !c.ok })) > 0
	}, eventually, pollEvery, "b made no attempt that was refused")
	select {
	case <-got:
		t.Fatal("b acquired while a held the lock")
	default:
	}
	tokenA := ga.Token()
	release(t, ga)
	require.NoError(t, <-errc)
	gb := <-got
	assert.Greater(t, gb.Token(), tokenA)
	assert.Positive(t, gb.Attempt(), "b should have needed more than one attempt")
	release(t, gb)
}

func TestTimeouts(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
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

func TestContentionNoOverlap(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	checkContention(t, func(int) rueidis.Client { return c }, "counter", 6, 15)
}

// checkContention has workers goroutines take the lock key rounds times each
// (polling every millisecond), through clients from client, and checks that
// no two ever hold it at once, that a counter updated under the lock loses
// no update, and that tokens strictly increase in grant order.
func checkContention(t *testing.T, client func(w int) rueidis.Client, key string, workers, rounds int) {
	t.Helper()
	var (
		inside  atomic.Int32
		counter int // updated under the lock only, without atomics: -race checks it
		mu      sync.Mutex
		tokens  []int64
	)
	var wg sync.WaitGroup
	for w := range workers {
		m := newMutex(t, client(w), key, distlock.WithOwner(fmt.Sprint("w", w)),
			distlock.WithTTL(time.Second), distlock.WithRetryInterval(time.Millisecond))
		wg.Go(func() {
			for range rounds {
				g, err := m.Lock(t.Context())
				if !assert.NoError(t, err) {
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders at once", n)
				}
				mu.Lock()
				tokens = append(tokens, g.Token())
				mu.Unlock()
				counter++
				inside.Add(-1)
				assert.Equal(t, distlock.Released, release(t, g))
			}
		})
	}
	wg.Wait()
	assert.Equal(t, workers*rounds, counter)
	require.Len(t, tokens, workers*rounds)
	// Tokens were recorded in grant order (the lock serialises the appends).
	for i := 1; i < len(tokens); i++ {
		require.Greater(t, tokens[i], tokens[i-1], "token %d not above token %d", i, i-1)
	}
}

func TestTokensIncreaseAcrossRestart(t *testing.T) {
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "res")
	var last int64
	for range 3 {
		g, err := m.TryLock(t.Context())
		require.NoError(t, err)
		require.Greater(t, g.Token(), last)
		last = g.Token()
		release(t, g)
	}
	// A restart without persistence loses the fencing key; tokens still
	// increase because they are seeded from the server clock.
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

func TestLostWhenKeyDeleted(t *testing.T) {
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "res", distlock.WithTTL(shortTTL))
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

	// A renewal never re-creates the key.
	time.Sleep(shortTTL / 2)
	_, ok := get(t, srv, m.Key())
	assert.False(t, ok, "a renewal re-created a deleted lease")

	assert.Equal(t, distlock.Lost, release(t, g))
	ev = nextEvent(t, events)
	assert.Equal(t, distlock.Released, ev.State)
	_, open := <-events
	assert.False(t, open, "subscription not closed after Released")
}

func TestLostWhenOverwrittenAndReleaseSparesNewHolder(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	m := newMutex(t, c, "res", distlock.WithTTL(shortTTL))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)

	// An operator (or a bug elsewhere) hands the key to someone else.
	srv.MustDo("SET", m.Key(), "intruder#1", "PX", "60000")
	waitState(t, g, distlock.Lost)
	var le *distlock.LostError
	require.ErrorAs(t, context.Cause(g.Context()), &le)
	assert.Equal(t, distlock.LostRefused, le.Reason)
	assert.Equal(t, "intruder#1", le.Holder)

	assert.Equal(t, distlock.Lost, release(t, g))
	v, ok := get(t, srv, m.Key())
	require.True(t, ok, "release deleted the new holder's key")
	assert.Equal(t, "intruder#1", v)
}

func TestLostByDeadlineWhileRedisStopped(t *testing.T) {
	srv := redistest.Start(t)
	const ttl = 900 * time.Millisecond
	m := newMutex(t, srv.Client(), "res", distlock.WithTTL(ttl))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	events := g.Subscribe(t.Context())
	require.Equal(t, distlock.Acquired, nextEvent(t, events).State)

	// Redis hangs: renewals are sent but never answered. The guard must give
	// the lease up by its deadline, before Redis could expire it, although a
	// renewal is still in flight.
	probe := startProbe(t, nil)
	srv.Pause()
	paused := time.Now()
	defer srv.Resume()
	ev := nextEvent(t, events)
	require.Equal(t, distlock.Lost, ev.State)
	require.ErrorIs(t, ev.Err, distlock.ErrLost)
	assert.Equal(t, distlock.Lost, g.State())
	// The last confirmed renewal was sent before the pause, and Redis
	// expires the key no sooner than TTL after it: the guard became Lost
	// before that, unless its actor ran late (State does not wait for it).
	lostAfter := ev.Time.Sub(paused)
	late := stepHops * probe.delay(paused, ev.Time)
	assert.Less(t, lostAfter, ttl+late, "Lost %v after the pause, TTL is %v (%v explained by scheduling)",
		lostAfter, ttl, late)

	srv.Resume()
	st := release(t, g)
	assert.Contains(t, []distlock.State{distlock.Lost}, st)
}

func TestRegainAfterShortOutage(t *testing.T) {
	srv := redistest.Start(t)
	proxy := faultproxy.New(t, srv.Addr())
	opt := srv.ClientOption()
	opt.InitAddress = []string{proxy.Addr()}
	// One connection: rueidis opens its extra pipeline connections lazily,
	// and one opened while replies are held cannot finish its handshake, so
	// commands sent on it would not reach Redis as this test needs.
	opt.PipelineMultiplex = -1
	c := redistest.NewClient(t, opt)

	const ttl = 900 * time.Millisecond
	m := newMutex(t, c, "res", distlock.WithTTL(ttl), distlock.WithLogger(testLogger(t)))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	token := g.Token()
	events := g.Subscribe(t.Context())
	require.Equal(t, distlock.Acquired, nextEvent(t, events).State)
	waitRenewed(t, srv, m.Key(), ttl)

	// Replies stop coming back, but commands still reach Redis, so the key
	// keeps being renewed there while the guard cannot confirm it.
	proxy.Set(faultproxy.Down, faultproxy.Pause)
	ev := nextEvent(t, events)
	require.Equal(t, distlock.Lost, ev.State)
	proxy.Set(faultproxy.Down, faultproxy.Pass)

	ev = nextEvent(t, events)
	require.Equal(t, distlock.Acquired, ev.State, "the guard should regain its lease")
	assert.Equal(t, distlock.Acquired, g.State())
	assert.Equal(t, token, g.Token())
	// The context stays cancelled: the time in between was unprotected.
	assert.ErrorIs(t, context.Cause(g.Context()), distlock.ErrLost)
	// Release reports the state at release time: held again.
	assert.Equal(t, distlock.Released, release(t, g))
}

func TestContextCancelReleases(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
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

func TestSubscribe(t *testing.T) {
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "res")
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
		short := newMutex(t, srv.Client(), "short", distlock.WithTTL(shortTTL))
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

func TestReleaseWithRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "res", distlock.WithTTL(shortTTL))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	srv.Kill()
	ctx, cancel := context.WithTimeout(t.Context(), eventually)
	defer cancel()
	st, err := g.Release(ctx)
	require.Error(t, err, "release cannot succeed without Redis")
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "release should fail by itself, not by the caller's ctx")
	assert.Contains(t, []distlock.State{distlock.Released, distlock.Lost}, st)
	assert.Equal(t, distlock.Released, g.State())
}

func TestRedisErrorIsReturned(t *testing.T) {
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "res")
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
	m2 := newMutex(t, srv.Client(), "other")
	srv.MustDo("SET", "distlock:{other}:fence", "not-a-number")
	_, err = m2.TryLock(t.Context())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "fencing key")
	_, ok := get(t, srv, m2.Key())
	assert.False(t, ok)
}

func TestInvalidInput(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	cases := []struct {
		name  string
		c     rueidis.Client
		key   string
		opts  []distlock.Option
		field string
	}{
		{"nil client", nil, "k", nil, "client"},
		{"empty key", c, "", nil, "key"},
		{"brace in key", c, "a{b", nil, "key"},
		{"closing brace", c, "a}b", nil, "key"},
		{"newline in key", c, "a\nb", nil, "key"},
		{"invalid utf8", c, "a\xffb", nil, "key"},
		{"long key", c, strings.Repeat("k", 513), nil, "key"},
		{"empty namespace", c, "k", []distlock.Option{distlock.WithNamespace("")}, "namespace"},
		{"brace in namespace", c, "k", []distlock.Option{distlock.WithNamespace("{ns}")}, "namespace"},
		{"empty owner", c, "k", []distlock.Option{distlock.WithOwner("")}, "owner"},
		{"control char owner", c, "k", []distlock.Option{distlock.WithOwner("a\x00")}, "owner"},
		{"zero ttl", c, "k", []distlock.Option{distlock.WithTTL(0)}, "ttl"},
		{"negative ttl", c, "k", []distlock.Option{distlock.WithTTL(-time.Second)}, "ttl"},
		{"ttl too small", c, "k", []distlock.Option{distlock.WithTTL(distlock.MinTTL - time.Millisecond)}, "ttl"},
		{"ttl too large", c, "k", []distlock.Option{distlock.WithTTL(distlock.MaxTTL + time.Second)}, "ttl"},
		{"negative max wait", c, "k", []distlock.Option{distlock.WithMaxWait(-1)}, "max wait"},
		{"negative retry", c, "k", []distlock.Option{distlock.WithRetryInterval(-1)}, "retry interval"},
		{"nil logger", c, "k", []distlock.Option{distlock.WithLogger(nil)}, "logger"},
		{"nil option", c, "k", []distlock.Option{nil}, "option"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := distlock.NewMutex(tc.c, tc.key, tc.opts...)
			require.ErrorIs(t, err, distlock.ErrInvalidOption)
			assert.Nil(t, m)
			var oe *distlock.OptionError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, tc.field, oe.Field)
			assert.Contains(t, err.Error(), tc.field)
		})
	}

	m := newMutex(t, c, "k")
	t.Run("negative TryLockFor timeout", func(t *testing.T) {
		_, err := m.TryLockFor(t.Context(), -time.Second, 0)
		require.ErrorIs(t, err, distlock.ErrInvalidOption)
	})
	t.Run("negative TryLockFor interval", func(t *testing.T) {
		_, err := m.TryLockFor(t.Context(), time.Second, -1)
		require.ErrorIs(t, err, distlock.ErrInvalidOption)
	})
	t.Run("nil context", func(t *testing.T) {
		//lint:ignore SA1012 testing the nil check
		_, err := m.Lock(nil)
		require.ErrorIs(t, err, distlock.ErrInvalidOption)
	})

	t.Run("zero values", func(t *testing.T) {
		// Not made by their constructors: an error (or, for Observe, a
		// panic) in the caller's goroutine, never a crash elsewhere.
		var zm distlock.Mutex
		var zs distlock.Semaphore
		var ze distlock.Election
		calls := map[string]func() error{
			"Mutex.Lock":              func() error { _, err := zm.Lock(t.Context()); return err },
			"Mutex.TryLock":           func() error { _, err := zm.TryLock(t.Context()); return err },
			"Mutex.TryLockFor":        func() error { _, err := zm.TryLockFor(t.Context(), time.Second, 0); return err },
			"Semaphore.Acquire":       func() error { _, err := zs.Acquire(t.Context()); return err },
			"Semaphore.TryAcquire":    func() error { _, err := zs.TryAcquire(t.Context()); return err },
			"Semaphore.TryAcquireFor": func() error { _, err := zs.TryAcquireFor(t.Context(), time.Second, 0); return err },
			"Election.Campaign":       func() error { _, err := ze.Campaign(t.Context(), "me"); return err },
			"Election.Leader":         func() error { _, err := ze.Leader(t.Context()); return err },
		}
		for name, call := range calls {
			err := call()
			require.ErrorIs(t, err, distlock.ErrInvalidOption, name)
			assert.Contains(t, err.Error(), "zero", name)
		}
		assert.Panics(t, func() { ze.Observe(t.Context()) }, "Election.Observe")
	})

	// None of that reached Redis: no script ran and no key exists.
	info, err := srv.MustDo("INFO", "commandstats").ToString()
	require.NoError(t, err)
	assert.NotContains(t, info, "cmdstat_eval", "a script ran for bad input")
	n, err := srv.MustDo("DBSIZE").ToInt64()
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestOwnerOfAnotherLibraryValue(t *testing.T) {
	srv := redistest.Start(t)
	m := newMutex(t, srv.Client(), "res")
	// A value distlock did not write, with no expiry: held, never free.
	srv.MustDo("SET", m.Key(), "manual-maintenance")
	_, err := m.TryLock(t.Context())
	var nae *distlock.NotAcquiredError
	require.ErrorAs(t, err, &nae)
	assert.Equal(t, "manual-maintenance", nae.Holder)
	assert.Negative(t, nae.Remaining)
}

// Once the guard's context is cancelled by a loss, State no longer says
// Acquired: the actor publishes the state before it cancels the context.
func TestStateIsLostOnceTheContextSaysSo(t *testing.T) {
	srv := redistest.Start(t)
	for range 20 {
		m := newMutex(t, srv.Client(), "res", distlock.WithTTL(300*time.Millisecond))
		g, err := m.Lock(t.Context())
		require.NoError(t, err)
		srv.MustDo("DEL", m.Key())
		select {
		case <-g.Context().Done():
		case <-time.After(eventually):
			t.Fatal("the loss went unnoticed")
		}
		require.Equal(t, distlock.Lost, g.State(), "State right after the context was cancelled by the loss")
		release(t, g)
	}
}

// The other way round: whoever receives the Lost event finds the guard's
// context cancelled, with the loss as its cause.
func TestContextIsCancelledOnceTheLostEventComes(t *testing.T) {
	srv := redistest.Start(t)
	for range 20 {
		m := newMutex(t, srv.Client(), "res", distlock.WithTTL(300*time.Millisecond))
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
