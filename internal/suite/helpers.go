package suite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Timing used across the groups. Scheduling on a busy 2-core machine can
// add tens of milliseconds to any wake-up, so waits for an outcome are
// generous, and assertions about "not before" use the contract's own
// bounds.
// The helpers of the root package's own tests that the suite's share, so
// that each is written once.
var (
	Release      = release
	WaitState    = waitState
	NextEvent    = nextEvent
	WaitRenewed  = waitRenewed
	Get          = get
	InLine       = inLine
	WaitInLine   = waitInLine
	WakeChannels = wakeChannels
	Exists       = exists
	LockAsync    = lockAsync
	Async        = async
	Await        = await

	LapsedDeleteTimedOut = lapsedDeleteTimedOut
)

const (
	shortTTL    = 600 * time.Millisecond
	eventually  = 5 * time.Second // upper bound for something that should happen soon
	pollEvery   = 5 * time.Millisecond
	tokenWindow = 10 * time.Minute // tokens are server microseconds; they must be recent

	// longTTL is a holder's TTL when only a release, never an expiry, may
	// explain how soon a waiter acquires.
	longTTL = 30 * time.Second
	// promptly bounds a wake-up that takes a push and a round trip: far
	// above that on an idle machine, far below longTTL.
	promptly = 2 * time.Second
	// giveUpBound bounds how long Lock may take to return once its ctx is
	// done. A network wait would take the clean-up's timeout (250ms) or the
	// call's deadline (seconds here); a scheduling delay on a loaded 2-core
	// machine stays well below.
	giveUpBound = 200 * time.Millisecond
	// slack is how much later than the contract's bound an event sent by a
	// guard's goroutine (a Lost event at the deadline) may come on a loaded
	// machine, as in SAFETY.md ("soon after" allows 250 ms). State() does
	// not wait for that goroutine, so what it says is checked exactly.
	slack = 250 * time.Millisecond
	// starvedClaim is the claim window of waiters in tests that check the
	// order of grants with no waiter dying: far above the scheduling delay
	// of a loaded 2-core machine under -race (seconds at worst), so that no
	// live waiter loses its turn, or a permit passed to it, for being slow.
	starvedClaim = 5 * time.Second
	// ackTimeout is the replica acknowledgement timeout: long enough for a
	// replica on a loaded machine, short against the TTLs.
	ackTimeout = 300 * time.Millisecond
)

// margin is the guard's safety margin for a lease of ttl, as SAFETY.md
// states it: m = T/100 + 30 ms. The guard stops vouching for its lease at
// t_s + T − m.
func margin(ttl time.Duration) time.Duration { return ttl/100 + 30*time.Millisecond }

// testLogger logs through t at debug level.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// connect returns a client of lib for the single node srv, closed when
// the test ends.
func connect(t *testing.T, lib Library, srv *redistest.Server) Client {
	t.Helper()
	return lib.Connect(t, Target{Addr: srv.Addr()})
}

// throughProxy returns a fault proxy in front of srv and a client of lib
// that reaches srv through it alone.
func throughProxy(t *testing.T, lib Library, srv *redistest.Server) (*faultproxy.Proxy, Client) {
	t.Helper()
	proxy := faultproxy.New(t, srv.Addr())
	return proxy, lib.Connect(t, Target{Addr: proxy.Addr()})
}

// withoutPubSub makes srv refuse pub/sub to a user of its own, and returns
// the target of a client that logs in as that user.
func withoutPubSub(t *testing.T, srv *redistest.Server) Target {
	t.Helper()
	srv.MustDo("ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-@pubsub")
	return Target{Addr: srv.Addr(), Username: "app", Password: "secret"}
}

func newMutex(t *testing.T, c Client, name string, opts ...distlock.Option) *distlock.Mutex {
	t.Helper()
	m, err := c.NewMutex(name, opts...)
	require.NoError(t, err)
	return m
}

func newSemaphore(t *testing.T, c Client, name string, permits int, opts ...distlock.Option) *distlock.Semaphore {
	t.Helper()
	s, err := c.NewSemaphore(name, permits, opts...)
	require.NoError(t, err)
	return s
}

