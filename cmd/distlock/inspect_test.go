package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// inspectJSON runs "distlock inspect --json" and decodes its line. It
// checks that the exit status matches the state: exitHeld or exitFree.
func inspectJSON(t *testing.T, srv *redistest.Server, args ...string) lockState {
	t.Helper()
	return inspectJSONAt(t, srv.URL(), args...)
}

// inspectJSONAt is inspectJSON for the Redis at url.
func inspectJSONAt(t *testing.T, url string, args ...string) lockState {
	t.Helper()
	code, out, errOut := runDistlock(t, append([]string{"inspect", "--redis", url, "--json"}, args...)...)
	var s lockState
	require.NoError(t, json.Unmarshal([]byte(out), &s), "output: %s; stderr: %s", out, errOut)
	assert.Equal(t, inspectStatus(t, s.State), code, "the exit status of a %s lock; stderr: %s", s.State, errOut)
	return s
}

// inspectText runs "distlock inspect" and returns its output. It checks
// that the exit status matches the state the output shows.
func inspectText(t *testing.T, srv *redistest.Server, args ...string) string {
	t.Helper()
	code, out, errOut := runDistlock(t, append([]string{"inspect", "--redis", srv.URL()}, args...)...)
	state := "free"
	if heldText.MatchString(out) {
		state = "held"
	}
	assert.Equal(t, inspectStatus(t, state), code, "the exit status of %q; stderr: %s", out, errOut)
	return out
}

// heldText matches what inspect prints for a held lock, semaphore or
// election.
var heldText = regexp.MustCompile(`^\S+  (held by |semaphore held by \d+: |election led by )`)

// inspectStatus is the exit status that inspect documents for state.
func inspectStatus(t *testing.T, state string) int {
	t.Helper()
	switch state {
	case "held":
		return exitHeld
	case "free":
		return exitFree
	}
	t.Fatalf("inspect printed state %q", state)
	return -1
}

// lockFor acquires key through the library, as another process would.
func lockFor(t *testing.T, srv *redistest.Server, key, owner string, ttl time.Duration) *distlock.Guard {
	t.Helper()
	m, err := distlock.NewMutex(srv.Client(), key, distlock.WithOwner(owner), distlock.WithTTL(ttl))
	require.NoError(t, err)
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = g.Release(context.Background()) })
	return g
}

func releaseGuard(t *testing.T, g *distlock.Guard) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()
	st, err := g.Release(ctx)
	require.NoError(t, err)
	require.Equal(t, distlock.Released, st)
}

