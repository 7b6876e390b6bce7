package distlocktest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redisbin"
)

// Timing of the tests. A busy 2-core machine adds tens of milliseconds to any
// wake-up, so the waits for an outcome are generous.
const (
	// testTTL is short so that a guard renews, and finds a loss, within
	// 100 ms.
	testTTL = 300 * time.Millisecond
	// eventually bounds a wait for something that should happen soon.
	eventually = 5 * time.Second
	pollEvery  = 5 * time.Millisecond
)

// modes runs f once against the in-process server and once against a real
// redis-server (skipped when redis-server is not on PATH).
func modes(t *testing.T, f func(t *testing.T, opts ...Option)) {
	t.Run("in-process", func(t *testing.T) { f(t) })
	t.Run("real", func(t *testing.T) { f(t, WithRealRedis()) })
}

func do(t *testing.T, s *Server, args ...string) rueidis.RedisResult {
	t.Helper()
	c := s.Client()
	return c.Do(t.Context(), c.B().Arbitrary(args...).Build())
}

// waitRefused waits, on events, until g is Lost because a renewal was
// refused, and returns that LostError. Earlier events are passed over: on a
// loaded machine a renewal can come too late for the short test TTL, and the
// guard then reports a Lost for its deadline (and may regain the lease)
// before the helper under test has done anything.
func waitRefused(t *testing.T, events <-chan distlock.Event) *distlock.LostError {
	t.Helper()
	timeout := time.After(eventually)
	var last distlock.Event
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("subscription closed; last event %v", last)
			}
			last = ev
			var lost *distlock.LostError
			if errors.As(ev.Err, &lost) && lost.Reason == distlock.LostRefused {
				return lost
			}
		case <-timeout:
			t.Fatalf("no refused renewal within %v; last event %v", eventually, last)
		}
	}
}

func lock(t *testing.T, s *Server, name string) (*distlock.Mutex, *distlock.Guard) {
	t.Helper()
	m, err := distlock.NewMutex(s.Client(), name, distlock.WithTTL(testTTL), distlock.WithOwner("holder"))
	require.NoError(t, err)
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), eventually)
		defer cancel()
		_, _ = g.Release(ctx)
	})
	return m, g
}

func TestNewServesRedis(t *testing.T) {
	modes(t, func(t *testing.T, opts ...Option) {
		s := New(t, opts...)
		assert.Equal(t, len(opts) > 0, s.Real(), "Real()")
		got, err := do(t, s, "PING").ToString()
		require.NoError(t, err)
		assert.Equal(t, "PONG", got, "PING reply")

		// Addr is what a client of the user's own making connects to.
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress: []string{s.Addr()}, DisableCache: true, ForceSingleClient: true, AlwaysRESP2: true,
		})
		require.NoError(t, err)
		defer c.Close()
		require.NoError(t, c.Do(t.Context(), c.B().Set().Key("k").Value("v").Build()).Error())
		got, err = do(t, s, "GET", "k").ToString()
		require.NoError(t, err)
		assert.Equal(t, "v", got, "value written through Addr, read through Client")
	})
}

// The real server is a redis-server process of its own, not the in-process
// one under another name.
func TestWithRealRedisRunsRedisServer(t *testing.T) {
	s := New(t, WithRealRedis())
	info, err := do(t, s, "INFO", "server").ToString()
	require.NoError(t, err)
	want := "process_id:" + strconv.Itoa(s.proc.cmd.Process.Pid)
	assert.Contains(t, info, want, "INFO server of the real server")
}

// Keys expire by themselves on both servers: the in-process one is driven by
// the real clock.
func TestKeysExpire(t *testing.T) {
	modes(t, func(t *testing.T, opts ...Option) {
		s := New(t, opts...)
		require.NoError(t, do(t, s, "SET", "k", "v", "PX", "100").Error())
		require.Eventually(t, func() bool {
			n, err := do(t, s, "EXISTS", "k").AsInt64()
			return err == nil && n == 0
		}, eventually, pollEvery, "a key set with PX 100 still exists after %v", eventually)
	})
}

// A guard whose holder stops renewing (here: it is never released and its
// lease is left to run out) frees the lock for another Mutex after the TTL.
func TestLeaseExpiresForNextHolder(t *testing.T) {
	modes(t, func(t *testing.T, opts ...Option) {
		s := New(t, opts...)
		require.NoError(t, do(t, s, "SET", "distlock:{job}", "crashed#holder", "PX", strconv.Itoa(int(testTTL/time.Millisecond))).Error())
		m, err := distlock.NewMutex(s.Client(), "job", distlock.WithTTL(testTTL))
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), eventually)
		defer cancel()
		g, err := m.Lock(ctx)
		require.NoError(t, err, "Lock after the crashed holder's lease ran out")
		_, err = g.Release(t.Context())
		require.NoError(t, err)
	})
}

