package distlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Helpers shared by the package's tests. The client-independent tests have
// their own, in internal/suite.

// Timing used across the tests. Scheduling on a busy 2-core machine can add
// tens of milliseconds to any wake-up, so waits for an outcome are generous
// and assertions about "not before" use the contract's own bounds.
const (
	eventually = 5 * time.Second // upper bound for something that should happen soon
	pollEvery  = 5 * time.Millisecond
)

// newMutex returns a Mutex of c, failing the test on an error.
func newMutex(t *testing.T, c rueidis.Client, key string, opts ...distlock.Option) *distlock.Mutex {
	t.Helper()
	m, err := distlock.NewMutex(c, key, opts...)
	require.NoError(t, err)
	return m
}

// release releases g within eventually and returns the state it reports.
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

// get returns the string at key on srv, and whether there is one.
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
