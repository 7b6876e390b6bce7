package distlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/distkit-go/distlock/internal/faultproxy"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/distlocktest"
	"github.com/distkit-go/distlock/internal/redistest"
)

// nextLeader waits for the next Leader on ch that satisfies ok.
func nextLeader(t *testing.T, ch <-chan distlock.Leader, within time.Duration, ok func(distlock.Leader) bool) distlock.Leader {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l, open := <-ch:
			require.True(t, open, "the Observe channel closed")
			if ok(l) {
				return l
			}
		case <-deadline:
			t.Fatalf("no matching leader within %v", within)
		}
	}
}

func TestElectionCampaignObserveResign(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	newElection := func(opts ...distlock.Option) *distlock.Election {
		e, err := distlock.NewElection(redistest.NewClient(t, srv.ClientOption()), "leader", append([]distlock.Option{distlock.WithTTL(time.Second)}, opts...)...)
		require.NoError(t, err)
		return e
	}
	watcher := newElection()
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	obs := watcher.Observe(octx)
	first := nextLeader(t, obs, promptly, func(distlock.Leader) bool { return true })
	assert.True(t, first.IsZero(), "nobody leads yet: %v", first)

	a, b := newElection(), newElection()
	ga, err := a.Campaign(ctx, "10.0.0.1:8080")
	require.NoError(t, err)
	la := nextLeader(t, obs, promptly, func(l distlock.Leader) bool { return !l.IsZero() })
	assert.Equal(t, "10.0.0.1:8080", la.Value)
	assert.Equal(t, ga.Token(), la.Token)
	got, err := b.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, la, got)

	bDone := make(chan *distlock.Guard, 1)
	go func() {
		g, err := b.Campaign(ctx, "10.0.0.2:8080")
		assert.NoError(t, err)
		bDone <- g
	}()
	waitInLine(t, srv, "distlock:{leader}", 1)
	_, err = ga.Release(ctx)
	require.NoError(t, err)
	gb := <-bDone
	// The pass is announced; on a busy machine the candidate may find it
	// too late to use and claim it anew, with a newer token, announced too.
	lb := nextLeader(t, obs, promptly, func(l distlock.Leader) bool { return l.Token == gb.Token() })
	assert.Equal(t, "10.0.0.2:8080", lb.Value)
	assert.Greater(t, lb.Token, la.Token)
	_, err = gb.Release(ctx)
	require.NoError(t, err)
	nextLeader(t, obs, promptly, func(l distlock.Leader) bool { return l.IsZero() })

	// A leader that stops renewing (Leave) is gone for observers once its
	// lease has run out, without any announcement.
	gc, err := a.Campaign(ctx, "c")
	require.NoError(t, err)
	nextLeader(t, obs, promptly, func(l distlock.Leader) bool { return l.Value == "c" })
	left := time.Now()
	_, err = gc.Leave(ctx)
	require.NoError(t, err)
	nextLeader(t, obs, 3*time.Second, func(l distlock.Leader) bool { return l.IsZero() })
	assert.Less(t, time.Since(left), time.Second+500*time.Millisecond)

	cancel()
	for range obs {
	}
}

func newElection(t *testing.T, opt rueidis.ClientOption, name string, opts ...distlock.Option) *distlock.Election {
	t.Helper()
	e, err := distlock.NewElection(redistest.NewClient(t, opt), name, opts...)
	require.NoError(t, err)
	return e
}

// A leader cut off from Redis (dead, frozen or partitioned) loses its term
// by its own clock before the lease ends; the candidate first in line leads
// once it has, and the observers see the new leader right after.
func TestElectionLeaderCutOff(t *testing.T) {
	srv := redistest.Start(t)
	const ttl = 600 * time.Millisecond
	proxy, opt := throughProxy(t, srv)
	old := newElection(t, opt, "lead", distlock.WithTTL(ttl))
	g, err := old.Campaign(t.Context(), "old")
	require.NoError(t, err)
	lost := g.Subscribe(t.Context())

	next := newElection(t, srv.ClientOption(), "lead", distlock.WithTTL(ttl))
	type won struct {
		g  *distlock.Guard
		at time.Time
	}
	wonc := make(chan won, 1)
	go func() {
		g, err := next.Campaign(t.Context(), "next")
		assert.NoError(t, err)
		wonc <- won{g, time.Now()}
	}()
	waitInLine(t, srv, "distlock:{lead}", 1)
	octx, cancel := context.WithCancel(t.Context())
	defer cancel()
	obs := newElection(t, srv.ClientOption(), "lead").Observe(octx)
	nextLeader(t, obs, promptly, func(l distlock.Leader) bool { return l.Value == "old" })

	cut := time.Now()
	proxy.SetBoth(faultproxy.Blackhole)
	// The old leader's last deadline: State says Acquired only before it,
	// whatever the scheduling delay of its actor.
	var lostAt time.Time
	for g.State() == distlock.Acquired {
		if d := g.Deadline(); !d.IsZero() {
			lostAt = d
		}
		time.Sleep(time.Millisecond)
	}
	for ev := range lost {
		if ev.State == distlock.Lost {
			break
		}
	}
	w := <-wonc
	seen := nextLeader(t, obs, promptly, func(l distlock.Leader) bool { return l.Value == "next" })
	seenAt := time.Now()
	t.Logf("old leader lost %v after the cut, next leads %v after, observer saw it %v after", lostAt.Sub(cut), w.at.Sub(cut), seenAt.Sub(cut))
	assert.True(t, lostAt.Before(w.at), "the old leader still believed it led when the next one began")
	assert.Equal(t, w.g.Token(), seen.Token)
	assert.Greater(t, seen.Token, g.Token())
	assert.Less(t, seenAt.Sub(cut), ttl+promptly)
	proxy.SetBoth(faultproxy.Pass)
	release(t, w.g)
	_, _ = g.Release(t.Context())
	cancel()
	for range obs {
	}
}

