package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// breakHandOff is how soon after "distlock break" exits the first waiter
// in line must hold the lock: the break passes the lease in the same
// step, and the waiter hears of it by pub/sub.
const breakHandOff = 500 * time.Millisecond

// frozenTTL is the lease of the holders the break tests freeze: long
// enough that no expiry can be mistaken for the break.
const frozenTTL = time.Hour

// breakArgs returns a "distlock break" command line for srv.
func breakArgs(srv *redistest.Server, args ...string) []string {
	return append([]string{"break", "--redis", srv.URL()}, args...)
}

// brokeValue reads the value of the holder that a line of break's output
// says it broke.
var brokeValue = regexp.MustCompile(`(?m)^broke \S+: held by \S+ \(value (\S+?)[,)]`)

// waitInLine waits until n stand in the line of keys.
func waitInLine(t *testing.T, lc *lease.Client, keys lease.Keys, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		l, err := lc.ReadLine(t.Context(), keys, 0)
		return err == nil && l.Waiting == n
	}, eventually, pollEvery, "%d never stood in the line of %s", n, keys.Lease)
}

// waiter is a Lock (or Acquire) of the library that waits in line in a
// goroutine of its own, so that a test can break the holder meanwhile.
type waiter struct {
	done chan struct{}
	g    *distlock.Guard
	err  error
	at   time.Time // when the call returned
}

// waitFor calls lock in a goroutine, which ends when it returns (at the
// latest when the test's context ends), and waits until the call stands
// in the line of keys.
func waitFor(t *testing.T, lc *lease.Client, keys lease.Keys, lock func(context.Context) (*distlock.Guard, error)) *waiter {
	t.Helper()
	w := &waiter{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.g, w.err = lock(t.Context())
		w.at = time.Now()
	}()
	waitInLine(t, lc, keys, 1)
	select {
	case <-w.done:
		t.Fatalf("the waiter got the lock before the break (err %v)", w.err)
	default:
	}
	return w
}

// heldAfter waits for w's grant and checks that it came within
// breakHandOff of broke, when the break exited; out is what it printed.
func (w *waiter) heldAfter(t *testing.T, broke time.Time, out string) *distlock.Guard {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(eventually):
		t.Fatalf("the waiter never got the lock; break said: %s", out)
	}
	require.NoError(t, w.err)
	assert.Less(t, w.at.Sub(broke), breakHandOff, "the waiter held the lock %v after the break exited", w.at.Sub(broke))
	return w.g
}

