package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	goredsync "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/goredis"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Settings of the libraries where the user has to choose one.
const (
	// bareTTL is the PX of the bare commands and the TTL of bsm/redislock
	// (distlock.DefaultTTL, so that no lock expires in a round).
	bareTTL = distlock.DefaultTTL
	// pollEvery is the retry interval of the polling locks that a user
	// tunes for short jobs: the shortest a timer lasts here (1 ms).
	pollEvery = time.Millisecond
)

// Clients a library runs on; each has a bare row as its own baseline.
const (
	clientRueidis = "rueidis"
	clientGoRedis = "go-redis"
)

// Names of the rows that other rows are compared with: the two bare rows
// (the baselines), distlock on each client, and redsync.
const (
	libBare            = "bare"
	libBareGoRedis     = "bare-goredis"
	libDistlock        = "distlock"
	libDistlockGoRedis = "distlock-goredis"
	libRedsync         = "redsync"
)

// lockFunc takes the lock on key, waiting for it as long as the library
// waits, and returns the function that releases it. A new lock object is
// made for every call, as a worker makes one per job.
type lockFunc func(ctx context.Context, key string) (release func() error, err error)

// setLockFunc takes every name of a set, waiting for them as long as the
// library waits, and returns the function that releases them all (see
// multi.go). Like a lockFunc, it makes new lock objects for every call.
type setLockFunc func(ctx context.Context, names []string) (release func() error, err error)

// library is one way to take a lock, on a client of its own: lock for the
// peer scenarios, lockSet for the set scenarios (multi.go).
type library struct {
	name    string
	client  string // clientRueidis or clientGoRedis
	counts  counters
	lock    lockFunc
	lockSet setLockFunc
	close   func()
}

// counters count the commands a library's client sends, two ways.
type counters struct {
	// wire counts the commands written to the client's connections (a
	// counting net.Conn under every client): everything, the handshake of
	// a new connection and the commands of a subscription included.
	wire *redistest.CommandCounter
	// hook counts the commands go-redis processes (a hook on the client;
	// zero for a rueidis client): each command, and each command of a
	// pipeline, once, however often go-redis retries it. The commands of a
	// redis.PubSub (SSUBSCRIBE, SUNSUBSCRIBE) and of a new connection's
	// handshake do not pass through hooks, so the wire has them and this
	// has not.
	hook *hookCounter
}

func newCounters() counters {
	return counters{wire: &redistest.CommandCounter{}, hook: &hookCounter{}}
}

// libSpec describes a library and how to open it.
type libSpec struct {
	name   string
	client string
	// how says how the library is called, for the output.
	how string
	// contendedOnly libraries differ from another row only when they wait.
	contendedOnly bool
	open          func(addr string, counts counters) (lockFunc, func(), error)
}

// catalog lists the libraries in the order of the tables.
var catalog = []libSpec{
	{
		name: libBare, client: clientRueidis,
		how:  "`SET key v NX PX 30000` on rueidis, sent again at once until it succeeds (the spin), then `DEL`: no token, no renewal",
		open: openBare,
	},
	{
		name: libBareGoRedis, client: clientGoRedis,
		how:  "the same commands on go-redis v9 (the go-redis peers' own baseline)",
		open: openBareGoRedis,
	},
	{
		name: libDistlock, client: clientRueidis,
		how:  "`NewMutex(client, key)` per job, `Lock(ctx)`, `Release(context.WithoutCancel(ctx))`, defaults (TTL 30 s, renewed at TTL/3)",
		open: openDistlock,
	},
	{
		name: libDistlockGoRedis, client: clientGoRedis,
		how: "the same through the adapter module github.com/distkit-go/distlock/goredis: " +
			"`goredis.NewMutex(rdb, key)` per job on the go-redis client of the go-redis rows, `Lock(ctx)`, " +
			"`Release(context.WithoutCancel(ctx))`, defaults",
		open: openDistlockGoRedis,
	},
	{
		name: "redislock", client: clientGoRedis,
		how: "bsm/redislock v0.10.0 `Obtain(ctx, key, 30s, &Options{RetryStrategy: LinearBackoff(1ms)})`, `Release(ctx)`: " +
			"it has no default retry (one attempt), and 1 ms is the shortest a timer lasts here; no renewal",
		open: openRedislock,
	},
	{
		name: libRedsync, client: clientGoRedis,
		how: "go-redsync v4 on its go-redis v9 pool, `NewMutex(key)` per job with its defaults (expiry 8 s, 32 tries, " +
			"a random 50–250 ms between them), `LockContext(ctx)`, `UnlockContext(ctx)`; no renewal",
		open: openRedsync,
	},
	{
		name: "redsync-1ms", client: clientGoRedis, contendedOnly: true,
		how:  "the same with `WithRetryDelay(1ms)` and `WithTries(1<<30)`, tuned for short jobs (in the contended scenarios only)",
		open: openRedsyncTuned,
	},
	{
		name: "rueidislock", client: clientRueidis,
		how: "rueidis's rueidislock as its README sets it up for one Redis (`KeyMajority: 1`, `NoLoopTracking: true`), " +
			"keep-alive defaults (validity 5 s, extended every 2.5 s), `WithContext(ctx, key)`, its cancel to release; " +
			"waiters are woken by client-side-caching invalidations",
		open: openRueidislock,
	},
}

