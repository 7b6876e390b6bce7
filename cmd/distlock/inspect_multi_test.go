package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// inspectLook runs "distlock inspect --json" for several KEYs and decodes
// its line. It checks that the exit status is exitHeld when any is held
// and exitFree otherwise.
func inspectLook(t *testing.T, srv *redistest.Server, names ...string) lookState {
	t.Helper()
	code, out, errOut := runDistlock(t, append([]string{"inspect", "--redis", srv.URL(), "--json"}, names...)...)
	var s lookState
	require.NoError(t, json.Unmarshal([]byte(out), &s), "output: %s; stderr: %s", out, errOut)
	require.Len(t, s.Locks, len(names), "output: %s", out)
	want := exitFree
	if s.held() {
		want = exitHeld
	}
	assert.Equal(t, want, code, "the exit status; stderr: %s", errOut)
	return s
}

// A MultiMutex that holds some of its names and waits in the line of
// another shows in each KEY's state, and inspect of all of them shows it
// once, as one request: the names it holds and its place in the line.
func TestInspectMultiMutex(t *testing.T) {
	srv := redistest.Start(t)
	names := []string{"ma", "mb", "mc"}
	// The set takes its names in its own order; the holder holds the last
	// one, so that the MultiMutex holds the other two while it waits.
	ks := make([]lease.Keys, len(names))
	for i, name := range names {
		k, err := lease.NewKeys(distlock.DefaultNamespace, name)
		require.NoError(t, err)
		ks[i] = k
	}
	require.NoError(t, lease.SortSet(ks))
	var blocked string
	var holds []string
	for _, name := range names {
		if leaseKey(name) == ks[len(ks)-1].Lease {
			blocked = name
		} else {
			holds = append(holds, name)
		}
	}

	holder := lockFor(t, srv, blocked, "holder", 5*time.Second)
	mm, err := distlock.NewMultiMutex(srv.Client(), names, distlock.WithOwner("multi"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type outcome struct {
		g   *distlock.Guard
		err error
	}
	locked := make(chan outcome, 1)
	go func() {
		g, err := mm.Lock(ctx)
		locked <- outcome{g, err}
	}()
	require.Eventually(t, func() bool { return len(inspectLook(t, srv, names...).Requests) == 1 }, eventually, pollEvery,
		"inspect never saw the MultiMutex as a request")

	s := inspectLook(t, srv, names...)
	r := s.Requests[0]
	assert.Equal(t, "multi", r.Owner)
	assert.Equal(t, holds, r.Holds, "the names it holds, in the order given")
	assert.Equal(t, []placeState{{Name: blocked, Place: 1, Waiting: 1}}, r.Waits)
	for i, name := range names {
		l := s.Locks[i]
		assert.Equal(t, leaseKey(name), l.Key)
		assert.Equal(t, "held", l.State, name)
		if name == blocked {
			assert.Equal(t, "holder", l.Owner)
			assert.Equal(t, []string{"multi"}, l.Waiters)
		} else {
			assert.Equal(t, r.Value, l.Value, "the holder of %s", name)
		}
	}

	code, out, errOut := runDistlock(t, append([]string{"inspect", "--redis", srv.URL()}, names...)...)
	assert.Equal(t, exitHeld, code, "stderr: %s", errOut)
	t.Logf("inspect %v:\n%s", names, out)
	lines := strings.Split(out, "\n")
	require.Len(t, lines, len(names)+2, "a line per KEY, one for the request, and the newline at the end:\n%s", out)
	for i, name := range names {
		assert.Regexp(t, `^`+regexp.QuoteMeta(leaseKey(name))+`  held by `, lines[i])
	}
	assert.Contains(t, lines[slices.Index(names, blocked)], "  1 waiting: multi")
	assert.Equal(t, fmt.Sprintf("request %s  holds %s, %s; waits in the line of %s, at place 1 of 1", r.Value, holds[0], holds[1], blocked),
		lines[len(names)])

	// One KEY prints its state alone, as it always has.
	one := inspectJSON(t, srv, holds[0])
	assert.Equal(t, r.Value, one.Value)

	// Once the holder lets go, the MultiMutex holds every name: still one
	// request, in no line.
	releaseGuard(t, holder)
	var o outcome
	select {
	case o = <-locked:
	case <-time.After(eventually):
		t.Fatal("the MultiMutex did not get its names after the holder's release")
	}
	require.NoError(t, o.err)
	s = inspectLook(t, srv, names...)
	require.Len(t, s.Requests, 1)
	assert.Equal(t, requestState{Owner: "multi", Value: r.Value, Holds: names}, s.Requests[0])
	assert.Contains(t, inspectText(t, srv, names...), fmt.Sprintf("\nrequest %s  holds ma, mb, mc\n", r.Value))

	// Released: nothing held, nothing to correlate.
	releaseGuard(t, o.g)
	s = inspectLook(t, srv, names...)
	assert.Empty(t, s.Requests)
	for _, l := range s.Locks {
		assert.Equal(t, "free", l.State, l.Key)
	}
}

// --watch of several KEYs prints one look per change: with --json one
// object with every KEY's state, and in text a line per KEY, each with the
// time.
func TestInspectWatchSeveral(t *testing.T) {
	srv := redistest.Start(t)
	const interval = 20 * time.Millisecond
	p := start(t, nil, "inspect", "--redis", srv.URL(), "--watch", "--json", "--interval", interval.String(), "wa", "wb")
	looks := func(n int) []lookState {
		t.Helper()
		var ls []lookState
		require.Eventually(t, func() bool {
			ls = nil
			for line := range strings.Lines(p.stdout.String()) {
				var s lookState
				require.NoError(t, json.Unmarshal([]byte(line), &s), "line %q", line)
				ls = append(ls, s)
			}
			return len(ls) >= n
		}, eventually, pollEvery, "the watch printed fewer than %d lines:\n%s", n, &p.stdout)
		return ls
	}
	first := looks(1)[0]
	require.Len(t, first.Locks, 2)
	assert.Equal(t, [2]string{"free", "free"}, [2]string{first.Locks[0].State, first.Locks[1].State})

	g := lockFor(t, srv, "wb", "watched", 5*time.Second)
	second := looks(2)[1]
	require.Len(t, second.Locks, 2)
	assert.Equal(t, "free", second.Locks[0].State)
	assert.Equal(t, "watched", second.Locks[1].Owner)
	releaseGuard(t, g)
	looks(3)

	p.signal(t, syscall.SIGINT)
	assert.Equal(t, exitOK, p.wait(t), "stderr: %s", &p.stderr)
	assert.Len(t, looks(3), 3, "the watch printed lines without a change:\n%s", &p.stdout)

	text := start(t, nil, "inspect", "--redis", srv.URL(), "--watch", "--interval", interval.String(), "wa", "wb")
	require.Eventually(t, func() bool { return strings.Count(text.stdout.String(), "\n") >= 2 }, eventually, pollEvery)
	text.signal(t, syscall.SIGTERM)
	assert.Equal(t, exitOK, text.wait(t))
	stamp := `^\d\d:\d\d:\d\d\.\d\d\d  `
	lines := strings.Split(strings.TrimSuffix(text.stdout.String(), "\n"), "\n")
	require.Len(t, lines, 2, "output:\n%s", &text.stdout)
	assert.Regexp(t, stamp+`distlock:\{wa\}  free`, lines[0])
	assert.Regexp(t, stamp+`distlock:\{wb\}  free  last token \d+$`, lines[1])
}
