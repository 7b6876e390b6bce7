package distlock_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/redistest"
)

// The tests of waiting (SAFETY.md, W1-W5) are client-independent and live
// in internal/suite (TestSuiteWaiting, and TestSuiteFaults for a restart).
// Here are the two that concern rueidis itself: it keeps a pooled
// connection that broke while idle until a command fails on it (SAFETY.md,
// finding 2), so the first call of a wait or of the release that passes
// the lock must be sent again rather than fail.

const (
	// longTTL is a holder's TTL when only a release, never an expiry, may
	// explain how soon a waiter acquires.
	longTTL = 30 * time.Second
	// promptly bounds a wake-up that takes a push and a round trip: far
	// above that on an idle machine, far below longTTL.
	promptly = 2 * time.Second
)

// requireNothingLeft checks W5: once every waiter has left and the rooms
// have lingered, the lock leaves no line, no subscription and no room.
func requireNothingLeft(t *testing.T, srv *redistest.Server, key string) {
	t.Helper()
	require.Eventually(t, func() bool {
		return !exists(t, srv, key+":queue") && !exists(t, srv, key+":waiters") &&
			len(wakeChannels(t, srv, key)) == 0 && distlock.Rooms() == 0
	}, eventually, pollEvery, "left behind: queue %v, waiters %v, subscriptions %v, rooms %d",
		exists(t, srv, key+":queue"), exists(t, srv, key+":waiters"), wakeChannels(t, srv, key), distlock.Rooms())
}

// throughProxy returns a fault proxy in front of srv and the options of a
// client that reaches srv through it.
func throughProxy(t *testing.T, srv *redistest.Server) (*faultproxy.Proxy, rueidis.ClientOption) {
	t.Helper()
	proxy := faultproxy.New(t, srv.Addr())
	opt := srv.ClientOption()
	opt.InitAddress = []string{proxy.Addr()}
	return proxy, opt
}

// openAllConnections makes c open every pooled connection (keyed commands
// pick one at random), so that a reset breaks them all while idle.
func openAllConnections(t *testing.T, c rueidis.Client) {
	t.Helper()
	for i := range 64 {
		require.NoError(t, c.Do(t.Context(), c.B().Exists().Key(strconv.Itoa(i)).Build()).Error())
	}
}

// Regression 3 of issue 9: the release that passes the lock to a waiter of
// the same process goes out on a pooled connection that died while idle. It
// is retried, and the waiter gets the lock at once, not after the TTL.
func TestPassAfterIdleConnectionsDied(t *testing.T) {
	srv := redistest.Start(t)
	proxy, opt := throughProxy(t, srv)
	opt.PipelineMultiplex = 2 // four connections, chosen at random per command
	c := redistest.NewClient(t, opt)
	g, err := newMutex(t, c, "res", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	result := lockAsync(t, t.Context(), newMutex(t, c, "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, g.Key(), 1)
	openAllConnections(t, c)

	proxy.Reset()
	released := time.Now()
	assert.Equal(t, distlock.Released, release(t, g))
	o := await(t, result, promptly, "the waiter")
	require.NoError(t, o.Err())
	assert.Less(t, o.At().Sub(released), promptly)
	release(t, o.Guard())
	requireNothingLeft(t, srv, g.Key())
}

// A waiting Lock whose first call goes out on a pooled connection that died
// while idle sends it again, rather than fail with the connection's error.
func TestLockAfterIdleConnectionsDied(t *testing.T) {
	srv := redistest.Start(t)
	g, err := newMutex(t, srv.Client(), "res", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	proxy, opt := throughProxy(t, srv)
	opt.PipelineMultiplex = 2 // four connections, chosen at random per command
	c := redistest.NewClient(t, opt)
	openAllConnections(t, c)
	proxy.Reset()
	result := lockAsync(t, t.Context(), newMutex(t, c, "res", distlock.WithTTL(longTTL)))
	waitInLine(t, srv, g.Key(), 1)
	release(t, g)
	o := await(t, result, promptly, "the waiter")
	require.NoError(t, o.Err())
	release(t, o.Guard())
	requireNothingLeft(t, srv, g.Key())
}