func TestForceLoss(t *testing.T) {
	modes(t, func(t *testing.T, opts ...Option) {
		s := New(t, opts...)
		m, g := lock(t, s, "job")
		events := g.Subscribe(t.Context())
		require.NoError(t, s.ForceLoss(m))

		lost := waitRefused(t, events)
		assert.Empty(t, lost.Holder, "holder of a deleted lease")
		assert.Equal(t, distlock.Lost, g.State(), "state after the refusal")
		assert.ErrorIs(t, context.Cause(g.Context()), distlock.ErrLost, "cause of the guard's context")

		// Nothing left to delete: the helper says so rather than pretend.
		err := s.ForceLoss(g)
		assert.ErrorIs(t, err, ErrNoLease, "second ForceLoss")
	})
}

func TestOverwriteLease(t *testing.T) {
	modes(t, func(t *testing.T, opts ...Option) {
		s := New(t, opts...)
		m, g := lock(t, s, "job")
		events := g.Subscribe(t.Context())
		require.NoError(t, s.OverwriteLease(m.Key(), "intruder"))

		lost := waitRefused(t, events)
		assert.Equal(t, "intruder", lost.Holder, "holder")
		assert.Equal(t, distlock.Lost, g.State(), "state after the refusal")
	})
}

// A semaphore keeps every holder in its one key: ForceLoss of one guard
// takes every permit, and every holder finds out at its next renewal; the
// permits are free again at once.
func TestForceLossSemaphore(t *testing.T) {
	modes(t, func(t *testing.T, opts ...Option) {
		s := New(t, opts...)
		sem, err := distlock.NewSemaphore(s.Client(), "pool", 3, distlock.WithTTL(testTTL))
		require.NoError(t, err)
		var guards []*distlock.Guard
		var events []<-chan distlock.Event
		for range 2 {
			g, err := sem.Acquire(t.Context())
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = g.Release(context.Background()) })
			guards = append(guards, g)
			events = append(events, g.Subscribe(t.Context()))
		}
		require.NoError(t, s.ForceLoss(guards[0]))

		for i, g := range guards {
			lost := waitRefused(t, events[i])
			assert.Empty(t, lost.Holder, "holder named by guard %d's loss", i)
			assert.Equal(t, distlock.Lost, g.State(), "state of guard %d", i)
		}
		// All three permits are free: nobody holds one.
		for range 3 {
			g, err := sem.TryAcquire(t.Context())
			require.NoError(t, err, "TryAcquire after ForceLoss")
			assert.Greater(t, g.Token(), guards[1].Token(), "token of a new permit")
			t.Cleanup(func() { _, _ = g.Release(context.Background()) })
		}
		assert.NoError(t, s.ForceLoss(sem), "ForceLoss of the Semaphore itself")
	})
}

// OverwriteLease refuses a semaphore's key, which a string would make
// unusable, and leaves the holders alone.
func TestOverwriteLeaseRefusesSemaphore(t *testing.T) {
	modes(t, func(t *testing.T, opts ...Option) {
		s := New(t, opts...)
		sem, err := distlock.NewSemaphore(s.Client(), "pool", 2, distlock.WithTTL(testTTL))
		require.NoError(t, err)
		g, err := sem.Acquire(t.Context())
		require.NoError(t, err)
		defer g.Release(context.Background())
		events := g.Subscribe(t.Context())

		err = s.OverwriteLease(sem.Key(), "intruder")
		require.Error(t, err)
		assert.NotErrorIs(t, err, ErrNoLease)
		assert.ErrorContains(t, err, "semaphore")
		typ, err := do(t, s, "TYPE", sem.Key()).ToString()
		require.NoError(t, err)
		assert.Equal(t, "zset", typ, "type of the key after the refused overwrite")

		// The holder's entry is still there, and its next renewal moves it on
		// without a refusal.
		score := func() float64 {
			f, err := do(t, s, "ZSCORE", sem.Key(), holderValue(t, s, sem.Key())).AsFloat64()
			require.NoError(t, err)
			return f
		}
		before := score()
		require.Eventually(t, func() bool { return score() > before }, eventually, pollEvery, "no renewal of the untouched permit")
		for len(events) > 0 {
			ev := <-events
			var lost *distlock.LostError
			if errors.As(ev.Err, &lost) {
				assert.NotEqual(t, distlock.LostRefused, lost.Reason, "a renewal was refused after the refused overwrite")
			}
		}
	})
}

