package distlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
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
	lb := nextLeader(t, obs, promptly, func(l distlock.Leader) bool { return l.Value == "10.0.0.2:8080" })
	gb := <-bDone
	assert.Equal(t, gb.Token(), lb.Token)
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
