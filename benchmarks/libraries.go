package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	goredsync "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/distkit-go/distlock"
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

// Names of the two bare rows, the baselines.
const (
	libBare        = "bare"
	libBareGoRedis = "bare-goredis"
)

// lockFunc takes the lock on key, waiting for it as long as the library
// waits, and returns the function that releases it. A new lock object is
// made for every call, as a worker makes one per job.
type lockFunc func(ctx context.Context, key string) (release func() error, err error)

// library is one way to take a lock, on a client of its own.
type library struct {
	name    string
	client  string // clientRueidis or clientGoRedis
	counter *redistest.CommandCounter
	lock    lockFunc
	close   func()
}

// libSpec describes a library and how to open it.
type libSpec struct {
	name   string
	client string
	// how says how the library is called, for the output.
	how string
	// contendedOnly libraries differ from another row only when they wait.
	contendedOnly bool
	open          func(addr string, counter *redistest.CommandCounter) (lockFunc, func(), error)
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
		name: "distlock", client: clientRueidis,
		how:  "`NewMutex(client, key)` per job, `Lock(ctx)`, `Release(context.WithoutCancel(ctx))`, defaults (TTL 30 s, renewed at TTL/3)",
		open: openDistlock,
	},
	{
		name: "redislock", client: clientGoRedis,
		how: "bsm/redislock `Obtain(ctx, key, 30s, &Options{RetryStrategy: LinearBackoff(1ms)})`, `Release(ctx)`: " +
			"it has no default retry (one attempt), and 1 ms is the shortest a timer lasts here; no renewal",
		open: openRedislock,
	},
	{
		name: "redsync", client: clientGoRedis,
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
		counter := &redistest.CommandCounter{}
		lock, closeFn, err := spec.open(addr, counter)
		if err != nil {
			closeLibraries(libs)
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		libs[name] = &library{name: name, client: spec.client, counter: counter, lock: lock, close: closeFn}
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
// the commands that ask for it), counting its commands in counter.
func rueidisClient(addr string, counter *redistest.CommandCounter) (rueidis.Client, error) {
	return rueidis.NewClient(rueidisOption(addr, counter))
}

func rueidisOption(addr string, counter *redistest.CommandCounter) rueidis.ClientOption {
	return rueidis.ClientOption{
		InitAddress: []string{addr},
		DialCtxFn: func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
			return dialCounting(ctx, d, addr, counter)
		},
	}
}

// goRedisClient returns a go-redis client of addr with its defaults,
// counting its commands in counter.
func goRedisClient(addr string, counter *redistest.CommandCounter) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr,
		Dialer: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return dialCounting(ctx, &net.Dialer{}, addr, counter)
		},
	})
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

func openBare(addr string, counter *redistest.CommandCounter) (lockFunc, func(), error) {
	c, err := rueidisClient(addr, counter)
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

func openBareGoRedis(addr string, counter *redistest.CommandCounter) (lockFunc, func(), error) {
	c := goRedisClient(addr, counter)
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

func openDistlock(addr string, counter *redistest.CommandCounter) (lockFunc, func(), error) {
	c, err := rueidisClient(addr, counter)
	if err != nil {
		return nil, nil, err
	}
	lock := func(ctx context.Context, key string) (func() error, error) {
		m, err := distlock.NewMutex(c, key)
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
	return lock, c.Close, nil
}

func openRedislock(addr string, counter *redistest.CommandCounter) (lockFunc, func(), error) {
	c := goRedisClient(addr, counter)
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

func openRedsync(addr string, counter *redistest.CommandCounter) (lockFunc, func(), error) {
	return redsyncLock(addr, counter)
}

func openRedsyncTuned(addr string, counter *redistest.CommandCounter) (lockFunc, func(), error) {
	return redsyncLock(addr, counter, redsync.WithRetryDelay(pollEvery), redsync.WithTries(1<<30))
}

func redsyncLock(addr string, counter *redistest.CommandCounter, opts ...redsync.Option) (lockFunc, func(), error) {
	c := goRedisClient(addr, counter)
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
func openRueidislock(addr string, counter *redistest.CommandCounter) (lockFunc, func(), error) {
	locker, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption:   rueidisOption(addr, counter),
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