func TestInspect(t *testing.T) {
	srv := redistest.Start(t)

	// Never acquired.
	assert.Equal(t, "distlock:{job}  free  no token issued\n", inspectText(t, srv, "job"))
	s := inspectJSON(t, srv, "job")
	assert.Equal(t, lockState{Time: s.Time, Key: "distlock:{job}", State: "free"}, s)
	assert.WithinDuration(t, time.Now(), s.Time, eventually)

	// Held.
	const ttl = 5 * time.Second
	g := lockFor(t, srv, "job", "inspector:42", ttl)
	out := inspectText(t, srv, "job")
	assert.Regexp(t, `^distlock:\{job\}  held by inspector:42  expires in \d+(\.\d+)?m?s  last token \d+\n$`, out)
	assert.Contains(t, out, fmt.Sprintf("last token %d\n", g.Token()))
	s = inspectJSON(t, srv, "job")
	assert.Equal(t, "held", s.State)
	assert.Equal(t, "inspector:42", s.Owner)
	assert.True(t, strings.HasPrefix(s.Value, "inspector:42#"), "value %q", s.Value)
	require.NotNil(t, s.ExpiresInMS)
	assert.Greater(t, *s.ExpiresInMS, int64(0))
	assert.LessOrEqual(t, *s.ExpiresInMS, ttl.Milliseconds())
	assert.Equal(t, g.Token(), s.LastToken)
	assert.Zero(t, s.Waiting)

	// Two waiters in line, named first in line first.
	ctx, cancel := context.WithCancel(t.Context())
	var waiters sync.WaitGroup
	for i, owner := range []string{"first:1", "second:2"} {
		m, err := distlock.NewMutex(srv.Client(), "job", distlock.WithOwner(owner))
		require.NoError(t, err)
		waiters.Go(func() { _, _ = m.Lock(ctx) })
		require.Eventually(t, func() bool { return inspectJSON(t, srv, "job").Waiting == i+1 }, eventually, 10*time.Millisecond)
	}
	s = inspectJSON(t, srv, "job")
	assert.Equal(t, 2, s.Waiting)
	assert.Equal(t, []string{"first:1", "second:2"}, s.Waiters)
	assert.Contains(t, inspectText(t, srv, "job"), "  2 waiting: first:1, second:2\n")
	cancel()
	waiters.Wait()
	require.Eventually(t, func() bool { return inspectJSON(t, srv, "job").Waiting == 0 }, eventually, 10*time.Millisecond)

	// Another namespace is another lock.
	assert.Equal(t, "jobs:{job}  free  no token issued\n", inspectText(t, srv, "--namespace", "jobs", "job"))

	// Released: free, and the last token stays. The two waiters that gave
	// up left their void markers, for one TTL (the default, 30 s).
	releaseGuard(t, g)
	assert.Regexp(t, fmt.Sprintf(`^distlock:\{job\}  free  last token %d  2 void: (first:1|second:2) \(\d+(\.\d+)?s left\), (first:1|second:2) \(\d+(\.\d+)?s left\)\n$`, g.Token()),
		inspectText(t, srv, "job"))
	s = inspectJSON(t, srv, "job")
	assert.Equal(t, "free", s.State)
	assert.Nil(t, s.ExpiresInMS)
	assert.Equal(t, g.Token(), s.LastToken)
	assert.Equal(t, 2, s.Voided)
	assert.ElementsMatch(t, []string{"first:1", "second:2"}, []string{s.Voids[0].Owner, s.Voids[1].Owner})

	// Set by hand, without expiry.
	srv.MustDo("SET", "distlock:{manual}", "an operator")
	assert.Equal(t, "distlock:{manual}  held by an operator  with no expiry (not written by distlock)  no token issued\n",
		inspectText(t, srv, "manual"))
	s = inspectJSON(t, srv, "manual")
	require.NotNil(t, s.ExpiresInMS)
	assert.Equal(t, int64(-1), *s.ExpiresInMS)
	assert.Equal(t, "an operator", s.Owner)

	// A fencing key that does not hold a token is an error, not a guess.
	srv.MustDo("SET", "distlock:{odd}:fence", "soon")
	code, _, errOut := runDistlock(t, "inspect", "--redis", srv.URL(), "odd")
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, errOut, `holds "soon", not a token`)
}

// jsonLines decodes the JSON lines written so far.
func jsonLines(t *testing.T, out string) []lockState {
	t.Helper()
	var states []lockState
	for line := range strings.Lines(out) {
		var s lockState
		require.NoError(t, json.Unmarshal([]byte(line), &s), "line %q", line)
		states = append(states, s)
	}
	return states
}