// A "distlock run" whose process is stopped (SIGSTOP) holds the lock with
// a long TTL, and another waits in line. "distlock break" exits 0, names
// the holder and its token; the waiter holds within breakHandOff with a
// larger token; the frozen holder's renewal is refused, and once resumed
// it stops its command and exits 76.
func TestBreakFrozenHolder(t *testing.T) {
	srv := redistest.Start(t)
	lc := lease.New(srv.Client())
	const key = "stuck"
	keys, err := lease.NewKeys(distlock.DefaultNamespace, key)
	require.NoError(t, err)
	dir := t.TempDir()

	// Renewed every 10 s: the frozen holder's next renewal comes within
	// exitWait of its resumption.
	a := start(t, nil, cmdline(runArgs(srv, "--ttl", "30s", key), childArgs(t, dir, "a")...)...)
	repA := waitReport(t, dir, "a")
	tokenA := token(t, repA)
	a.signal(t, syscall.SIGSTOP)
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_ = a.cmd.Process.Signal(syscall.SIGCONT)
		}
	})

	b := start(t, nil, cmdline(runArgs(srv, "-v", key), childArgs(t, dir, "b")...)...)
	waitInLine(t, lc, keys, 1)

	require.NotContains(t, b.stderr.String(), "acquired ", "the waiter got the lock before the break")
	asked := time.Now()
	code, out, errOut := runDistlock(t, breakArgs(srv, key)...)
	broke := time.Now()
	require.Equal(t, exitBroke, code, "break of a held lock; stdout: %s; stderr: %s", out, errOut)
	b.waitStderr(t, "acquired ")
	handOff := time.Since(broke)
	assert.Less(t, handOff, breakHandOff, "the waiter held the lock %v after the break exited", handOff)
	t.Logf("the waiter held the lock %v after the break exited, %v after it started", handOff, time.Since(asked))

	assert.Contains(t, out, fmt.Sprintf("held by %s (value %s#", repA.Owner, repA.Owner), "break should name the holder")
	assert.Contains(t, out, fmt.Sprintf("token %d", tokenA), "break should name the holder's token")
	ownerB := fmt.Sprintf("%s:%d", mustHostname(t), b.cmd.Process.Pid)
	assert.Contains(t, out, "passed to "+ownerB+" (token ", "break should name the new holder")
	repB := waitReport(t, dir, "b")
	assert.Greater(t, token(t, repB), tokenA, "the waiter's token")
	assert.Contains(t, out, fmt.Sprintf("passed to %s (token %d)", ownerB, token(t, repB)))

	// The frozen holder's next renewal is refused.
	m := brokeValue.FindStringSubmatch(out)
	require.NotNil(t, m, "break's output names no value: %s", out)
	ren, err := lc.Renew(t.Context(), keys, m[1], 30*time.Second)
	require.NoError(t, err)
	assert.False(t, ren.OK, "the broken holder's renewal was accepted")
	assert.Equal(t, ownerB, lease.Owner(ren.Holder), "the lease should hold the waiter's value")

	resumed = true
	a.signal(t, syscall.SIGCONT)
	assert.Equal(t, exitLost, a.wait(t), "the resumed holder; stderr: %s", &a.stderr)
	letExit(t, dir, "b")
	assert.Equal(t, 0, b.wait(t), "the waiter; stderr: %s", &b.stderr)
	assertFree(t, srv, key)
}

func mustHostname(t *testing.T) string {
	t.Helper()
	host, err := os.Hostname()
	require.NoError(t, err)
	return host
}

// A free lock, a lock released, a --holder that holds nothing: exit 1,
// nothing written.
func TestBreakNothing(t *testing.T) {
	srv := redistest.Start(t)

	code, out, errOut := runDistlock(t, breakArgs(srv, "never")...)
	assert.Equal(t, exitNothing, code, "stderr: %s", errOut)
	assert.Equal(t, "distlock:{never} is free: nothing to break\n", out)

	g := lockFor(t, srv, "done", "worker:1", 10*time.Second)
	releaseGuard(t, g)
	code, out, _ = runDistlock(t, breakArgs(srv, "done")...)
	assert.Equal(t, exitNothing, code)
	assert.Contains(t, out, "is free")

	g = lockFor(t, srv, "kept", "worker:2", 10*time.Second)
	code, out, _ = runDistlock(t, breakArgs(srv, "--holder", "worker:3", "kept")...)
	assert.Equal(t, exitNothing, code, "stdout: %s", out)
	assert.Contains(t, out, `no holder is "worker:3"`)
	assert.Equal(t, distlock.Acquired, g.State(), "a --holder that does not match broke the lock")
	releaseGuard(t, g)
}

// A key set by hand without an expiry is deleted; a key of another type
// is left alone with status 125.
func TestBreakForeignKeys(t *testing.T) {
	srv := redistest.Start(t)
	srv.MustDo("SET", leaseKey("manual"), "someone")
	code, out, errOut := runDistlock(t, breakArgs(srv, "manual")...)
	assert.Equal(t, exitBroke, code, "stderr: %s", errOut)
	assert.Contains(t, out, "broke distlock:{manual}: held by someone (value someone, without expiry); nobody was in line")
	assertFree(t, srv, "manual")

	srv.MustDo("RPUSH", leaseKey("list"), "x")
	code, _, errOut = runDistlock(t, breakArgs(srv, "list")...)
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, errOut, "distlock break: distlock:{list} holds a list, not a lock, semaphore or read-write lock")
	n, err := srv.MustDo("EXISTS", leaseKey("list")).AsInt64()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "break touched a key that distlock did not write")
}