func libraryNames() []string {
	names := make([]string, len(catalog))
	for i, s := range catalog {
		names[i] = s.name
	}
	return names
}

func specOf(name string) (libSpec, error) {
	for _, s := range catalog {
		if s.name == name {
			return s, nil
		}
	}
	return libSpec{}, fmt.Errorf("unknown library %q", name)
}

// openLibraries opens each named library on a client of its own of the
// server at addr.
func openLibraries(addr string, names []string) (map[string]*library, error) {
	libs := map[string]*library{}
	for _, name := range names {
		spec, err := specOf(name)
		if err != nil {
			closeLibraries(libs)
			return nil, err
		}
		counts := newCounters()
		lock, closeFn, err := spec.open(addr, counts)
		if err != nil {
			closeLibraries(libs)
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		libs[name] = &library{name: name, client: spec.client, counts: counts, lock: lock, close: closeFn}
	}
	return libs, nil
}

func closeLibraries(libs map[string]*library) {
	for _, l := range libs {
		l.close()
	}
}

// giveUp reports whether err is a library giving up the wait by its own
// rule (redsync's tries, bsm/redislock's deadline of one TTL) rather than a
// failure.
func giveUp(err error) bool {
	return errors.Is(err, redsync.ErrFailed) || errors.Is(err, redislock.ErrNotObtained) ||
		errors.Is(err, context.DeadlineExceeded)
}

// rueidisClient returns a rueidis client of addr with the options of
// distlock's README (client-side caching on, which rueidis uses only for
// the commands that ask for it), counting its commands on the wire.
func rueidisClient(addr string, counts counters) (rueidis.Client, error) {
	return rueidis.NewClient(rueidisOption(addr, counts))
}

func rueidisOption(addr string, counts counters) rueidis.ClientOption {
	return rueidis.ClientOption{
		InitAddress: []string{addr},
		DialCtxFn: func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
			return dialCounting(ctx, d, addr, counts.wire)
		},
	}
}

// goRedisOptions are the options of every go-redis row (bare-goredis,
// distlock-goredis, redislock, redsync, redsync-1ms), one client each:
// go-redis v9's defaults, written out so that the rows visibly share them
// and a change to one is a change to all. Every field set here is set to
// the value go-redis would give it when left zero.
func goRedisOptions(addr string, counts counters) *redis.Options {
	return &redis.Options{
		Addr:     addr,
		Protocol: 3, // RESP3
		Dialer: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return dialCounting(ctx, &net.Dialer{}, addr, counts.wire)
		},
		DialTimeout:  5 * time.Second,
		ReadTimeout:  5 * time.Second,
		WriteTimeout: 5 * time.Second, // = ReadTimeout
		// No ContextTimeoutEnabled: a Lock's ctx bounds the wait between
		// commands, not the socket reads (go-redis's default).
		PoolSize:        10 * runtime.GOMAXPROCS(0), // 20 connections on 2 CPUs
		PoolTimeout:     6 * time.Second,            // ReadTimeout + 1 s
		MinIdleConns:    0,
		MaxRetries:      3,
		MinRetryBackoff: 10 * time.Millisecond,
		MaxRetryBackoff: time.Second,
	}
}

// goRedisClient returns a go-redis client of addr with goRedisOptions,
// counting its commands on the wire and with a hook.
func goRedisClient(addr string, counts counters) *redis.Client {
	c := redis.NewClient(goRedisOptions(addr, counts))
	c.AddHook(counts.hook)
	return c
}

// hookCounter is a go-redis hook that counts the commands its client
// processes: a command once, a pipeline (or transaction) as many as it
// has, retries not counted again.
type hookCounter struct {
	n atomic.Int64
}

// Load returns the number of commands processed so far.
func (h *hookCounter) Load() int64 { return h.n.Load() }