// holderValue returns the only member of the semaphore set at key.
func holderValue(t *testing.T, s *Server, key string) string {
	t.Helper()
	members, err := do(t, s, "ZRANGE", key, "0", "-1").AsStrSlice()
	require.NoError(t, err)
	require.Len(t, members, 1, "holders of %s", key)
	return members[0]
}

// An election's key is the leader's lease: ForceLoss ends the term, and
// the next candidate leads.
func TestForceLossElection(t *testing.T) {
	modes(t, func(t *testing.T, opts ...Option) {
		s := New(t, opts...)
		e, err := distlock.NewElection(s.Client(), "scheduler", distlock.WithTTL(testTTL))
		require.NoError(t, err)
		term, err := e.Campaign(t.Context(), "node-a")
		require.NoError(t, err)
		defer term.Release(context.Background())
		events := term.Subscribe(t.Context())
		require.NoError(t, s.ForceLoss(e))
		waitRefused(t, events)

		next, err := e.Campaign(t.Context(), "node-b")
		require.NoError(t, err)
		defer next.Release(context.Background())
		l, err := e.Leader(t.Context())
		require.NoError(t, err)
		assert.Equal(t, "node-b", l.Value, "leader after ForceLoss")
		assert.Greater(t, l.Token, term.Token(), "token of the next term")
	})
}

// OverwriteLease keeps the key's expiry, as a client that took the lock
// would have set one.
func TestOverwriteLeaseKeepsExpiry(t *testing.T) {
	const ttl = time.Minute
	modes(t, func(t *testing.T, opts ...Option) {
		s := New(t, opts...)
		require.NoError(t, do(t, s, "SET", "distlock:{job}", "holder#x", "PX", strconv.Itoa(int(ttl/time.Millisecond))).Error())
		require.NoError(t, s.OverwriteLease("distlock:{job}", "intruder"))

		got, err := do(t, s, "GET", "distlock:{job}").ToString()
		require.NoError(t, err)
		assert.Equal(t, "intruder", got, "value after the overwrite")
		pttl, err := do(t, s, "PTTL", "distlock:{job}").AsInt64()
		require.NoError(t, err)
		assert.Positive(t, pttl, "PTTL after the overwrite")
		assert.LessOrEqual(t, pttl, ttl.Milliseconds(), "PTTL after the overwrite")
	})
}

func TestHelpersWithoutLease(t *testing.T) {
	modes(t, func(t *testing.T, opts ...Option) {
		s := New(t, opts...)
		err := s.DeleteLease("distlock:{nobody}")
		assert.ErrorIs(t, err, ErrNoLease, "DeleteLease")
		assert.ErrorContains(t, err, "distlock:{nobody}", "DeleteLease names the key")

		err = s.OverwriteLease("distlock:{nobody}", "x")
		assert.ErrorIs(t, err, ErrNoLease, "OverwriteLease")
		n, err := do(t, s, "EXISTS", "distlock:{nobody}").AsInt64()
		require.NoError(t, err)
		assert.Zero(t, n, "keys created by OverwriteLease on a missing lease")
	})
}

// New closes the client and stops the server when the test ends; Start
// leaves that to Close, which may be called twice.
func TestCleanup(t *testing.T) {
	modes(t, func(t *testing.T, opts ...Option) {
		var s *Server
		t.Run("inner", func(t *testing.T) { s = New(t, opts...) })
		assertStopped(t, s)

		s, err := Start(opts...)
		require.NoError(t, err)
		require.NoError(t, s.Client().Do(t.Context(), s.Client().B().Ping().Build()).Error())
		s.Close()
		s.Close()
		assertStopped(t, s)
		if s.proc != nil {
			_, err := os.Stat(s.proc.dir)
			assert.ErrorIs(t, err, os.ErrNotExist, "the directory Start made for redis-server, after Close")
		}
	})
}

func assertStopped(t *testing.T, s *Server) {
	t.Helper()
	err := s.Client().Do(context.Background(), s.Client().B().Ping().Build()).Error()
	assert.ErrorIs(t, err, rueidis.ErrClosing, "PING through the client after the end")
	if s.proc != nil {
		select {
		case <-s.proc.done:
		default:
			t.Errorf("redis-server pid %d still runs after the end", s.proc.cmd.Process.Pid)
		}
	}
	if conn, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		conn.Close()
		t.Errorf("%s still accepts connections after the end", s.Addr())
	}
}