// A semaphore of 2 permits, both held by frozen holders, and a waiter:
// --holder breaks one, whose permit the waiter gets at once with a larger
// token; a break without --holder breaks every holder.
func TestBreakSemaphore(t *testing.T) {
	srv := redistest.Start(t)
	lc := lease.New(srv.Client())
	const name = "pool"
	base, err := lease.NewKeys(distlock.DefaultNamespace, name)
	require.NoError(t, err)
	keys := base.Semaphore(2)
	frozen1, frozen2 := lease.NewValue("frozen:1"), lease.NewValue("frozen:2")
	for _, v := range []string{frozen1, frozen2} {
		gr, err := lc.Acquire(t.Context(), keys, v, frozenTTL)
		require.NoError(t, err)
		require.True(t, gr.Acquired)
	}
	snap, err := lc.Read(t.Context(), keys)
	require.NoError(t, err)
	lastToken := snap.Fence

	s, err := distlock.NewSemaphore(srv.Client(), name, 2, distlock.WithOwner("waiter:1"))
	require.NoError(t, err)
	w := waitFor(t, lc, keys, s.Acquire)

	code, out, errOut := runDistlock(t, breakArgs(srv, "--holder", "frozen:1", name)...)
	broke := time.Now()
	require.Equal(t, exitBroke, code, "stdout: %s; stderr: %s", out, errOut)
	assert.Contains(t, out, "held by frozen:1 (value "+frozen1+",")
	assert.NotContains(t, out, "frozen:2", "--holder frozen:1 broke another holder")
	assert.Contains(t, out, "passed to waiter:1 (token ")
	g := w.heldAfter(t, broke, out)
	assert.Greater(t, g.Token(), lastToken, "the waiter's token")
	ren, err := lc.Renew(t.Context(), keys, frozen1, frozenTTL)
	require.NoError(t, err)
	assert.False(t, ren.OK, "the broken holder's renewal was accepted")
	releaseGuard(t, g)

	code, out, _ = runDistlock(t, breakArgs(srv, name)...)
	assert.Equal(t, exitBroke, code, "stdout: %s", out)
	assert.Contains(t, out, "held by frozen:2 (value "+frozen2+",")
	assert.Contains(t, out, "nobody was in line")
	code, _, _ = runDistlock(t, breakArgs(srv, name)...)
	assert.Equal(t, exitNothing, code, "a semaphore without holders")
}

// Two frozen readers of a read-write lock and a writer in line: break
// ends both reads, names each reader's token, and the writer holds at once
// with a larger token.
func TestBreakRWMutex(t *testing.T) {
	srv := redistest.Start(t)
	lc := lease.New(srv.Client())
	const name = "config"
	keys, err := lease.NewKeys(distlock.DefaultNamespace, name)
	require.NoError(t, err)
	readers := []string{lease.NewValue("reader:1"), lease.NewValue("reader:2")}
	var tokens []int64
	for _, v := range readers {
		gr, err := lc.Acquire(t.Context(), keys.RW(lease.Read), v, frozenTTL)
		require.NoError(t, err)
		require.True(t, gr.Acquired)
		tokens = append(tokens, gr.Token)
	}

	rw, err := distlock.NewRWMutex(srv.Client(), name, distlock.WithOwner("writer:1"))
	require.NoError(t, err)
	w := waitFor(t, lc, keys, rw.Lock)

	code, out, errOut := runDistlock(t, breakArgs(srv, name)...)
	broke := time.Now()
	require.Equal(t, exitBroke, code, "stdout: %s; stderr: %s", out, errOut)
	for i, v := range readers {
		assert.Contains(t, out, fmt.Sprintf("held by %s (value %s, token %d,", lease.Owner(v), v, tokens[i]))
	}
	assert.Contains(t, out, "passed to writer:1 (token ", "the last reader's break passes the lock to the writer")
	g := w.heldAfter(t, broke, out)
	assert.Greater(t, g.Token(), max(tokens[0], tokens[1]), "the writer's token")
	releaseGuard(t, g)
}

