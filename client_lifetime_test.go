package distlock_test

import (
	"context"
	"crypto/tls"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// A service that makes a short-lived client per job: each job's Lock waits
// on a held key, gives up (its ctx ends, or its max wait), and the job
// closes its client right away, while the clean-up that Lock left to the
// background may still run. Nothing of distlock may keep a closed client in
// memory (issue 16, part 3): no room may subscribe again on it, no call
// that Lock left behind may use it after Lock returned, and the clean-up
// runs on a borrowed connection that goes with the closed client. Each
// client's dialer holds a ballast whose collection the test counts, and the
// server's connection count must come back to where it was.
func TestClosedClientsAreNotKept(t *testing.T) {
	cases := []struct {
		name     string
		noPubSub bool                                         // the server refuses pub/sub: waiters poll
		opts     []distlock.Option                            // for the job's Mutex
		ctx      func() (context.Context, context.CancelFunc) // the job's Lock context
	}{
		{name: "ctx ends the wait",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 30*time.Millisecond)
			}},
		{name: "ctx ends the wait, pub/sub refused", noPubSub: true,
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 30*time.Millisecond)
			}},
		{name: "max wait ends the wait", opts: []distlock.Option{distlock.WithMaxWait(30 * time.Millisecond)},
			ctx: func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			opt := srv.ClientOption()
			if tc.noPubSub {
				srv.MustDo("ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-@pubsub")
				opt.Username, opt.Password = "app", "secret"
			}
			holder := redistest.NewClient(t, opt)
			g, err := newMutex(t, holder, "held", distlock.WithTTL(time.Minute)).Lock(t.Context())
			require.NoError(t, err)
			before := connectedClients(t, srv)

			const jobs = 40
			var collected atomic.Int64
			for i := range jobs {
				ballast := make([]byte, 64<<10)
				runtime.AddCleanup(&ballast[0], func(int) { collected.Add(1) }, i)
				o := opt
				o.DialCtxFn = func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
					_ = ballast[0]
					return d.DialContext(ctx, "tcp", addr)
				}
				c, err := rueidis.NewClient(o)
				require.NoError(t, err)
				m, err := distlock.NewMutex(c, "held", append([]distlock.Option{distlock.WithTTL(time.Minute)}, tc.opts...)...)
				require.NoError(t, err)
				ctx, cancel := tc.ctx()
				_, err = m.Lock(ctx)
				cancel()
				require.Error(t, err, "job %d got a held lock", i)
				c.Close()
			}
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			require.NoError(t, distlock.Settle(sctx))
			scancel()
			require.Eventually(t, func() bool {
				runtime.GC()
				return collected.Load() == jobs
			}, 5*time.Second, 50*time.Millisecond, "%d of %d closed clients are still in memory", jobs-int(collected.Load()), jobs)
			require.Eventually(t, func() bool { return connectedClients(t, srv) <= before },
				5*time.Second, 50*time.Millisecond, "connections left open: %d, before the jobs %d", connectedClients(t, srv), before)
			release(t, g)
		})
	}
}

// connectedClients returns the server's connected_clients, without the
// connection that asks.
func connectedClients(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	info, err := srv.MustDo("INFO", "clients").ToString()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
			n, err := strconv.Atoi(v)
			require.NoError(t, err)
			return n - 1
		}
	}
	t.Fatal("no connected_clients in INFO clients")
	return 0
}