func TestInspectWatch(t *testing.T) {
	srv := redistest.Start(t)
	const interval = 20 * time.Millisecond
	p := start(t, nil, "inspect", "--redis", srv.URL(), "--watch", "--json", "--interval", interval.String(), "job")
	text := start(t, nil, "inspect", "--redis", srv.URL(), "--watch", "--interval", interval.String(), "job")

	states := func(n int) []lockState {
		t.Helper()
		require.Eventually(t, func() bool { return len(jsonLines(t, p.stdout.String())) >= n }, eventually, pollEvery,
			"the watch printed fewer than %d lines:\n%s", n, &p.stdout)
		return jsonLines(t, p.stdout.String())
	}
	assert.Equal(t, "free", states(1)[0].State)
	require.Eventually(t, func() bool { return strings.Contains(text.stdout.String(), "\n") }, eventually, pollEvery)

	g := lockFor(t, srv, "job", "watched", 300*time.Millisecond)
	held := states(2)[1]
	assert.Equal(t, "held", held.State)
	assert.Equal(t, "watched", held.Owner)
	assert.Equal(t, g.Token(), held.LastToken)
	// Let the lease be renewed a few times while the watch looks: its
	// countdown changes, but that is not a change worth a line.
	time.Sleep(300 * time.Millisecond)
	releaseGuard(t, g)
	free := states(3)[2]
	assert.Equal(t, "free", free.State)
	assert.Equal(t, g.Token(), free.LastToken)

	p.signal(t, syscall.SIGINT)
	assert.Equal(t, exitOK, p.wait(t), "an interrupted watch; stderr: %s", &p.stderr)
	assert.Len(t, jsonLines(t, p.stdout.String()), 3, "the watch printed lines without a change:\n%s", &p.stdout)

	// The human form: a time, then what inspect prints.
	require.Eventually(t, func() bool { return strings.Count(text.stdout.String(), "\n") >= 3 }, eventually, pollEvery)
	text.signal(t, syscall.SIGTERM)
	assert.Equal(t, exitOK, text.wait(t))
	lines := strings.Split(strings.TrimSuffix(text.stdout.String(), "\n"), "\n")
	require.Len(t, lines, 3, "output:\n%s", &text.stdout)
	stamp := `^\d\d:\d\d:\d\d\.\d\d\d  distlock:\{job\}  `
	assert.Regexp(t, regexp.MustCompile(stamp+`free  (no token issued|last token \d+)$`), lines[0])
	assert.Regexp(t, regexp.MustCompile(stamp+`held by watched  expires in .*  last token \d+$`), lines[1])
	assert.Regexp(t, regexp.MustCompile(stamp+fmt.Sprintf(`free  last token %d$`, g.Token())), lines[2])
}

// acquireFor takes a permit of the semaphore key of permits permits, as
// another process would.
func acquireFor(t *testing.T, srv *redistest.Server, key string, permits int, owner string, ttl time.Duration) *distlock.Guard {
	t.Helper()
	s, err := distlock.NewSemaphore(srv.Client(), key, permits, distlock.WithOwner(owner), distlock.WithTTL(ttl))
	require.NoError(t, err)
	g, err := s.Acquire(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = g.Release(context.Background()) })
	return g
}

// owners returns the owners of the holders that inspect named.
func owners(s lockState) []string {
	var o []string
	for _, h := range s.Holders {
		o = append(o, h.Owner)
	}
	return o
}