// An election's leader that is frozen, a candidate in line and an
// observer: break passes the lock to the candidate, and announces it, so
// that the observer sees the new leader at once rather than when the old
// lease would have ended.
func TestBreakElection(t *testing.T) {
	srv := redistest.Start(t)
	lc := lease.New(srv.Client())
	const name = "boss"
	keys, err := lease.NewKeys(distlock.DefaultNamespace, name)
	require.NoError(t, err)
	frozen := lease.NewValue("node-1")
	gr, err := lc.Acquire(t.Context(), keys.Election(), frozen, frozenTTL)
	require.NoError(t, err)
	require.True(t, gr.Acquired)

	e, err := distlock.NewElection(srv.Client(), name)
	require.NoError(t, err)
	observing, stopObserving := context.WithCancel(t.Context())
	leaders := e.Observe(observing)
	defer func() {
		stopObserving()
		for range leaders { // closed once the observer has left
		}
	}()
	awaitLeader(t, leaders, "node-1")
	w := waitFor(t, lc, keys, func(ctx context.Context) (*distlock.Guard, error) { return e.Campaign(ctx, "node-2") })

	code, out, errOut := runDistlock(t, breakArgs(srv, name)...)
	broke := time.Now()
	require.Equal(t, exitBroke, code, "stdout: %s; stderr: %s", out, errOut)
	assert.Contains(t, out, fmt.Sprintf("held by node-1 (value %s, token %d,", frozen, gr.Token))
	assert.Contains(t, out, "passed to node-2 (token ")
	g := w.heldAfter(t, broke, out)
	assert.Greater(t, g.Token(), gr.Token, "the new leader's token")
	awaitLeader(t, leaders, "node-2")
	assert.Less(t, time.Since(broke), breakHandOff, "the observer saw the new leader %v after the break exited", time.Since(broke))
	releaseGuard(t, g)
}

// Bad command lines are usage errors that say what is wrong.
func TestBreakUsage(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"break"}, "distlock break: missing KEY"},
		{[]string{"break", "--redis", "redis://127.0.0.1:1"}, "distlock break: missing KEY"},
		{[]string{"break", "a", "b"}, `distlock break: one KEY at a time (got ["a" "b"])`},
		{[]string{"break", "--holder=", "a"}, "distlock break: --holder needs a value or an owner"},
		{[]string{"break", "a", "--nope"}, "distlock break: flag provided but not defined: -nope"},
		{[]string{"break", "--redis", "redis://127.0.0.1:1", "a{b"}, "distlock break: invalid name: key has '{'"},
		{[]string{"break", "a"}, "distlock break: no Redis given: pass --redis URL or set REDIS_URL"},
		{[]string{"break", "--redis", "http://x", "a"}, `distlock break: bad Redis URL "http://x"`},
	} {
		var out, errOut bytes.Buffer
		assert.Equal(t, exitUsage, run(t.Context(), tc.args, &out, &errOut), "%q", tc.args)
		assert.Contains(t, errOut.String(), tc.want, "%q", tc.args)
		assert.Contains(t, errOut.String(), "Run 'distlock help break' for usage.", "%q", tc.args)
	}
	cfg, err := parseBreak([]string{"k", "--holder", "db:1", "--namespace", "jobs"})
	require.NoError(t, err)
	assert.Equal(t, breakConfig{common: common{namespace: "jobs"}, name: "k", holder: "db:1"}, cfg)
}