// Without redis-server on PATH, WithRealRedis skips the test that asked for
// it, saying why, and Start returns ErrNoRedisServer.
func TestWithRealRedisWithoutRedisServer(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(redisbin.Env, "")
	_, err := exec.LookPath("redis-server")
	require.Error(t, err, "redis-server is still found with an empty PATH")

	_, err = Start(WithRealRedis())
	assert.ErrorIs(t, err, ErrNoRedisServer, "Start")

	var skipped, reached bool
	t.Run("asks-for-real-redis", func(t *testing.T) {
		t.Cleanup(func() { skipped = t.Skipped() })
		New(t, WithRealRedis())
		reached = true
	})
	assert.True(t, skipped, "the test asking for real Redis was not skipped")
	assert.False(t, reached, "New returned without redis-server")

	// The in-process server needs nothing on PATH.
	s := New(t)
	assert.False(t, s.Real(), "Real() of the default server")
}

// DISTLOCK_REDIS_SERVER naming no server program is an error, not a
// skip: a run that asked for one server must not pass without it.
func TestWithRealRedisServerNamedWrongly(t *testing.T) {
	t.Setenv(redisbin.Env, t.TempDir()) // a directory without a server
	_, err := Start(WithRealRedis())
	require.Error(t, err, "Start")
	assert.NotErrorIs(t, err, ErrNoRedisServer, "Start")
	assert.Contains(t, err.Error(), redisbin.Env, "the error names the variable")
}

// The skip message says what is missing and what to do.
func TestSkipMessage(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(redisbin.Env, "")
	rec := &recordingTB{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil && r != errSkipped {
				panic(r)
			}
		}()
		New(rec, WithRealRedis())
	}()
	for _, want := range []string{"redis-server is not on PATH", "install", "WithRealRedis"} {
		assert.Contains(t, rec.skip, want, "skip message")
	}
}

// errSkipped stops New when recordingTB.Skipf is called, as SkipNow would.
var errSkipped = errors.New("skipped")

// recordingTB records a skip instead of skipping.
type recordingTB struct {
	testing.TB
	skip string
}

func (r *recordingTB) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	panic(errSkipped)
}

// A Lock waiting on another client (another replica, say) gets the lock soon
// after the holder releases it, not when the holder's long lease would have
// run out: the release announcement reaches it on both servers.
func TestWaiterOnAnotherClientWakesAtRelease(t *testing.T) {
	const holderTTL = 30 * time.Second // far beyond eventually
	modes(t, func(t *testing.T, opts ...Option) {
		s := New(t, opts...)
		other, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress: []string{s.Addr()}, DisableCache: true, ForceSingleClient: true, AlwaysRESP2: true,
		})
		require.NoError(t, err)
		defer other.Close()
		watched := &replyClient{Client: other, replied: make(chan struct{}, 1)}

		holder, err := distlock.NewMutex(s.Client(), "job", distlock.WithTTL(holderTTL))
		require.NoError(t, err)
		held, err := holder.Lock(t.Context())
		require.NoError(t, err)

		waiter, err := distlock.NewMutex(watched, "job")
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), eventually)
		defer cancel()
		type result struct {
			g   *distlock.Guard
			err error
		}
		got := make(chan result, 1)
		go func() {
			g, err := waiter.Lock(ctx)
			got <- result{g, err}
		}()
		select {
		case <-watched.replied: // the first attempt found the lock held
		case <-time.After(eventually):
			t.Fatalf("the waiter sent nothing within %v", eventually)
		}

		released := time.Now()
		_, err = held.Release(t.Context())
		require.NoError(t, err)
		r := <-got
		require.NoError(t, r.err, "the waiter's Lock (within %v, the holder's TTL being %v)", eventually, holderTTL)
		assert.Positive(t, r.g.Attempt(), "attempt that acquired: the waiter did not wait")
		t.Logf("the waiter acquired on attempt %d, %v after the release began", r.g.Attempt(), time.Since(released))
		_, err = r.g.Release(t.Context())
		require.NoError(t, err)
	})
}

// replyClient signals on replied when a reply to Do has come back.
type replyClient struct {
	rueidis.Client
	replied chan struct{} // capacity 1
}

func (c *replyClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	r := c.Client.Do(ctx, cmd)
	select {
	case c.replied <- struct{}{}:
	default:
	}
	return r
}