func newElection(t *testing.T, c Client, name string, opts ...distlock.Option) *distlock.Election {
	t.Helper()
	e, err := c.NewElection(name, opts...)
	require.NoError(t, err)
	return e
}

func newRWMutex(t *testing.T, c Client, name string, opts ...distlock.Option) *distlock.RWMutex {
	t.Helper()
	rw, err := c.NewRWMutex(name, opts...)
	require.NoError(t, err)
	return rw
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

// lapsedDeleteTimedOut reports whether err, from the release of a Lost
// guard, says only that its best-effort delete got no answer in the short
// time it has once the lease has lapsed.
func lapsedDeleteTimedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, distlock.ErrNoReply) ||
		strings.Contains(err.Error(), "no answer from Redis before the lease ended")
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

// waitDeadlineMoves waits until g's deadline is later than d: a renewal
// sent after the one that set d was confirmed.
func waitDeadlineMoves(t *testing.T, g *distlock.Guard, d time.Time, within time.Duration, what string) {
	t.Helper()
	require.Eventually(t, func() bool { return g.Deadline().After(d) }, within, time.Millisecond, what)
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

// leaseExpiry returns the moment at which Redis expires key, as a time of
// this process's clock, or false if key has no expiry (or does not
// exist). PEXPIRETIME is the absolute Unix time in milliseconds; Redis
// deletes the key once its clock's milliseconds are past it, so the key
// cannot expire before. Redis runs on this machine, on this wall clock.
//
// A server without PEXPIRETIME (Redis 6.2) cannot tell the moment exactly
// (PTTL is counted from a moment of the server's that the test cannot
// know to the millisecond), and the tests that measure against it compare
// to the millisecond: leaseExpiry skips the test there, saying why.
func leaseExpiry(t *testing.T, srv *redistest.Server, key string) (time.Time, bool) {
	t.Helper()
	srv.SkipUnless(t, redistest.ExpireTime)
	ms, err := srv.MustDo("PEXPIRETIME", key).ToInt64()
	require.NoError(t, err)
	if ms < 0 {
		return time.Time{}, false
	}
	now := time.Now()
	return now.Add(time.UnixMilli(ms).Sub(now.Round(0))), true
}

// outcome is what an acquisition in the background returned, and when.
type outcome struct {
	g   *distlock.Guard
	err error
	at  time.Time
}

// Outcome is outcome, for the root package's tests, which wait on
// Async's channel too.
type Outcome = outcome

// Guard, Err and At give the root package's tests, which share lockAsync
// and await (as LockAsync and Await), the outcome's parts.
func (o outcome) Guard() *distlock.Guard { return o.g }
func (o outcome) Err() error             { return o.err }
func (o outcome) At() time.Time          { return o.at }

// async runs acquire(ctx) (a Lock, an Acquire, a Campaign, an RLock) in
// the background. The test waits for the result (or the goroutine) before
// it ends.
func async(t *testing.T, ctx context.Context, acquire func(context.Context) (*distlock.Guard, error)) <-chan outcome {
	t.Helper()
	ch := make(chan outcome, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		g, err := acquire(ctx)
		ch <- outcome{g: g, err: err, at: time.Now()}
	})
	t.Cleanup(wg.Wait)
	return ch
}

// lockAsync runs m.Lock(ctx) in the background.
func lockAsync(t *testing.T, ctx context.Context, m *distlock.Mutex) <-chan outcome {
	t.Helper()
	return async(t, ctx, m.Lock)
}