func (h *hookCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *hookCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *hookCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// dialCounting dials addr over TCP and counts the commands written to the
// connection in counter.
func dialCounting(ctx context.Context, d *net.Dialer, addr string, counter *redistest.CommandCounter) (net.Conn, error) {
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return counter.Wrap(conn), nil
}

func openBare(addr string, counts counters) (lockFunc, func(), error) {
	c, err := rueidisClient(addr, counts)
	if err != nil {
		return nil, nil, err
	}
	lock := func(ctx context.Context, key string) (func() error, error) {
		for {
			err := c.Do(ctx, c.B().Set().Key(key).Value("v").Nx().Px(bareTTL).Build()).Error()
			if err == nil {
				return func() error { return c.Do(ctx, c.B().Del().Key(key).Build()).Error() }, nil
			}
			if !rueidis.IsRedisNil(err) {
				return nil, err
			}
		}
	}
	return lock, c.Close, nil
}

func openBareGoRedis(addr string, counts counters) (lockFunc, func(), error) {
	c := goRedisClient(addr, counts)
	px := bareTTL.Milliseconds()
	lock := func(ctx context.Context, key string) (func() error, error) {
		for {
			err := c.Do(ctx, "set", key, "v", "nx", "px", px).Err()
			if err == nil {
				return func() error { return c.Del(ctx, key).Err() }, nil
			}
			if !errors.Is(err, redis.Nil) {
				return nil, err
			}
		}
	}
	return lock, func() { _ = c.Close() }, nil
}

func openDistlock(addr string, counts counters) (lockFunc, func(), error) {
	c, err := rueidisClient(addr, counts)
	if err != nil {
		return nil, nil, err
	}
	newMutex := func(key string) (*distlock.Mutex, error) { return distlock.NewMutex(c, key) }
	return distlockLock(newMutex), c.Close, nil
}

func openDistlockGoRedis(addr string, counts counters) (lockFunc, func(), error) {
	c := goRedisClient(addr, counts)
	newMutex := func(key string) (*distlock.Mutex, error) { return goredis.NewMutex(c, key) }
	return distlockLock(newMutex), func() { _ = c.Close() }, nil
}

// distlockLock is distlock's lockFunc on either client: a new Mutex per
// job, Lock, and a Release that the job's ctx cannot cut short.
func distlockLock(newMutex func(key string) (*distlock.Mutex, error)) lockFunc {
	return func(ctx context.Context, key string) (func() error, error) {
		m, err := newMutex(key)
		if err != nil {
			return nil, err
		}
		g, err := m.Lock(ctx)
		if err != nil {
			return nil, err
		}
		return func() error {
			st, err := g.Release(context.WithoutCancel(ctx))
			if err == nil && st != distlock.Released {
				err = fmt.Errorf("distlock: release of %s ended in state %v", key, st)
			}
			return err
		}, nil
	}
}

func openRedislock(addr string, counts counters) (lockFunc, func(), error) {
	c := goRedisClient(addr, counts)
	locker := redislock.New(c)
	opt := &redislock.Options{RetryStrategy: redislock.LinearBackoff(pollEvery)} // stateless: one for all
	lock := func(ctx context.Context, key string) (func() error, error) {
		l, err := locker.Obtain(ctx, key, bareTTL, opt)
		if err != nil {
			return nil, err
		}
		return func() error { return l.Release(ctx) }, nil
	}
	return lock, func() { _ = c.Close() }, nil
}

func openRedsync(addr string, counts counters) (lockFunc, func(), error) {
	return redsyncLock(addr, counts)
}

func openRedsyncTuned(addr string, counts counters) (lockFunc, func(), error) {
	return redsyncLock(addr, counts, redsync.WithRetryDelay(pollEvery), redsync.WithTries(1<<30))
}

func redsyncLock(addr string, counts counters, opts ...redsync.Option) (lockFunc, func(), error) {
	c := goRedisClient(addr, counts)
	rs := redsync.New(goredsync.NewPool(c))
	lock := func(ctx context.Context, key string) (func() error, error) {
		m := rs.NewMutex(key, opts...)
		if err := m.LockContext(ctx); err != nil {
			return nil, err
		}
		return func() error {
			ok, err := m.UnlockContext(ctx)
			if err == nil && !ok {
				err = fmt.Errorf("redsync: unlock of %s: not held", key)
			}
			return err
		}, nil
	}
	return lock, func() { _ = c.Close() }, nil
}

// openRueidislock opens rueidislock. Its WithContext (rueidis v1.0.79) can
// miss its wake-up and wait forever on a lock that is free: after a failed
// attempt, try starts the key's monitoring goroutine before it counts the
// failure, and a goroutine that runs first sees no failure, takes the
// waiter's gate for a released lock's and removes it from the locker's
// map; the invalidation that should wake the waiter then finds no gate.
// With client-side caching on, the waiter has no timeout to fall back on.
// Counting before the goroutine starts made it go away here (5 of 5 runs
// clean, against 3 of 5 with stuck jobs). runLocal reports such jobs as
// stuck.
func openRueidislock(addr string, counts counters) (lockFunc, func(), error) {
	locker, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption:   rueidisOption(addr, counts),
		KeyMajority:    1,
		NoLoopTracking: true,
	})
	if err != nil {
		return nil, nil, err
	}
	lock := func(ctx context.Context, key string) (func() error, error) {
		_, cancel, err := locker.WithContext(ctx, key)
		if err != nil {
			return nil, err
		}
		return func() error { cancel(); return nil }, nil
	}
	return lock, locker.Close, nil
}
