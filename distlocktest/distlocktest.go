// Package distlocktest gives the tests of code built on distlock a ready
// Redis, and helpers that take a lease away from its holder so that the code's
// handling of a lost lock can be tested.
//
// # A Redis for each test
//
// [New] starts a Redis for one test and connects a rueidis client to it; both
// are closed when the test ends. By default the server runs inside the test
// binary (it is miniredis), so the tests need nothing installed. A test that
// wants the real thing passes [WithRealRedis]: it then gets a private
// redis-server process on a free loopback port, or is skipped, with a message
// saying why, when redis-server is not on PATH.
//
//	func TestReportRunsOnce(t *testing.T) {
//		srv := distlocktest.New(t)
//		// Hand srv.Client() to the code under test, as production code gets
//		// its client from rueidis.NewClient.
//		...
//	}
//
// [Start] does the same outside a test (in an Example, a TestMain or a demo
// program) and leaves the closing to the caller.
//
// The in-process server runs Lua scripts, pub/sub and key expiry by the real
// clock, so locks, waiting, renewals, losses and fencing tokens behave as
// they do against Redis. It is not Redis, though: it implements the commands
// anew and has no replication, Cluster or persistence. Tests that measure
// timing, or need Redis's exact behaviour, should ask for WithRealRedis.
//
// # Testing the handling of a lost lock
//
// A guard becomes Lost when its lease is deleted or overwritten behind its
// back, which is what an operator, an expiry during a long pause or a Redis
// restart does. [Server.ForceLoss] deletes the lease of a Mutex, a
// Semaphore, an Election or a Guard; [Server.DeleteLease] and
// [Server.OverwriteLease] do the same by key. The holder finds out at its
// next renewal, a third of the TTL later, so give the Mutex a short TTL in
// such a test:
//
//	func TestReportStopsWhenLockIsLost(t *testing.T) {
//		srv := distlocktest.New(t)
//		m, err := distlock.NewMutex(srv.Client(), "nightly-report",
//			distlock.WithTTL(300*time.Millisecond))
//		if err != nil {
//			t.Fatal(err)
//		}
//		g, err := m.Lock(t.Context())
//		if err != nil {
//			t.Fatal(err)
//		}
//		defer g.Release(t.Context())
//
//		if err := srv.ForceLoss(m); err != nil {
//			t.Fatal(err)
//		}
//		select {
//		case <-g.Context().Done(): // what the code under test selects on
//		case <-time.After(5 * time.Second):
//			t.Fatal("the guard did not report the loss")
//		}
//		if err := context.Cause(g.Context()); !errors.Is(err, distlock.ErrLost) {
//			t.Fatalf("cause = %v, want ErrLost", err)
//		}
//	}
//
// The code under test usually builds its own Mutex; the test can build
// another with the same name (and namespace, if any) and pass it to
// ForceLoss: the lease key depends only on those.
//
// A semaphore keeps all its holders in one key, so ForceLoss of a Semaphore,
// or of any one of its guards, takes every permit at once: every holder
// becomes Lost at its next renewal, and the permits are free at once. An
// election's key is its leader's lease: ForceLoss ends the current term.
//
// # Goroutines and processes
//
// A Server owns one goroutine (the in-process server's clock, or the one that
// waits for the redis-server process) besides those of its rueidis client.
// Close stops all of them, kills the process and waits for it, so a Server
// passes goleak once the test (or Close) has ended it.
package distlocktest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/internal/embedredis"
)

// adminTimeout bounds each command a helper such as [Server.ForceLoss] sends.
const adminTimeout = 5 * time.Second

var (
	// ErrNoRedisServer means [WithRealRedis] was asked for and redis-server
	// is not on PATH. [Start] returns it wrapped; [New] skips the test
	// instead.
	ErrNoRedisServer = errors.New("distlocktest: redis-server is not on PATH")
	// ErrNoLease means a helper found no lease to delete or overwrite: the
	// lock is not held, or the key is not the one the holder uses.
	ErrNoLease = errors.New("distlocktest: no lease")
)