func TestInspectSemaphore(t *testing.T) {
	srv := redistest.Start(t)
	const ttl = 5 * time.Second
	g1 := acquireFor(t, srv, "pool", 2, "w-1", ttl)
	g2 := acquireFor(t, srv, "pool", 2, "w-2", ttl)

	// All permits held, and one waits for a permit.
	ctx, cancel := context.WithCancel(t.Context())
	waiter, err := distlock.NewSemaphore(srv.Client(), "pool", 2, distlock.WithOwner("w-3"))
	require.NoError(t, err)
	var waiting sync.WaitGroup
	waiting.Go(func() { _, _ = waiter.Acquire(ctx) })
	require.Eventually(t, func() bool { return inspectJSON(t, srv, "pool").Waiting == 1 }, eventually, pollEvery)

	s := inspectJSON(t, srv, "pool")
	assert.Equal(t, "held", s.State)
	assert.Equal(t, "semaphore", s.Kind)
	assert.Equal(t, 2, s.Holding)
	assert.ElementsMatch(t, []string{"w-1", "w-2"}, owners(s))
	for _, h := range s.Holders {
		assert.True(t, strings.HasPrefix(h.Value, h.Owner+"#"), "value %q", h.Value)
		assert.Positive(t, h.ExpiresInMS, "the lease of %s", h.Owner)
		assert.LessOrEqual(t, h.ExpiresInMS, ttl.Milliseconds(), "the lease of %s", h.Owner)
	}
	assert.Equal(t, 2, s.Permits)
	require.NotNil(t, s.FreePermits)
	assert.Equal(t, 0, *s.FreePermits)
	assert.Equal(t, max(g1.Token(), g2.Token()), s.LastToken, "the last token is the last grant's")
	assert.Equal(t, []string{"w-3"}, s.Waiters)
	assert.Empty(t, s.Owner, "a semaphore has holders, not an owner")
	assert.Nil(t, s.ExpiresInMS)
	assert.Regexp(t, fmt.Sprintf(`^distlock:\{pool\}  semaphore held by 2: w-[12] \(expires in [^)]+s\), w-[12] \(expires in [^)]+s\)  `+
		`permits: 2 \(as of the last grant\), 0 free  last token %d  1 waiting: w-3\n$`, s.LastToken),
		inspectText(t, srv, "pool"))
	cancel()
	waiting.Wait()
	require.Eventually(t, func() bool { return inspectJSON(t, srv, "pool").Waiting == 0 }, eventually, pollEvery)

	// One released: one permit free, still held.
	releaseGuard(t, g1)
	s = inspectJSON(t, srv, "pool")
	assert.Equal(t, "held", s.State)
	assert.Equal(t, []string{"w-2"}, owners(s))
	require.NotNil(t, s.FreePermits)
	assert.Equal(t, 1, *s.FreePermits)
	assert.Contains(t, inspectText(t, srv, "pool"), "  semaphore held by 1: w-2 (expires in ")

	// Both released: free (exit 1), but still known as a semaphore, with
	// its permits and last token.
	// The waiter that gave up above left its void marker.
	releaseGuard(t, g2)
	assert.Regexp(t, fmt.Sprintf(`^distlock:\{pool\}  semaphore free  permits: 2 \(as of the last grant\), 2 free  last token %d  1 void: w-3 \([^)]+ left\)\n$`, g2.Token()),
		inspectText(t, srv, "pool"))
	s = inspectJSON(t, srv, "pool")
	assert.Equal(t, lockState{Time: s.Time, Key: "distlock:{pool}", State: "free", Kind: "semaphore",
		Permits: 2, FreePermits: s.FreePermits, LastToken: g2.Token(), Voided: 1, Voids: s.Voids}, s)
	if assert.Len(t, s.Voids, 1) {
		assert.Equal(t, "w-3", s.Voids[0].Owner)
	}

	// More holders than inspect names; and the record of the permits gone.
	const many = maxNamedHolders + 2
	for i := range many {
		acquireFor(t, srv, "crowd", many, fmt.Sprintf("c-%d", i), ttl)
	}
	srv.MustDo("DEL", "distlock:{crowd}:permits")
	s = inspectJSON(t, srv, "crowd")
	assert.Equal(t, many, s.Holding)
	assert.Len(t, s.Holders, maxNamedHolders)
	assert.Zero(t, s.Permits, "permits unknown")
	assert.Nil(t, s.FreePermits, "free permits unknown")
	assert.Regexp(t, `^distlock:\{crowd\}  semaphore held by 12: (c-\d+ \(expires in [^)]+\), ){9}c-\d+ \(expires in [^)]+\), `+
		`and 2 more  permits: unknown  last token \d+\n$`, inspectText(t, srv, "crowd"))
}