// lockRetrying runs m.Lock(ctx) in the background until it acquires or ctx
// ends: a Redis error ends Lock's wait (during an outage, say), and an
// application would ask again, as this does at once. The count of failed
// calls is in failed once the outcome is out.
func lockRetrying(t *testing.T, ctx context.Context, m *distlock.Mutex, failed *atomic.Int64) <-chan outcome {
	t.Helper()
	return async(t, ctx, func(ctx context.Context) (*distlock.Guard, error) {
		for {
			g, err := m.Lock(ctx)
			if err == nil || ctx.Err() != nil {
				return g, err
			}
			failed.Add(1)
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
}

// await returns the outcome, failing the test if it takes longer than
// within plus the scheduling delay a probe measured meanwhile (waitUntil).
func await(t *testing.T, ch <-chan outcome, within time.Duration, what string) outcome {
	t.Helper()
	var o outcome
	waitUntil(t, within, func() bool {
		select {
		case o = <-ch:
			return true
		default:
			return false
		}
	}, func() string { return what + ": no result" })
	return o
}

// notYet checks that ch has no outcome now.
func notYet(t *testing.T, ch <-chan outcome, what string) {
	t.Helper()
	select {
	case o := <-ch:
		t.Fatalf("%s: returned early: %+v", what, o)
	default:
	}
}

// inLine returns how many waiters stand in the line of the lock at key.
func inLine(t *testing.T, srv *redistest.Server, key string) int64 {
	t.Helper()
	n, err := srv.MustDo("ZCARD", key+":queue").ToInt64()
	require.NoError(t, err)
	return n
}

// waitInLine waits until n waiters stand in the line of the lock at key.
func waitInLine(t *testing.T, srv *redistest.Server, key string, n int64) {
	t.Helper()
	waitUntil(t, eventually, func() bool { return inLine(t, srv, key) == n }, func() string {
		return fmt.Sprintf("waiting for %d in line at %s: %d there", n, key, inLine(t, srv, key))
	})
}

// wakeChannels returns the wake channels of the lock at key that have a
// subscriber, of the kind that distlock subscribes to on srv (see
// subscribedChannels).
func wakeChannels(t *testing.T, srv *redistest.Server, key string) []string {
	t.Helper()
	return subscribedChannels(t, srv, key+":wake:*")
}

// subscribedChannels returns the channels matching pattern that have a
// subscriber on srv, of the kind distlock uses there: sharded channels
// (PUBSUB SHARDCHANNELS) on a server with sharded pub/sub, plain ones
// (PUBSUB CHANNELS) on one without (Redis 6.2), where distlock's waiters
// fall back to SUBSCRIBE and its scripts to PUBLISH. So a test that waits
// for a waiter's subscription checks, on each server, that distlock took
// the kind it should.
func subscribedChannels(t *testing.T, srv *redistest.Server, pattern string) []string {
	t.Helper()
	chans, err := srv.MustDo("PUBSUB", pubsubKind(srv, "CHANNELS"), pattern).AsStrSlice()
	require.NoError(t, err)
	return chans
}

// pubsubKind returns the PUBSUB subcommand sub (CHANNELS, NUMSUB) of the
// kind of channel distlock uses on srv: its SHARD form where srv has
// sharded pub/sub.
func pubsubKind(srv *redistest.Server, sub string) string {
	if srv.Has(redistest.ShardedPubSub) {
		return "SHARD" + sub
	}
	return sub
}

// subscribers returns how many subscriptions srv has to channel, of the
// kind distlock uses there (PUBSUB SHARDNUMSUB, or NUMSUB on a server
// without sharded pub/sub; see subscribedChannels).
func subscribers(t *testing.T, srv *redistest.Server, channel string) int64 {
	t.Helper()
	sub := pubsubKind(srv, "NUMSUB")
	arr, err := srv.MustDo("PUBSUB", sub, channel).ToArray()
	require.NoError(t, err)
	require.Len(t, arr, 2, "PUBSUB %s %s", sub, channel)
	n, err := arr[1].AsInt64()
	require.NoError(t, err)
	return n
}

// waitSubscribed waits until the lock at key has n wake channels with a
// subscriber.
func waitSubscribed(t *testing.T, srv *redistest.Server, key string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return len(wakeChannels(t, srv, key)) == n }, eventually, pollEvery,
		"waiting for %d subscribed rooms of %s", n, key)
}

// waitWatched waits until the restart watch of the client that holds key
// has subscribed (on rueidis it does once a guard has lived 100 ms, and
// its first confirmation has every guard renew, and a probe ask), so that
// a quiet window opened a few round trips later counts none of it.
func waitWatched(t *testing.T, srv *redistest.Server, key string) {
	t.Helper()
	require.Eventually(t, func() bool { return len(subscribedChannels(t, srv, key+":keeper:*")) > 0 }, eventually, pollEvery,
		"waiting for the restart watch of %s's holder", key)
}

// exists reports whether key exists.
func exists(t *testing.T, srv *redistest.Server, key string) bool {
	t.Helper()
	n, err := srv.MustDo("EXISTS", key).ToInt64()
	require.NoError(t, err)
	return n == 1
}

// requireNothingLeft checks W5: once every waiter has left and the rooms
// have lingered, the lock leaves no line, no subscription and (where the
// library lets the test count them) no room.
func requireNothingLeft(t *testing.T, lib Library, srv *redistest.Server, key string) {
	t.Helper()
	rooms := func() int {
		if lib.Rooms == nil {
			return 0
		}
		return lib.Rooms(key)
	}
	left := func() bool {
		return exists(t, srv, key+":queue") || exists(t, srv, key+":waiters") ||
			len(wakeChannels(t, srv, key)) > 0 || rooms() > 0
	}
	waitUntil(t, eventually, func() bool { return !left() }, func() string {
		return fmt.Sprintf("W5: left behind: queue %v, waiters %v, subscriptions %v, rooms %d",
			exists(t, srv, key+":queue"), exists(t, srv, key+":waiters"), wakeChannels(t, srv, key), rooms())
	})
}

// cpuTime returns the CPU time this process has used.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// commandStats returns INFO commandstats of srv: calls per command.
func commandStats(t *testing.T, srv *redistest.Server) map[string]int64 {
	t.Helper()
	info, err := srv.MustDo("INFO", "commandstats").ToString()
	require.NoError(t, err)
	calls := map[string]int64{}
	for line := range strings.SplitSeq(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		n, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
		c, err := strconv.ParseInt(n, 10, 64)
		require.NoError(t, err, "parsing %q", line)
		calls[strings.TrimPrefix(name, "cmdstat_")] = c
	}
	return calls
}

// sentCommands are the commands distlock sends for a lock: its scripts
// and its (un)subscriptions. Redis counts the calls that scripts make
// inside as commands too, and the tests' own admin connections send
// HELLO, CLIENT and INFO, so a plain total would count neither what the
// waiter sent nor only that. A client library's keep-alive PINGs (rueidis
// pings every idle connection of every client in the test) are not the
// waiter's and are left out.
var sentCommands = []string{"evalsha", "eval", "ssubscribe", "sunsubscribe", "subscribe", "unsubscribe"}

// scriptsRun returns how many scripts srv has run: every command distlock
// sends for a lock is one.
func scriptsRun(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	stats := commandStats(t, srv)
	return stats["evalsha"] + stats["eval"]
}

// quietWindow is how long the tests of W4 watch a waiter: eight refreshes
// of the default claim window.
const quietWindow = 2 * time.Second

// requireQuiet watches the process and srv for quietWindow while waiters
// sleep, and checks W4: no CPU to speak of, and a refresh every half claim
// window (plus three commands to spare for what a (re)subscription can add
// as the window opens: the SSUBSCRIBE, the waiter's call when its room's
// subscription is confirmed). Polling would send one every 50ms, and the
// spinning this replaced used 60% of a core. The commands are counted by
// Redis, of every client of srv (see sentCommands).
func requireQuiet(t *testing.T, srv *redistest.Server, what string) {
	t.Helper()
	requireQuietBut(t, srv, what, 0)
}

// requireQuietBut is requireQuiet allowing extra commands more, which the
// caller names.
func requireQuietBut(t *testing.T, srv *redistest.Server, what string, extra int64) {
	t.Helper()
	before, cpu := commandStats(t, srv), cpuTime(t)
	time.Sleep(quietWindow)
	after, cpu := commandStats(t, srv), cpuTime(t)-cpu
	var cmds int64
	sent := map[string]int64{}
	for _, c := range sentCommands {
		if n := after[c] - before[c]; n > 0 {
			sent[c] = n
			cmds += n
		}
	}
	t.Logf("%s: %d commands %v and %v of CPU in %v", what, cmds, sent, cpu, quietWindow)
	assert.LessOrEqual(t, cmds, int64(quietWindow/(distlock.DefaultClaimWindow/2))+3+extra, "%s: commands while waiting", what)
	assert.Less(t, cpu, quietWindow/5, "%s: CPU while waiting", what)
}

// srvMillis returns the server's clock in ms.
func srvMillis(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	tm, err := srv.MustDo("TIME").AsStrSlice()
	require.NoError(t, err)
	sec, err1 := strconv.ParseInt(tm[0], 10, 64)
	usec, err2 := strconv.ParseInt(tm[1], 10, 64)
	require.NoError(t, err1)
	require.NoError(t, err2)
	return sec*1000 + usec/1000
}

// keysOn returns the keys matching pattern on node n alone, whatever slots
// it serves (KEYS is never redirected). It reports errors to t, which may
// be a subtest of the one that started the node.
func keysOn(t *testing.T, n *redistest.Server, pattern string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), eventually)
	defer cancel()
	msg, err := n.Do(ctx, "KEYS", pattern)
	require.NoError(t, err, "KEYS %s on %s", pattern, n.Addr())
	keys, err := msg.AsStrSlice()
	require.NoError(t, err)
	return keys
}

