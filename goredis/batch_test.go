package goredis_test

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/goredis"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/internal/suite"
	"github.com/distkit-go/distlock/lease"
)

// TestSharding checks what the adapter says of each kind of go-redis
// client, which decides the leases distlock renews in one script.
func TestSharding(t *testing.T) {
	for _, tt := range []struct {
		name string
		rdb  redis.UniversalClient
		want lease.Sharding
	}{
		{"Client", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), lease.Unsharded},
		{"FailoverClient", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}}), lease.Unsharded},
		{"ClusterClient", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), lease.ShardedBySlot},
		{"Ring", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": "127.0.0.1:1"}}), lease.ShardedByTag},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Cleanup(func() { _ = tt.rdb.Close() })
			assert.Equal(t, tt.want, goredis.ShardingOf(tt.rdb))
		})
	}
}

// renewCounter counts the renewals answered, those that failed, and the
// losses.
type renewCounter struct{ renewals, failures, lost atomic.Int64 }

func (o *renewCounter) ObserveAcquire(distlock.AcquireInfo) {}
func (o *renewCounter) ObserveRenew(r distlock.RenewInfo) {
	o.renewals.Add(1)
	if r.Err != nil {
		o.failures.Add(1)
	}
}
func (o *renewCounter) ObserveTransition(tr distlock.TransitionInfo) {
	if tr.To == distlock.Lost {
		o.lost.Add(1)
	}
}

// TestRingRenewsPerLock holds locks on a Ring of two servers: the Ring
// places each lock's keys by its hash tag, so a script for the leases of
// two locks would go to the first one's server only. Every renewal must be
// confirmed.
func TestRingRenewsPerLock(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr(), "b": b.Addr()}})
	t.Cleanup(func() { _ = ring.Close() })
	ctx := ctxFor(t, 10*time.Second)
	const ttl = 600 * time.Millisecond
	obs := &renewCounter{}
	probe := suite.StartSchedProbe(t)
	from := time.Now()
	var guards []*distlock.Guard
	for i := range 20 {
		m, err := goredis.NewMutex(ring, "ring:"+strconv.Itoa(i), distlock.WithTTL(ttl), distlock.WithObserver(obs))
		require.NoError(t, err)
		g, err := m.Lock(ctx)
		require.NoError(t, err)
		guards = append(guards, g)
	}
	const rounds = 4
	time.Sleep(rounds * ttl / 3)
	states := make([]distlock.State, len(guards))
	for i, g := range guards {
		states[i] = g.State()
		_, err := g.Release(ctx)
		require.NoError(t, err)
	}
	if late, budget := probe.Delay(from, time.Now()), suite.RenewalBudget(ttl); late >= budget && (obs.failures.Load() > 0 || obs.lost.Load() > 0) {
		// A guard kept from running for longer than its renewal had to
		// spare loses its lease: the machine's doing, not a breach.
		t.Skipf("%d renewals failed and %d guards were lost, but the probe measured a scheduling delay of %v, at least the %v a renewal had to spare",
			obs.failures.Load(), obs.lost.Load(), late.Round(time.Millisecond), budget)
	}
	for i, st := range states {
		assert.Equal(t, distlock.Acquired, st, "guard %d", i)
	}
	assert.GreaterOrEqual(t, obs.renewals.Load(), int64((rounds-1)*len(guards)))
	assert.Zero(t, obs.failures.Load(), "failed renewals")
	assert.Zero(t, obs.lost.Load(), "Lost events")
	for _, s := range []*redistest.Server{a, b} {
		n, err := s.MustDo("DBSIZE").AsInt64()
		require.NoError(t, err)
		assert.Positive(t, n, "both servers hold locks (their fencing keys)")
	}
}