func TestInspectElection(t *testing.T) {
	srv := redistest.Start(t)
	const ttl = 5 * time.Second
	e, err := distlock.NewElection(srv.Client(), "boss", distlock.WithTTL(ttl))
	require.NoError(t, err)

	// Nobody campaigns, nobody observes: a free key like any other.
	assert.Equal(t, "distlock:{boss}  free  no token issued\n", inspectText(t, srv, "boss"))

	// Observed, without a leader.
	observing, stopObserving := context.WithCancel(t.Context())
	defer stopObserving()
	leaders := e.Observe(observing)
	require.Eventually(t, func() bool { return inspectJSON(t, srv, "boss").Observers == 1 }, eventually, pollEvery,
		"inspect never saw the observer")
	assert.Equal(t, "distlock:{boss}  election without a leader  no token issued  observers: 1\n", inspectText(t, srv, "boss"))
	s := inspectJSON(t, srv, "boss")
	assert.Equal(t, lockState{Time: s.Time, Key: "distlock:{boss}", State: "free", Kind: "election", Observers: 1}, s)

	// A leader, and a candidate in line behind it.
	g, err := e.Campaign(t.Context(), "node-1:8080")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = g.Release(context.Background()) })
	awaitLeader(t, leaders, "node-1:8080")
	campaigning, stopCampaign := context.WithCancel(t.Context())
	var candidate sync.WaitGroup
	candidate.Go(func() {
		if g, err := e.Campaign(campaigning, "node-2:8080"); err == nil {
			_, _ = g.Release(context.Background())
		}
	})
	require.Eventually(t, func() bool { return inspectJSON(t, srv, "boss").Waiting == 1 }, eventually, pollEvery)

	s = inspectJSON(t, srv, "boss")
	assert.Equal(t, "held", s.State)
	assert.Equal(t, "election", s.Kind)
	assert.Equal(t, "node-1:8080", s.Owner)
	assert.True(t, strings.HasPrefix(s.Value, "node-1:8080#"), "value %q", s.Value)
	assert.Equal(t, g.Token(), s.LastToken, "the term token")
	require.NotNil(t, s.ExpiresInMS)
	assert.Positive(t, *s.ExpiresInMS)
	assert.LessOrEqual(t, *s.ExpiresInMS, ttl.Milliseconds())
	assert.Equal(t, 1, s.Observers)
	assert.Equal(t, []string{"node-2:8080"}, s.Waiters)
	assert.Regexp(t, fmt.Sprintf(`^distlock:\{boss\}  election led by node-1:8080  expires in [^ ]+s  term token %d  observers: 1  1 waiting: node-2:8080\n$`,
		g.Token()), inspectText(t, srv, "boss"))
	stopCampaign()
	candidate.Wait()

	// Nobody observes any more: an election then looks like a lock, and
	// inspect says no more than it knows.
	stopObserving()
	for range leaders { // closed once the observer has left
	}
	require.Eventually(t, func() bool { return inspectJSON(t, srv, "boss").Observers == 0 }, eventually, pollEvery)
	s = inspectJSON(t, srv, "boss")
	assert.Equal(t, "held", s.State)
	assert.Equal(t, "lock", s.Kind)
	// The candidate that stopped campaigning left its void marker.
	assert.Regexp(t, fmt.Sprintf(`^distlock:\{boss\}  held by node-1:8080  expires in [^ ]+s  last token %d  1 void: node-2:8080 \([^)]+ left\)\n$`, g.Token()),
		inspectText(t, srv, "boss"))

	// Resigned: free.
	releaseGuard(t, g)
	assert.Regexp(t, fmt.Sprintf(`^distlock:\{boss\}  free  last token %d  1 void: node-2:8080 \([^)]+ left\)\n$`, g.Token()), inspectText(t, srv, "boss"))
}

// awaitLeader waits until leaders delivers the leader value.
func awaitLeader(t *testing.T, leaders <-chan distlock.Leader, value string) {
	t.Helper()
	timeout := time.After(eventually)
	for {
		select {
		case l, ok := <-leaders:
			require.True(t, ok, "Observe's channel closed")
			if l.Value == value {
				return
			}
		case <-timeout:
			t.Fatalf("the observer never saw %q lead", value)
		}
	}
}