// checkContention has workers goroutines take the lock key rounds times each
// (polling every millisecond), through clients from client, and checks that
// no two ever hold it at once, that a counter updated under the lock loses
// no update, and that tokens strictly increase in grant order.
func checkContention(t *testing.T, client func(w int) Client, key string, workers, rounds int) {
	t.Helper()
	var (
		inside  atomic.Int32
		counter int // updated under the lock only, without atomics: -race checks it
		mu      sync.Mutex
		tokens  []int64
	)
	var wg sync.WaitGroup
	for w := range workers {
		m := newMutex(t, client(w), key, distlock.WithOwner(fmt.Sprint("w", w)),
			distlock.WithTTL(time.Second), distlock.WithRetryInterval(time.Millisecond))
		wg.Go(func() {
			for range rounds {
				g, err := m.Lock(t.Context())
				if !assert.NoError(t, err) {
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders at once", n)
				}
				mu.Lock()
				tokens = append(tokens, g.Token())
				mu.Unlock()
				counter++
				inside.Add(-1)
				assert.Equal(t, distlock.Released, release(t, g))
			}
		})
	}
	wg.Wait()
	assert.Equal(t, workers*rounds, counter)
	require.Len(t, tokens, workers*rounds)
	// Tokens were recorded in grant order (the lock serialises the appends).
	for i := 1; i < len(tokens); i++ {
		require.Greater(t, tokens[i], tokens[i-1], "token %d not above token %d", i, i-1)
	}
}

