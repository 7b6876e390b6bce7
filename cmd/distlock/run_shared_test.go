package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Two "distlock run -s" of one key run at once; an -x run waits for both,
// and an -s run that comes while it waits queues behind it (arrival
// order). inspect shows the readers and the line with its modes.
func TestRunShared(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	const key = "config"
	a := start(t, nil, cmdline(runArgs(srv, "-s", "--ttl", "2s", key), childArgs(t, dir, "a")...)...)
	b := start(t, nil, cmdline(runArgs(srv, "--shared", "--ttl", "2s", key), childArgs(t, dir, "b")...)...)
	repA, repB := waitReport(t, dir, "a"), waitReport(t, dir, "b")
	assert.NotEqual(t, token(t, repA), token(t, repB))

	code, _, errOut := runDistlock(t, cmdline(runArgs(srv, "-n", key), childArgs(t, dir, "try")...)...)
	assert.Equal(t, exitNotAcquired, code, "-n for writing while two read; stderr: %s", errOut)
	x := start(t, nil, cmdline(runArgs(srv, "-x", "--ttl", "2s", key), childArgs(t, dir, "x")...)...)
	require.Eventually(t, func() bool { return inspectJSON(t, srv, key).Waiting == 1 }, eventually, pollEvery)
	c := start(t, nil, cmdline(runArgs(srv, "-s", "--ttl", "2s", key), childArgs(t, dir, "c")...)...)
	require.Eventually(t, func() bool { return inspectJSON(t, srv, key).Waiting == 2 }, eventually, pollEvery)

	s := inspectJSON(t, srv, key)
	assert.Equal(t, "rwmutex", s.Kind)
	assert.Equal(t, "read", s.Mode)
	assert.ElementsMatch(t, []string{repA.Owner, repB.Owner}, owners(s))
	require.Len(t, s.Line, 2)
	assert.Equal(t, []string{"write", "read"}, []string{s.Line[0].Mode, s.Line[1].Mode}, "the line with its modes")
	code, out, _ := runDistlock(t, "inspect", "--redis", srv.URL(), key)
	assert.Equal(t, exitHeld, code)
	assert.Contains(t, out, "rwmutex held by 2 readers")
	assert.Contains(t, out, "2 waiting: ")
	assert.Contains(t, out, "(write), ")

	letExit(t, dir, "a")
	assert.Equal(t, 0, a.wait(t))
	assert.False(t, started(dir, "x"), "the writer ran with a reader holding")
	letExit(t, dir, "b")
	assert.Equal(t, 0, b.wait(t))
	repX := waitReport(t, dir, "x")
	assert.Greater(t, token(t, repX), max(token(t, repA), token(t, repB)))
	assert.False(t, started(dir, "c"), "the reader behind the writer ran with it")
	assert.Equal(t, "write", inspectJSON(t, srv, key).Mode)
	letExit(t, dir, "x")
	assert.Equal(t, 0, x.wait(t))
	repC := waitReport(t, dir, "c")
	assert.Greater(t, token(t, repC), token(t, repX))
	letExit(t, dir, "c")
	assert.Equal(t, 0, c.wait(t))
	assertFree(t, srv, key)
}

func TestRunSharedUsage(t *testing.T) {
	srv := redistest.Start(t)
	for _, args := range [][]string{{"-s", "-x", "k"}, {"-s", "--permits", "2", "k"}, {"--exclusive", "--permits", "2", "k"}} {
		code, _, errOut := runDistlock(t, cmdline(runArgs(srv, args...), "true")...)
		assert.Equal(t, exitUsage, code, "%q: stderr: %s", args, errOut)
		assert.Contains(t, errOut, "exclude each other", "%q", args)
	}
	keys, err := srv.MustDo("KEYS", "*").AsStrSlice()
	require.NoError(t, err)
	assert.Empty(t, keys, "a refused run touched Redis")
}

// writeLockFor takes the read-write lock key for writing, as "distlock run
// KEY" does, as owner, until the test ends.
func writeLockFor(t *testing.T, srv *redistest.Server, key, owner string, ttl time.Duration) *distlock.Guard {
	t.Helper()
	rw, err := distlock.NewRWMutex(srv.Client(), key, distlock.WithOwner(owner), distlock.WithTTL(ttl))
	require.NoError(t, err)
	g, err := rw.Lock(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = g.Release(context.Background()) })
	return g
}