// A key that is not a lock, semaphore or election is an error (exit 125),
// not a guess; a semaphore without holders is free (exit 1).
func TestInspectExitCodes(t *testing.T) {
	srv := redistest.Start(t)
	srv.MustDo("HSET", "distlock:{odd}", "field", "value")
	code, out, errOut := runDistlock(t, "inspect", "--redis", srv.URL(), "odd")
	assert.Equal(t, exitFailed, code, "stdout: %s", out)
	assert.Contains(t, errOut, "distlock:{odd} holds a hash, not a lock, semaphore, election or rwmutex")

	g := acquireFor(t, srv, "pool", 3, "w", time.Second)
	code, _, errOut = runDistlock(t, "inspect", "--redis", srv.URL(), "pool")
	assert.Equal(t, exitHeld, code, "a semaphore with a holder; stderr: %s", errOut)
	releaseGuard(t, g)
	code, _, errOut = runDistlock(t, "inspect", "--redis", srv.URL(), "pool")
	assert.Equal(t, exitFree, code, "a semaphore without holders; stderr: %s", errOut)
	// A semaphore's permits whose leases ended are not held, although the
	// key may still list them until the next acquire or release.
	srv.MustDo("ZADD", "distlock:{pool}", "1", "gone#"+strings.Repeat("0", 36))
	code, out, errOut = runDistlock(t, "inspect", "--redis", srv.URL(), "pool")
	assert.Equal(t, exitFree, code, "stderr: %s", errOut)
	assert.Contains(t, out, "  semaphore free  permits: 3 (as of the last grant), 3 free")
}

// On a cluster, inspect reads each semaphore and election on the node that
// serves its slot, its observers included (PUBSUB SHARDNUMSUB counts only
// the subscribers of that node).
func TestInspectOnCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	addrs := cl.Addrs()
	url := "redis://" + addrs[0] + "?addr=" + addrs[1] + "&addr=" + addrs[2]
	client := cl.Client()
	const ttl = 5 * time.Second

	// One name in each third of the slots: one on each primary.
	var names []string
	for i := 0; len(names) < 3; i++ {
		name := fmt.Sprintf("n%d", i)
		if cl.Slot("{"+name+"}")*3/16384 == len(names) {
			names = append(names, name)
		}
	}
	for _, name := range names {
		var guards []*distlock.Guard
		for _, owner := range []string{"w-1", "w-2"} {
			sem, err := distlock.NewSemaphore(client, name, 3, distlock.WithOwner(owner), distlock.WithTTL(ttl))
			require.NoError(t, err)
			g, err := sem.Acquire(t.Context())
			require.NoError(t, err)
			guards = append(guards, g)
		}
		s := inspectJSONAt(t, url, name)
		assert.Equal(t, "semaphore", s.Kind, name)
		assert.ElementsMatch(t, []string{"w-1", "w-2"}, owners(s), name)
		assert.Equal(t, 3, s.Permits, name)
		require.NotNil(t, s.FreePermits, name)
		assert.Equal(t, 1, *s.FreePermits, name)
		assert.Equal(t, guards[1].Token(), s.LastToken, name)
		for _, g := range guards {
			releaseGuard(t, g)
		}
	}

	for _, name := range names {
		name := "e" + name // another key, in the same slot
		e, err := distlock.NewElection(client, name, distlock.WithTTL(ttl))
		require.NoError(t, err)
		ctx, stop := context.WithCancel(t.Context())
		leaders := e.Observe(ctx)
		g, err := e.Campaign(t.Context(), "leader-of-"+name)
		require.NoError(t, err)
		awaitLeader(t, leaders, "leader-of-"+name)
		require.Eventually(t, func() bool { return inspectJSONAt(t, url, name).Observers == 1 }, eventually, pollEvery,
			"inspect never saw the observer of %s", name)
		s := inspectJSONAt(t, url, name)
		assert.Equal(t, "election", s.Kind, name)
		assert.Equal(t, "leader-of-"+name, s.Owner, name)
		assert.Equal(t, g.Token(), s.LastToken, name)
		releaseGuard(t, g)
		stop()
		for range leaders { // closed once the observer has left
		}
	}
}