// An Option configures [New] and [Start].
type Option func(*config)

type config struct {
	real bool
}

// WithRealRedis runs a private redis-server process instead of the in-process
// server. It listens on a free port of 127.0.0.1, keeps nothing on disk, and
// is killed when the Server is closed (on Linux, also when the test binary
// dies). If redis-server is not on PATH, [New] skips the test and [Start]
// returns an error matching [ErrNoRedisServer].
//
// The program is redis-server on PATH, else valkey-server. The
// environment variable DISTLOCK_REDIS_SERVER picks another: the path of a
// redis-server or valkey-server, or of a directory that holds one (a build
// tree's src, say), so that the same tests can run against several
// versions. When it names no such program, [New] fails the test and
// [Start] returns an error: a run that asked for one server never quietly
// gets another.
func WithRealRedis() Option {
	return func(c *config) { c.real = true }
}

// A Keyer names a lease key: a *distlock.Mutex, *distlock.Semaphore,
// *distlock.Election or *distlock.Guard.
type Keyer interface {
	Key() string
}

// A Server is a running Redis with a connected client. Its methods are safe
// for concurrent use.
type Server struct {
	addr   string
	client rueidis.Client
	proc   *redisProcess      // with WithRealRedis
	mem    *embedredis.Server // otherwise

	closeOnce sync.Once
}

// New starts a Redis for the test tb and connects a client to it; both are
// closed when tb and its subtests end. It blocks until the server answers
// (a real redis-server gets up to 10 s to start). It fails the test if the
// server cannot be started, and skips it if [WithRealRedis] was asked for and
// redis-server is not on PATH.
func New(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	c := newConfig(opts)
	var dir string
	if c.real {
		dir = tb.TempDir() // removed by the testing package after Close
	}
	s, err := start(c, dir)
	if errors.Is(err, ErrNoRedisServer) {
		tb.Skipf("%v; install it (e.g. `apt-get install redis-server`, `brew install redis`) "+
			"or leave out WithRealRedis to use the in-process server", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Start starts a Redis and connects a client to it, for use outside a test
// function; the caller must call [Server.Close]. It blocks until the server
// answers (a real redis-server gets up to 10 s to start). With
// [WithRealRedis], it returns an error matching [ErrNoRedisServer] if
// redis-server is not on PATH.
func Start(opts ...Option) (*Server, error) {
	return start(newConfig(opts), "")
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// start starts the server c asks for. A real server keeps its log in dir, or
// in a temporary directory of its own if dir is empty.
func start(c config, dir string) (*Server, error) {
	if !c.real {
		mem, err := embedredis.Start()
		if err != nil {
			return nil, fmt.Errorf("distlocktest: %w", err)
		}
		return &Server{addr: mem.Addr(), client: mem.Client(), mem: mem}, nil
	}
	proc, err := startRedisServer(dir)
	if err != nil {
		return nil, err
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  []string{proc.addr},
		DisableCache: true, // distlock never reads through the client-side cache
	})
	if err != nil {
		proc.kill()
		return nil, fmt.Errorf("distlocktest: connecting to redis-server at %s: %w", proc.addr, err)
	}
	return &Server{addr: proc.addr, client: client, proc: proc}, nil
}

// Client returns the client connected to the server. It is shared by every
// caller and closed by [Server.Close]; do not close it yourself.
func (s *Server) Client() rueidis.Client { return s.client }

// Addr returns the server's "host:port", for code under test that builds its
// own client. The in-process server does not speak client-side caching, the
// CLUSTER commands or RESP3 pub/sub; give rueidis DisableCache,
// ForceSingleClient and AlwaysRESP2 for it.
func (s *Server) Addr() string { return s.addr }

// Real reports whether the server is a redis-server process
// ([WithRealRedis]) rather than the in-process server.
func (s *Server) Real() bool { return s.proc != nil }

// Close closes the client, stops the server and waits for both, and for the
// goroutines they ran, to end. Calling it again does nothing.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		if s.mem != nil {
			s.mem.Close() // closes the client too
			return
		}
		s.client.Close()
		s.proc.kill()
	})
}

