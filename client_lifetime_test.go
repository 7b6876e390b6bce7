package distlock_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
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
			hm := newMutex(t, holder, "held", distlock.WithTTL(time.Minute))
			g, err := hm.Lock(t.Context())
			require.NoError(t, err)
			// The holder's restart watch subscribes once its guard has
			// lived a moment, and that may take a connection of the
			// holder's client: count the connections after it, not before.
			if tc.noPubSub {
				time.Sleep(500 * time.Millisecond) // its subscription is refused
			} else {
				require.Eventually(t, func() bool {
					kind := "CHANNELS" // a server without sharded pub/sub (Redis 6.2)
					if srv.Has(redistest.ShardedPubSub) {
						kind = "SHARDCHANNELS"
					}
					chans, err := srv.MustDo("PUBSUB", kind, hm.Key()+":keeper:*").AsStrSlice()
					return err == nil && len(chans) > 0
				}, 10*time.Second, 5*time.Millisecond, "the holder's restart watch")
			}
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
			// What keeps a closed client reachable for a while is its own
			// goroutines, which end on their own after Close; under -race on
			// a loaded machine that took over 5 s. A client that distlock
			// keeps stays forever, so the bound only needs to end the test.
			closed := time.Now()
			var left int
			if !pollEveryUntil(collectedPoll, collectedWithin, func() bool {
				runtime.GC()
				left = jobs - int(collected.Load())
				return left == 0
			}) {
				t.Fatalf("%d of %d closed clients are still in memory %v after the last Close (at each GC, polled every %v)",
					left, jobs, time.Since(closed).Round(time.Millisecond), collectedPoll)
			}
			var open int
			if !pollEveryUntil(collectedPoll, collectedWithin, func() bool {
				open = connectedClients(t, srv)
				return open <= before
			}) {
				t.Fatalf("connections left open %v after the last Close: %d, before the jobs %d",
					time.Since(closed).Round(time.Millisecond), open, before)
			}
			t.Logf("every closed client collected and disconnected %v after the last Close", time.Since(closed).Round(time.Millisecond))
			release(t, g)
		})
	}
}

// TestClosedClientsSessionsGo has 200 clients each wait in line for a held
// lock (the Lock waits in a room, with its subscription, and is then
// given up) and then be closed, with both cores of the machine kept busy
// by two spinning goroutines all along. One second after the last Close,
// distlock keeps nothing of them: none of them has a session in the
// process's registry, and every one of their sessions has been collected
// (a cleanup on each session, run by the garbage collector, counts them).
// A session goes as soon as its client's Close has ended its room's
// subscription, without waiting out the room's linger; the linger bounds
// it anyway, at a quarter of a second.
func TestClosedClientsSessionsGo(t *testing.T) {
	const (
		clients    = 200
		parallel   = 20               // clients waiting at once
		waitInLine = 10 * time.Second // bounds how long a Lock takes to stand in line
		after      = time.Second      // from the last Close to the check
	)
	srv := redistest.Start(t)
	holder := srv.Client()
	g, err := newMutex(t, holder, "held", distlock.WithTTL(time.Minute)).Lock(t.Context())
	require.NoError(t, err)
	before := distlock.Sessions() // the holder's, and any an earlier test left lingering
	stop := burnCores(2)
	defer stop()

	var collected, sessions atomic.Int64
	job := func() error {
		c, err := rueidis.NewClient(srv.ClientOption())
		if err != nil {
			return err
		}
		defer c.Close()
		m, err := distlock.NewMutex(c, "held", distlock.WithTTL(time.Minute))
		if err != nil {
			return err
		}
		// The Lock waits until it stands in line, in a room of its
		// client's session, and is then given up.
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		locked := make(chan error, 1)
		go func() {
			_, err := m.Lock(ctx)
			locked <- err
		}()
		inLine := pollEveryUntil(time.Millisecond, waitInLine, func() bool { return distlock.Waiting(c) })
		if inLine && distlock.OnSessionCollected(c, func() { collected.Add(1) }) {
			sessions.Add(1) // (it waits in a room of the session: the session cannot go before cancel)
		}
		cancel()
		if err := <-locked; !errors.Is(err, context.Canceled) {
			return fmt.Errorf("the Lock on a held key: got %v, want its context's end", err)
		}
		if !inLine {
			return fmt.Errorf("the Lock did not stand in line within %v", waitInLine)
		}
		return nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	next := make(chan struct{}, clients)
	for range clients {
		next <- struct{}{}
	}
	close(next)
	for range parallel {
		wg.Go(func() {
			for range next {
				if err := job(); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	closed := time.Now()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, clients, sessions.Load(), "clients that had a session while their Lock waited")

	time.Sleep(time.Until(closed.Add(after))) // the scenario's timing: what is kept one second on
	assert.LessOrEqual(t, distlock.Sessions(), before, "sessions %v after the last Close", after)
	runtime.GC()
	runtime.GC()
	// The collector runs cleanups on a goroutine of its own, after the
	// cycle that found the sessions unreachable: that is all this waits for.
	var left int64
	if !pollEveryUntil(collectedPoll, 5*time.Second, func() bool {
		left = clients - collected.Load()
		return left == 0
	}) {
		t.Fatalf("%d of %d sessions of closed clients were still reachable %v after the last Close", left, clients, after)
	}
	t.Logf("every session of %d closed clients collected at the first GC %v after the last Close", clients, after)
	release(t, g)
}

// burnCores keeps n goroutines spinning, as a busy machine would, until
// the function it returns is called, which stops them and waits for them.
func burnCores(n int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				for i := 0; i < 1e5; i++ {
					spin.Add(1)
				}
			}
		})
	}
	return func() {
		close(done)
		wg.Wait()
	}
}

// spin is the busy goroutines' work, kept where the compiler cannot drop it.
var spin atomic.Int64

const (
	// collectedWithin bounds how long TestClosedClientsAreNotKept waits for
	// closed clients to be collected and disconnected.
	collectedWithin = 20 * time.Second
	collectedPoll   = 50 * time.Millisecond
)

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