// A Mutex of the Go library and "distlock run" of one name are one lock:
// while a Mutex holds it, -n and -s -n give up with 75 (as flock's -n), an
// -s run waits and runs once the Mutex is released; while that run holds
// it, a Mutex waits, an -s -n run that comes behind the waiting Mutex
// gives up (it waits as behind a writer), and the Mutex gets the lock when
// the run's command exits. inspect shows the line with its modes.
func TestRunSharesOneLockWithAMutex(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	const key = "nightly-report"
	g := lockFor(t, srv, key, "service", 5*time.Second)
	for _, flags := range [][]string{{"-n"}, {"-s", "-n"}, {"-x", "-n"}} {
		code, _, errOut := runDistlock(t, cmdline(runArgs(srv, append(flags, key)...), childArgs(t, dir, "try")...)...)
		assert.Equal(t, exitNotAcquired, code, "%q while a Mutex holds; stderr: %s", flags, errOut)
		assert.Contains(t, errOut, "service", "%q: the message names the holder", flags)
	}
	assert.False(t, started(dir, "try"), "a run got in while a Mutex held the lock")

	s := start(t, nil, cmdline(runArgs(srv, "-s", "--ttl", "2s", key), childArgs(t, dir, "s")...)...)
	require.Eventually(t, func() bool { return inspectJSON(t, srv, key).Waiting == 1 }, eventually, pollEvery)
	st := inspectJSON(t, srv, key)
	assert.Equal(t, [2]string{"held", "lock"}, [2]string{st.State, st.Kind})
	assert.Equal(t, "service", st.Owner)
	require.Len(t, st.Line, 1)
	assert.Equal(t, "read", st.Line[0].Mode, "the run's place shows its mode")
	code, out, _ := runDistlock(t, "inspect", "--redis", srv.URL(), key)
	assert.Equal(t, exitHeld, code)
	assert.Contains(t, out, "held by service")
	assert.Contains(t, out, "1 waiting: ")
	assert.Contains(t, out, "(read)")
	assert.False(t, started(dir, "s"), "an -s run while a Mutex holds")
	releaseGuard(t, g)
	repS := waitReport(t, dir, "s")
	assert.Greater(t, token(t, repS), g.Token(), "one fencing sequence")

	m, err := distlock.NewMutex(srv.Client(), key, distlock.WithOwner("service"), distlock.WithTTL(5*time.Second))
	require.NoError(t, err)
	_, err = m.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "a Mutex while an -s run holds")
	type outcome struct {
		g   *distlock.Guard
		err error
	}
	locked := make(chan outcome, 1)
	go func() {
		g, err := m.Lock(t.Context())
		locked <- outcome{g, err}
	}()
	require.Eventually(t, func() bool { return inspectJSON(t, srv, key).Waiting == 1 }, eventually, pollEvery)
	st = inspectJSON(t, srv, key)
	assert.Equal(t, [2]string{"rwmutex", "read"}, [2]string{st.Kind, st.Mode})
	require.Len(t, st.Line, 1)
	assert.Equal(t, [2]string{"service", "write"}, [2]string{st.Line[0].Owner, st.Line[0].Mode}, "the Mutex waits as a writer")
	code, _, errOut := runDistlock(t, cmdline(runArgs(srv, "-s", "-n", key), childArgs(t, dir, "late")...)...)
	assert.Equal(t, exitNotAcquired, code, "-s -n behind a waiting Mutex; stderr: %s", errOut)
	select {
	case o := <-locked:
		t.Fatalf("the Mutex got the lock while an -s run held it: %v", o.err)
	default:
	}
	letExit(t, dir, "s")
	assert.Equal(t, 0, s.wait(t))
	var o outcome
	select {
	case o = <-locked:
	case <-time.After(eventually):
		t.Fatal("the Mutex did not get the lock after the run's command exited")
	}
	require.NoError(t, o.err)
	assert.Greater(t, o.g.Token(), token(t, repS))
	releaseGuard(t, o.g)
	assertFree(t, srv, key)
}
