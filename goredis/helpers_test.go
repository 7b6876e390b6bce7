package goredis_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/distkit-go/distlock/internal/redistest"
)

// Time bounds of the tests. The machine may have two shared cores and be
// several times slower from one minute to the next, so a bound is set well
// above what the behaviour needs and well below what its absence would cost.
const (
	// callTimeout bounds one admin command or one call that should succeed.
	callTimeout = 10 * time.Second
	// settleTimeout bounds waiting for a state that Redis or distlock
	// reaches on its own (a subscription confirmed, a line of n).
	settleTimeout = 15 * time.Second
)

// newClient returns a go-redis client of addr, closed when the test ends.
// opt, if given, is the starting point (its Addr is set to addr).
func newClient(t *testing.T, addr string, opt ...*redis.Options) *redis.Client {
	t.Helper()
	o := &redis.Options{}
	if len(opt) > 0 {
		o = opt[0]
	}
	o.Addr = addr
	rdb := redis.NewClient(o)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// newClusterClient returns a go-redis cluster client of c (every node a
// seed), closed when the test ends.
func newClusterClient(t *testing.T, c *redistest.Cluster) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// cmdStat returns one field (such as "calls" or "rejected_calls") of the
// INFO commandstats line of cmd on s, 0 when Redis has no line for it yet.
func cmdStat(t *testing.T, s *redistest.Server, cmd, field string) int64 {
	t.Helper()
	info, err := s.Info("commandstats")
	if err != nil {
		t.Fatalf("INFO commandstats on %s: %v", s.Addr(), err)
	}
	for kv := range strings.SplitSeq(info["cmdstat_"+cmd], ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == field {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("cmdstat_%s %s=%q: %v", cmd, field, v, err)
			}
			return n
		}
	}
	return 0
}

// eventually waits until cond holds, checking every 10 ms, and fails the
// test with what cond last said after within.
func eventually(t *testing.T, within time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ctxFor returns a context for one step of a test, ended after d or with
// the test.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func itoa64(n int64) string { return strconv.FormatInt(n, 10) }