// renewWatch is an Observer that records, with the time it heard of them,
// the guard's renewals and transitions.
type renewWatch struct {
	mu          sync.Mutex
	renewed     []time.Time    // confirmed renewals
	failed      []error        // renewals that failed
	latency     time.Duration  // the slowest renewal, failed or not
	spans       [][2]time.Time // when each renewal was sent and answered
	transitions []distlock.TransitionInfo
}

func (w *renewWatch) ObserveAcquire(distlock.AcquireInfo) {}

func (w *renewWatch) ObserveRenew(i distlock.RenewInfo) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.latency = max(w.latency, i.Latency)
	// A batched confirmation may be reported a renewal period after its
	// answer: the span is the one the library measured.
	answered := i.Sent.Add(i.Latency)
	w.spans = append(w.spans, [2]time.Time{i.Sent, answered})
	if i.Err != nil {
		w.failed = append(w.failed, i.Err)
		return
	}
	w.renewed = append(w.renewed, answered)
}

func (w *renewWatch) ObserveTransition(i distlock.TransitionInfo) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.transitions = append(w.transitions, i)
}

// slowest returns the latency of the slowest renewal so far.
func (w *renewWatch) slowest() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.latency
}

// inFlightAt reports whether a renewal was sent before at and answered
// after it.
func (w *renewWatch) inFlightAt(at time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.spans {
		if s[0].Before(at) && s[1].After(at) {
			return true
		}
	}
	return false
}

// counts returns how many renewals were confirmed and failed, and how many
// transitions to Lost there were.
func (w *renewWatch) counts() (renewed, failed, lost int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, tr := range w.transitions {
		if tr.To == distlock.Lost {
			lost++
		}
	}
	return len(w.renewed), len(w.failed), lost
}