// -w bounds everything before the command starts: against a stopped Redis
// (SIGSTOP), which accepts connections and never answers, "distlock run
// -w 3" exits 125 within waitBound without running the command, whether
// Redis stopped before the connect or during the wait.
func TestRunWaitBoundsAStoppedRedis(t *testing.T) {
	// The bound of issue 32: 1.5 s past -w 3 for the process to start,
	// give up and exit, on a busy machine.
	const wait, waitBound = 3 * time.Second, 4500 * time.Millisecond
	w := strconv.Itoa(int(wait / time.Second))

	t.Run("before the connect", func(t *testing.T) {
		srv := redistest.Start(t)
		dir := t.TempDir()
		// Build the binary first: run alone, this test would otherwise time
		// the go build (a second and more) as if distlock took it.
		distlockBin(t)
		srv.Pause()
		defer srv.Resume()
		began := time.Now()
		code, _, errOut := runDistlock(t, cmdline(runArgs(srv, "-w", w, "k"), childArgs(t, dir, "x")...)...)
		took := time.Since(began)
		assert.Equal(t, exitFailed, code, "stderr: %s", errOut)
		assert.Contains(t, errOut, "-w 3s ran out, and the command did not run")
		assert.Less(t, took, waitBound, "distlock run -w %s against a stopped Redis", w)
		assert.False(t, started(dir, "x"), "the command ran")
		t.Logf("exit %d after %v", code, took)
	})

	t.Run("during the wait", func(t *testing.T) {
		srv := redistest.Start(t)
		dir := t.TempDir()
		writeLockFor(t, srv, "k", "holder:1", frozenTTL)
		distlockBin(t)
		began := time.Now()
		p := start(t, nil, cmdline(runArgs(srv, "-v", "-w", w, "k"), childArgs(t, dir, "x")...)...)
		p.waitStderr(t, "waiting for")
		srv.Pause()
		defer srv.Resume()
		code := p.wait(t)
		took := time.Since(began)
		// 75 when the wait's own bound ends it, 125 when a call that Redis
		// never answers outlives it: either way, not run.
		assert.Contains(t, []int{exitNotAcquired, exitFailed}, code, "stderr: %s", &p.stderr)
		assert.Less(t, took, waitBound, "distlock run -w %s with Redis stopped while it waits", w)
		assert.False(t, started(dir, "x"), "the command ran")
		t.Logf("exit %d after %v", code, took)
	})
}

// inspect shows the void markers of a name (a waiter that gave up), and
// only of that name, even one whose characters SCAN's MATCH would read as
// a pattern.
func TestInspectShowsVoidMarkers(t *testing.T) {
	srv := redistest.Start(t)
	const ttl = 10 * time.Second
	g := lockFor(t, srv, "v", "holder:1", ttl)
	m, err := distlock.NewMutex(srv.Client(), "v", distlock.WithOwner("quitter:1"), distlock.WithTTL(ttl),
		distlock.WithMaxWait(shortWait))
	require.NoError(t, err)
	_, err = m.Lock(t.Context())
	require.ErrorIs(t, err, distlock.ErrTimeout)
	ctx, cancel := context.WithTimeout(t.Context(), eventually)
	defer cancel()
	require.NoError(t, distlock.Settle(ctx), "the give-up's clean-up")

	s := inspectJSON(t, srv, "v")
	require.Equal(t, 1, s.Voided, "void markers of v: %+v", s.Voids)
	require.Len(t, s.Voids, 1)
	assert.Equal(t, "quitter:1", s.Voids[0].Owner)
	assert.Positive(t, s.Voids[0].ExpiresInMS)
	assert.LessOrEqual(t, s.Voids[0].ExpiresInMS, ttl.Milliseconds())
	assert.Regexp(t, `  1 void: quitter:1 \(\d+(\.\d+)?m?s left\)\n$`, inspectText(t, srv, "v"))

	for _, other := range []string{"v*", "w"} {
		s = inspectJSON(t, srv, other)
		assert.Zero(t, s.Voided, "%s shows the void markers of v", other)
	}
	releaseGuard(t, g)
}
