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
	code, out, errOut := runDistlock(t, append([]string{"inspect", "--redis", srv.URL(), "--json"}, args...)...)
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
	if strings.Contains(out, "  held by ") {
		state = "held"
	}
	assert.Equal(t, inspectStatus(t, state), code, "the exit status of %q; stderr: %s", out, errOut)
	return out
}

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

	// Released: free, and the last token stays.
	releaseGuard(t, g)
	assert.Equal(t, fmt.Sprintf("distlock:{job}  free  last token %d\n", g.Token()), inspectText(t, srv, "job"))
	s = inspectJSON(t, srv, "job")
	assert.Equal(t, "free", s.State)
	assert.Nil(t, s.ExpiresInMS)
	assert.Equal(t, g.Token(), s.LastToken)

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