// ForceLoss deletes the lease of lock, a *distlock.Mutex, *distlock.Semaphore,
// *distlock.Election, *distlock.RWMutex or *distlock.Guard, as an operator or
// an expiry would.
// The holder's guard becomes Lost at its next renewal (within a third of the
// TTL), with reason LostRefused; its context is cancelled then.
//
// For a semaphore, the lease is the set of all its holders: ForceLoss of the
// Semaphore or of any of its guards drops every permit, and every holder
// becomes Lost. (A single holder's permit cannot be taken alone: nothing
// outside its guard knows which entry of the set is its.) Likewise for a
// read-write lock, whose holders share one hash: every reader, or the
// writer, becomes Lost. For an election,
// ForceLoss ends the leader's term. ForceLoss waits for Redis's
// answer (at most 5 s) and returns an error matching [ErrNoLease] if there was
// no lease to delete, or the Redis error.
func (s *Server) ForceLoss(lock Keyer) error {
	return s.DeleteLease(lock.Key())
}

// DeleteLease deletes the lease at key (see [Server.ForceLoss]). It waits
// for Redis's answer (at most 5 s) and returns an error matching [ErrNoLease]
// if the key does not exist, or the Redis error.
func (s *Server) DeleteLease(key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	n, err := s.client.Do(ctx, s.client.B().Del().Key(key).Build()).AsInt64()
	if err != nil {
		return fmt.Errorf("distlocktest: deleting %s: %w", key, err)
	}
	if n == 0 {
		return fmt.Errorf("%w at %s", ErrNoLease, key)
	}
	return nil
}

// OverwriteLease replaces the value of the lease at key with value and keeps
// its expiry, as if another client had taken the lock. The holder's guard
// becomes Lost at its next renewal, and its LostError's Holder is value (only
// the owner part if value has the "owner#uuid" form distlock writes). It
// waits for Redis's answer (at most 5 s) and returns an error matching
// [ErrNoLease] if the key does not exist (it never creates one), or the Redis
// error.
//
// It serves the lease of a Mutex or an Election (a string). A semaphore's
// key holds the set of its holders, and a read-write lock's the hash of
// its holders, which a string would replace with something their scripts
// refuse to touch, so OverwriteLease leaves such a key alone and returns an
// error; use [Server.DeleteLease] or [Server.ForceLoss] for them.
func (s *Server) OverwriteLease(key, value string) error {
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	err := s.client.Do(ctx, s.client.B().Eval().Script(overwriteLua).Numkeys(1).Key(key).Arg(value).Build()).Error()
	if rueidis.IsRedisNil(err) {
		return fmt.Errorf("%w at %s", ErrNoLease, key)
	}
	if err != nil {
		return fmt.Errorf("distlocktest: overwriting %s: %w", key, err)
	}
	return nil
}

// overwriteLua is OverwriteLease's command: KEYS[1] the lease, ARGV[1] the
// new value. It replies OK, nil when the key does not exist, or an error
// when the key holds a semaphore's holders (a sorted set) or a read-write
// lock's (a hash).
const overwriteLua = `
local t = redis.call('TYPE', KEYS[1]).ok
if t == 'zset' then
  return redis.error_reply('ERR ' .. KEYS[1] .. ' holds the permits of a semaphore; delete it to take them all')
end
if t == 'hash' then
  return redis.error_reply('ERR ' .. KEYS[1] .. ' holds the holders of a read-write lock; delete it to take them all')
end
return redis.call('SET', KEYS[1], ARGV[1], 'XX', 'KEEPTTL')
`