// Where the server refuses pub/sub, observers poll and still see every
// change, and the candidates still hand the lead over.
func TestElectionWithoutPubSub(t *testing.T) {
	srv := redistest.Start(t)
	srv.MustDo("ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-@pubsub")
	opt := srv.ClientOption()
	opt.Username, opt.Password = "app", "secret"
	octx, cancel := context.WithCancel(t.Context())
	defer cancel()
	obs := newElection(t, opt, "lead").Observe(octx)
	nextLeader(t, obs, promptly, distlock.Leader.IsZero)
	a := newElection(t, opt, "lead", distlock.WithTTL(longTTL))
	ga, err := a.Campaign(t.Context(), "a")
	require.NoError(t, err)
	nextLeader(t, obs, promptly, func(l distlock.Leader) bool { return l.Value == "a" })
	release(t, ga)
	nextLeader(t, obs, promptly, distlock.Leader.IsZero)
	cancel()
	for range obs {
	}
}

// The observers of one Election share one subscription, which comes back
// after the server drops it; a change made meanwhile is not missed.
func TestElectionObserversShareOneSubscription(t *testing.T) {
	srv := redistest.Start(t)
	e := newElection(t, srv.ClientOption(), "lead")
	octx, cancel := context.WithCancel(t.Context())
	defer cancel()
	o1, o2 := e.Observe(octx), e.Observe(octx)
	for _, o := range []<-chan distlock.Leader{o1, o2} {
		nextLeader(t, o, promptly, distlock.Leader.IsZero)
	}
	subscribers := func() int64 {
		arr, err := srv.MustDo("PUBSUB", "SHARDNUMSUB", "distlock:{lead}:leader").ToArray()
		require.NoError(t, err)
		n, err := arr[1].AsInt64()
		require.NoError(t, err)
		return n
	}
	require.Eventually(t, func() bool { return subscribers() == 1 }, eventually, pollEvery)
	srv.MustDo("CLIENT", "KILL", "TYPE", "pubsub")
	g, err := newElection(t, srv.ClientOption(), "lead", distlock.WithTTL(longTTL)).Campaign(t.Context(), "x")
	require.NoError(t, err)
	for _, o := range []<-chan distlock.Leader{o1, o2} {
		nextLeader(t, o, promptly, func(l distlock.Leader) bool { return l.Value == "x" })
	}
	require.Eventually(t, func() bool { return subscribers() == 1 }, eventually, pollEvery)
	release(t, g)
	cancel()
	for range o1 {
	}
	for range o2 {
	}
	// The last observer's channel closes only once the watcher has
	// unsubscribed: nothing of it is left.
	assert.Zero(t, subscribers(), "subscriptions once the last observer's channel closed")
}

func TestElectionRefusesBadInput(t *testing.T) {
	srv := distlocktest.New(t)
	_, err := distlock.NewElection(srv.Client(), "lead", distlock.WithOwner("me"))
	var oe *distlock.OptionError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "owner", oe.Field)
	e, err := distlock.NewElection(srv.Client(), "lead")
	require.NoError(t, err)
	for _, v := range []string{"", "a\nb", string(make([]byte, 300))} {
		_, err := e.Campaign(t.Context(), v)
		var ae *distlock.ArgumentError
		require.ErrorAs(t, err, &ae, "value %q", v)
		assert.Equal(t, "value", ae.Arg)
		assert.ErrorIs(t, err, distlock.ErrInvalidArgument)
	}
	//lint:ignore SA1012 testing the nil check
	_, err = e.Campaign(nil, "v")
	assert.ErrorIs(t, err, distlock.ErrInvalidArgument)
	//lint:ignore SA1012 testing the nil check
	_, ok := <-e.Observe(nil)
	assert.False(t, ok, "Observe(nil) returns a closed channel")

	// A semaphore of the same name is not an election.
	s, err := distlock.NewSemaphore(srv.Client(), "lead", 2)
	require.NoError(t, err)
	g, err := s.TryAcquire(t.Context())
	require.NoError(t, err)
	_, err = e.Leader(t.Context())
	assert.ErrorIs(t, err, distlock.ErrNotElection)
	_, err = g.Release(t.Context())
	require.NoError(t, err)
}
