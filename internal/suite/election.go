package suite

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Election runs the tests of the Election against a redis-server of each
// test's own: campaigns, the lead passed in line, observers (announced by
// pub/sub, read where it is refused, one subscription per Election), and
// a leader cut off.
func Election(t *testing.T, lib Library) {
	t.Run("CampaignObserveResign", func(t *testing.T) { electionCampaignObserveResign(t, lib) })
	t.Run("LeaderCutOff", func(t *testing.T) { electionLeaderCutOff(t, lib) })
	t.Run("WithoutPubSub", func(t *testing.T) { electionWithoutPubSub(t, lib) })
	t.Run("ObserversShareOneSubscription", func(t *testing.T) { electionObserversShareOneSubscription(t, lib) })
}

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

// drainLeaders waits until ch is closed (its Observe context has ended).
func drainLeaders(ch <-chan distlock.Leader) {
	for range ch {
	}
}

func electionCampaignObserveResign(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	ctx := t.Context()
	elect := func() *distlock.Election {
		return newElection(t, connect(t, lib, srv), "leader", distlock.WithTTL(time.Second))
	}
	watcher := elect()
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	obs := watcher.Observe(octx)
	first := nextLeader(t, obs, promptly, func(distlock.Leader) bool { return true })
	assert.True(t, first.IsZero(), "nobody leads yet: %v", first)

	a, b := elect(), elect()
	ga, err := a.Campaign(ctx, "10.0.0.1:8080")
	require.NoError(t, err)
	la := nextLeader(t, obs, promptly, func(l distlock.Leader) bool { return !l.IsZero() })
	assert.Equal(t, "10.0.0.1:8080", la.Value)
	assert.Equal(t, ga.Token(), la.Token)
	got, err := b.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, la, got)

	bDone := async(t, ctx, func(ctx context.Context) (*distlock.Guard, error) { return b.Campaign(ctx, "10.0.0.2:8080") })
	waitInLine(t, srv, "distlock:{leader}", 1)
	release(t, ga)
	ob := await(t, bDone, promptly, "the candidate in line")
	require.NoError(t, ob.err)
	gb := ob.g
	// The pass is announced; on a busy machine the candidate may find it
	// too late to use and claim it anew, with a newer token, announced too.
	lb := nextLeader(t, obs, promptly, func(l distlock.Leader) bool { return l.Token == gb.Token() })
	assert.Equal(t, "10.0.0.2:8080", lb.Value)
	assert.Greater(t, lb.Token, la.Token)
	release(t, gb)
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
	assertSoon(t, p, left, time.Since(left), time.Second+500*time.Millisecond, "observers seeing no leader after Leave, at a TTL of 1 s")

	cancel()
	drainLeaders(obs)
}

// A leader cut off from Redis (dead, frozen or partitioned) loses its term
// by its own clock before the lease ends; the candidate first in line leads
// once it has, and the observers see the new leader right after.
func electionLeaderCutOff(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	p := startSchedProbe(t)
	const ttl = 600 * time.Millisecond
	proxy, cut := throughProxy(t, lib, srv)
	old := newElection(t, cut, "lead", distlock.WithTTL(ttl))
	g, err := old.Campaign(t.Context(), "old")
	require.NoError(t, err)
	lost := g.Subscribe(t.Context())

	next := newElection(t, connect(t, lib, srv), "lead", distlock.WithTTL(ttl))
	wonc := async(t, t.Context(), func(ctx context.Context) (*distlock.Guard, error) { return next.Campaign(ctx, "next") })
	waitInLine(t, srv, "distlock:{lead}", 1)
	octx, cancel := context.WithCancel(t.Context())
	defer cancel()
	obs := newElection(t, connect(t, lib, srv), "lead").Observe(octx)
	nextLeader(t, obs, promptly, func(l distlock.Leader) bool { return l.Value == "old" })

	cutAt := time.Now()
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
	w := await(t, wonc, ttl+eventually, "the next candidate")
	require.NoError(t, w.err)
	seen := nextLeader(t, obs, promptly, func(l distlock.Leader) bool { return l.Value == "next" })
	seenAt := time.Now()
	// The Lost event follows the deadline, but for the scheduling delay of
	// the old leader's goroutine (L1).
	ev := untilState(t, lost, distlock.Lost, eventually, "the old leader")
	t.Logf("old leader's deadline %v after the cut, Lost event %v after; next leads %v after, observer saw it %v after",
		lostAt.Sub(cutAt), ev.Time.Sub(cutAt), w.at.Sub(cutAt), seenAt.Sub(cutAt))
	assert.True(t, lostAt.Before(w.at), "the old leader still believed it led when the next one began")
	assertSoon(t, p, lostAt, ev.Time.Sub(lostAt), slack, "the old leader's Lost event after its deadline")
	assert.Equal(t, w.g.Token(), seen.Token)
	assert.Greater(t, seen.Token, g.Token())
	assertSoon(t, p, cutAt, seenAt.Sub(cutAt), ttl+promptly, "the observer seeing the next leader after the old one was cut off")
	proxy.Heal()
	release(t, w.g)
	_, _ = g.Release(t.Context())
	cancel()
	drainLeaders(obs)
}

// Where the server refuses pub/sub, observers poll and still see every
// change, and the candidates still hand the lead over.
func electionWithoutPubSub(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	target := withoutPubSub(t, srv)
	octx, cancel := context.WithCancel(t.Context())
	defer cancel()
	obs := newElection(t, lib.Connect(t, target), "lead").Observe(octx)
	nextLeader(t, obs, promptly, distlock.Leader.IsZero)
	a := newElection(t, lib.Connect(t, target), "lead", distlock.WithTTL(longTTL))
	ga, err := a.Campaign(t.Context(), "a")
	require.NoError(t, err)
	nextLeader(t, obs, promptly, func(l distlock.Leader) bool { return l.Value == "a" })
	release(t, ga)
	nextLeader(t, obs, promptly, distlock.Leader.IsZero)
	cancel()
	drainLeaders(obs)
}

// The observers of one Election share one subscription, which comes back
// after the server drops it; a change made meanwhile is not missed.
func electionObserversShareOneSubscription(t *testing.T, lib Library) {
	srv := redistest.Start(t)
	e := newElection(t, connect(t, lib, srv), "lead")
	octx, cancel := context.WithCancel(t.Context())
	defer cancel()
	o1, o2 := e.Observe(octx), e.Observe(octx)
	for _, o := range []<-chan distlock.Leader{o1, o2} {
		nextLeader(t, o, promptly, distlock.Leader.IsZero)
	}
	subscribed := func() int64 { return subscribers(t, srv, "distlock:{lead}:leader") }
	require.Eventually(t, func() bool { return subscribed() == 1 }, eventually, pollEvery)
	srv.MustDo("CLIENT", "KILL", "TYPE", "pubsub")
	g, err := newElection(t, connect(t, lib, srv), "lead", distlock.WithTTL(longTTL)).Campaign(t.Context(), "x")
	require.NoError(t, err)
	for _, o := range []<-chan distlock.Leader{o1, o2} {
		nextLeader(t, o, promptly, func(l distlock.Leader) bool { return l.Value == "x" })
	}
	require.Eventually(t, func() bool { return subscribed() == 1 }, eventually, pollEvery)
	release(t, g)
	cancel()
	drainLeaders(o1)
	drainLeaders(o2)
	// The last observer's channel closes only once the watcher has
	// unsubscribed: nothing of it is left.
	assert.Zero(t, subscribed(), "subscriptions once the last observer's channel closed")
}
