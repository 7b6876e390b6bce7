package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// runArgs returns a "distlock run" command line for srv. It fixes the
// process-group mode, which would otherwise depend on whether the tests run
// from a terminal.
func runArgs(srv *redistest.Server, args ...string) []string {
	return append([]string{"run", "--redis", srv.URL(), "--foreground=false"}, args...)
}

// cmdline joins distlock's arguments, "--" and the command.
func cmdline(args []string, command ...string) []string {
	return append(append(args, "--"), command...)
}

func leaseKey(key string) string { return "distlock:{" + key + "}" }

// token parses a child's DISTLOCK_TOKEN.
func token(t *testing.T, rep childReport) int64 {
	t.Helper()
	n, err := strconv.ParseInt(rep.Token, 10, 64)
	require.NoError(t, err, "DISTLOCK_TOKEN")
	require.Positive(t, n, "DISTLOCK_TOKEN")
	return n
}

// assertFree checks that nobody holds key.
func assertFree(t *testing.T, srv *redistest.Server, key string) {
	t.Helper()
	n, err := srv.MustDo("EXISTS", leaseKey(key)).AsInt64()
	require.NoError(t, err)
	assert.Zero(t, n, "%s is still held", key)
}

// Two "distlock run" for one key: the second waits, and runs once the first
// has finished, with a larger token. Meanwhile --try and --wait give up with
// 75, and a signal ends a wait.
func TestRunWaitsForTheHolder(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	const key = "nightly"
	host, err := os.Hostname()
	require.NoError(t, err)

	a := start(t, nil, cmdline(runArgs(srv, "--ttl", "1s", key), childArgs(t, dir, "a")...)...)
	repA := waitReport(t, dir, "a")
	assert.Equal(t, key, repA.Key, "DISTLOCK_KEY")
	assert.Equal(t, fmt.Sprintf("%s:%d", host, a.cmd.Process.Pid), repA.Owner, "DISTLOCK_OWNER")
	tokenA := token(t, repA)
	assert.Equal(t, repA.Pid, repA.Pgid, "the command should lead a process group of its own")

	b := start(t, nil, cmdline(runArgs(srv, "--ttl", "1s", key), childArgs(t, dir, "b")...)...)

	code, _, errOut := runDistlock(t, cmdline(runArgs(srv, "--try", key), childArgs(t, dir, "try")...)...)
	assert.Equal(t, exitNotAcquired, code, "--try on a held lock; stderr: %s", errOut)
	assert.Contains(t, errOut, repA.Owner, "the message should name the holder")

	began := time.Now()
	code, _, errOut = runDistlock(t, cmdline(runArgs(srv, "--wait", "300ms", key), childArgs(t, dir, "wait")...)...)
	assert.Equal(t, exitNotAcquired, code, "--wait ran out; stderr: %s", errOut)
	assert.GreaterOrEqual(t, time.Since(began), 300*time.Millisecond, "--wait gave up early")

	w := start(t, nil, cmdline(runArgs(srv, "-v", key), childArgs(t, dir, "sig")...)...)
	w.waitStderr(t, "waiting for")
	w.signal(t, syscall.SIGTERM)
	assert.Equal(t, exitSignalBase+int(syscall.SIGTERM), w.wait(t), "a signal while waiting")
	assert.Contains(t, w.stderr.String(), "while waiting for")

	code, out, _ := runDistlock(t, "inspect", "--redis", srv.URL(), key)
	assert.Equal(t, exitHeld, code, "inspect of a held lock")
	assert.Contains(t, out, "held by "+repA.Owner)
	assert.Contains(t, out, fmt.Sprintf("last token %d", tokenA))

	for _, name := range []string{"b", "try", "wait", "sig"} {
		assert.False(t, started(dir, name), "%s ran while a held the lock", name)
	}
	letExit(t, dir, "a")
	assert.Equal(t, 0, a.wait(t), "a's stderr: %s", &a.stderr)

	repB := waitReport(t, dir, "b")
	assert.Greater(t, token(t, repB), tokenA, "tokens must increase")
	assert.Equal(t, fmt.Sprintf("%s:%d", host, b.cmd.Process.Pid), repB.Owner)
	holder, err := srv.MustDo("HGET", leaseKey(key), "~w").ToString()
	require.NoError(t, err, "b runs without the lock")
	assert.Equal(t, repB.Owner, lease.Owner(holder), "b runs, but the lock names someone else")
	letExit(t, dir, "b")
	assert.Equal(t, 0, b.wait(t), "b's stderr: %s", &b.stderr)
	assertFree(t, srv, key)
}

// An admin deletes the key: the command gets SIGTERM, then SIGKILL after
// --grace if it ignores SIGTERM, and distlock exits with exitLost.
func TestRunStopsTheCommandWhenTheLockIsLost(t *testing.T) {
	srv := redistest.Start(t)
	cases := []struct {
		name        string
		grace       time.Duration
		childFlags  []string
		killed      bool     // whether the command should get SIGKILL
		wantSignals string   // what the command received
		wantStderr  []string // what distlock said
	}{
		{
			name: "SIGTERM", grace: 5 * time.Second,
			wantSignals: "terminated\n",
			wantStderr:  []string{"expired or was deleted; sending SIGTERM", "the command exited with status 0"},
		},
		{
			name: "SIGKILL after grace", grace: 400 * time.Millisecond, childFlags: []string{"-ignore-term"}, killed: true,
			wantStderr: []string{"sending SIGTERM", "still running 400ms after SIGTERM; sending SIGKILL", "killed by signal 9"},
		},
		{
			name: "no grace", grace: 0, killed: true,
			wantStderr: []string{"killing the command", "killed by signal 9"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			key := strings.ReplaceAll(tc.name, " ", "-")
			p := start(t, nil, cmdline(runArgs(srv, "--ttl", "1s", "--grace", tc.grace.String(), key),
				childArgs(t, dir, "c", tc.childFlags...)...)...)
			rep := waitReport(t, dir, "c")

			deleted := time.Now()
			srv.MustDo("DEL", leaseKey(key))
			code := p.wait(t)
			errOut := p.stderr.String()
			assert.Equal(t, exitLost, code, "stderr: %s", errOut)
			if tc.killed {
				assert.GreaterOrEqual(t, time.Since(deleted), tc.grace, "SIGKILL came before the grace period ended")
			}
			assert.Equal(t, tc.wantSignals, signalsOf(dir, "c"))
			for _, want := range tc.wantStderr {
				assert.Contains(t, errOut, want)
			}
			assert.ErrorIs(t, syscall.Kill(rep.Pid, 0), syscall.ESRCH, "the command is still running")
		})
	}
}

// A blip of 300 ms around a renewal (the Redis port closed: dials refused,
// connections reset) does not stop the command: the renewal is retried
// while the lease holds, and distlock exits with the command's status, not
// exitLost. With -v it says that a renewal failed.
func TestRunRidesOutABlip(t *testing.T) {
	srv := redistest.Start(t)
	proxy := faultproxy.New(t, srv.Addr())
	dir := t.TempDir()
	const key = "blip"
	const ttl = 3 * time.Second
	args := []string{"run", "--redis", "redis://" + proxy.Addr(), "--foreground=false", "-v", "--ttl", ttl.String(), key}
	p := start(t, nil, cmdline(args, childArgs(t, dir, "c")...)...)
	waitReport(t, dir, "c")
	// Blips of 300 ms, 100 ms apart, until one has caught a renewal (they
	// come every second).
	for blips := 0; !strings.Contains(p.stderr.String(), "failed"); blips++ {
		require.Less(t, blips, 10, "no renewal was caught in a blip; stderr: %s", &p.stderr)
		proxy.Refuse()
		time.Sleep(300 * time.Millisecond)
		proxy.Heal()
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(ttl / 3) // a renewal after the heal
	letExit(t, dir, "c")
	code := p.wait(t)
	errOut := p.stderr.String()
	assert.Equal(t, 0, code, "the command should have run to its end; stderr: %s", errOut)
	assert.Empty(t, signalsOf(dir, "c"), "the command was signalled")
	assert.Contains(t, errOut, "renewing", "-v should report the failed renewal")
	assertFree(t, srv, key)
}

// Signals sent to distlock reach the command (and, in its own process group,
// the command's children); the lock is released after the command exits,
// and distlock exits with the command's status.
func TestRunForwardsSignals(t *testing.T) {
	srv := redistest.Start(t)
	cases := []struct {
		sig        syscall.Signal
		foreground bool
		forwarded  bool
	}{
		{sig: syscall.SIGTERM, forwarded: true},
		{sig: syscall.SIGINT, forwarded: true},
		{sig: syscall.SIGHUP, forwarded: true},
		{sig: syscall.SIGTERM, foreground: true, forwarded: true},
		// In distlock's own process group the terminal sends SIGINT to the
		// command itself; distlock does not send a second one.
		{sig: syscall.SIGINT, foreground: true, forwarded: false},
	}
	for _, tc := range cases {
		name := fmt.Sprintf("%s/foreground=%v", tc.sig, tc.foreground)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			key := strings.NewReplacer("/", "-", " ", "-", "=", "-").Replace(name)
			flags := []string{"-sig-exit", "7"}
			if !tc.foreground {
				flags = append(flags, "-spawn")
			}
			args := []string{"run", "--redis", srv.URL(), "-v", "--foreground=" + strconv.FormatBool(tc.foreground), key}
			p := start(t, nil, cmdline(args, childArgs(t, dir, "c", flags...)...)...)
			rep := waitReport(t, dir, "c")
			if tc.foreground {
				distlockGroup, err := syscall.Getpgid(p.cmd.Process.Pid)
				require.NoError(t, err)
				assert.Equal(t, distlockGroup, rep.Pgid, "--foreground: the command should share distlock's process group")
			} else {
				grand := waitReport(t, dir, "c-grand")
				assert.Equal(t, rep.Pid, grand.Pgid, "the command's child should be in the command's process group")
			}

			p.signal(t, tc.sig)
			if !tc.forwarded {
				p.waitStderr(t, "left to the terminal")
				assert.Empty(t, signalsOf(dir, "c"))
				letExit(t, dir, "c")
				assert.Equal(t, 0, p.wait(t), "stderr: %s", &p.stderr)
				assertFree(t, srv, key)
				return
			}
			assert.Equal(t, 7, p.wait(t), "distlock should exit with the command's status; stderr: %s", &p.stderr)
			assertFree(t, srv, key)
			assert.Equal(t, tc.sig.String()+"\n", signalsOf(dir, "c"))
			if !tc.foreground {
				assert.Eventually(t, func() bool { return signalsOf(dir, "c-grand") == tc.sig.String()+"\n" },
					eventually, pollEvery, "the command's child did not get %v", tc.sig)
			}
		})
	}
}

func TestRunExitCodes(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	notExecutable := filepath.Join(dir, "not-executable")
	require.NoError(t, os.WriteFile(notExecutable, []byte("#!/bin/sh\n"), 0o644))
	letExit(t, dir, "own") // the child "own" exits at once with -exit
	dead := redistest.Start(t)
	dead.Kill()

	cases := []struct {
		name   string
		args   []string
		want   int
		stderr string
	}{
		{"the command's status", cmdline(runArgs(srv, "k1"), childArgs(t, dir, "own", "-exit", "3")...), 3, ""},
		{"command killed by a signal", cmdline(runArgs(srv, "k2"), childArgs(t, dir, "killed", "-kill-self")...), 128 + 9, ""},
		{"command not found", cmdline(runArgs(srv, "k3"), "distlock-test-no-such-command"), exitNotFound, "not found"},
		{"command not executable", cmdline(runArgs(srv, "k4"), notExecutable), exitCannotExec, "permission denied"},
		{"Redis unreachable", cmdline([]string{"run", "--redis", dead.URL(), "k5"}, "true"), exitFailed, "connection refused"},
		{"no Redis", cmdline([]string{"run", "k6"}, "true"), exitUsage, "no Redis given"},
		{"bad Redis URL", cmdline([]string{"run", "--redis", "http://localhost", "k7"}, "true"), exitUsage, "bad Redis URL"},
		{"no key", []string{"run", "--redis", srv.URL()}, exitUsage, "missing KEY"},
		{"command without --", runArgs(srv, "k8", "true"), 0, ""},
		{"no command", cmdline(runArgs(srv, "k9")), exitUsage, "missing the command"},
		{"--try and --wait", cmdline(runArgs(srv, "--try", "--wait", "1s", "k10"), "true"), exitUsage, "exclude each other"},
		{"negative grace", cmdline(runArgs(srv, "--grace", "-1s", "k11"), "true"), exitUsage, "-grace: must not be negative"},
		{"TTL too short", cmdline(runArgs(srv, "--ttl", "10ms", "k12"), "true"), exitUsage, "ttl"},
		{"bad key", cmdline(runArgs(srv, "a{b}"), "true"), exitUsage, "braces"},
		{"unknown flag", cmdline(runArgs(srv, "--nope", "k13"), "true"), exitUsage, "nope"},
		{"inspect without key", []string{"inspect", "--redis", srv.URL()}, exitUsage, "missing KEY"},
		{"inspect without Redis", []string{"inspect", "k14"}, exitUsage, "no Redis given"},
		{"inspect with Redis unreachable", []string{"inspect", "--redis", dead.URL(), "k15"}, exitFailed, "connection refused"},
		{"demo with a bad flag", []string{"demo", "--workers", "0"}, exitUsage, "--workers"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, errOut := runDistlock(t, tc.args...)
			assert.Equal(t, tc.want, code, "stderr: %s", errOut)
			assert.Contains(t, errOut, tc.stderr)
		})
	}
	for i := 1; i <= 12; i++ {
		assertFree(t, srv, fmt.Sprintf("k%d", i))
	}
}

// Three "distlock run --permits 2" for one key: two run at once, the third
// waits in line and runs once one of them has finished, with a larger
// token. Meanwhile -n gives up with 75, and inspect shows the semaphore.
func TestRunPermits(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	const key = "pool"
	names := []string{"a", "b", "c"}
	procs := make(map[string]*proc)
	for _, name := range names {
		procs[name] = start(t, nil, cmdline(runArgs(srv, "--permits", "2", "--ttl", "2s", key), childArgs(t, dir, name)...)...)
	}
	// Two get a permit and start; the third stands in line.
	var running, waiting []string
	require.Eventually(t, func() bool {
		s := inspectJSON(t, srv, key)
		return s.Holding == 2 && s.Waiting == 1
	}, eventually, pollEvery, "never two holders and one waiter")
	for _, name := range names {
		if started(dir, name) {
			running = append(running, name)
		} else {
			waiting = append(waiting, name)
		}
	}
	// A holder's command may not have reported yet; the waiter's cannot
	// have started.
	for len(running) < 2 && len(waiting) > 1 {
		require.Eventually(t, func() bool {
			return slices.ContainsFunc(waiting, func(n string) bool { return started(dir, n) })
		}, eventually, pollEvery)
		running, waiting = nil, nil
		for _, name := range names {
			if started(dir, name) {
				running = append(running, name)
			} else {
				waiting = append(waiting, name)
			}
		}
	}
	require.Len(t, running, 2, "commands running under 2 permits")
	require.Len(t, waiting, 1)
	first, second, third := running[0], running[1], waiting[0]
	repFirst, repSecond := waitReport(t, dir, first), waitReport(t, dir, second)
	assert.NotEqual(t, token(t, repFirst), token(t, repSecond), "two permits with one token")

	s := inspectJSON(t, srv, key)
	assert.Equal(t, "semaphore", s.Kind)
	assert.ElementsMatch(t, []string{repFirst.Owner, repSecond.Owner}, owners(s))
	assert.Equal(t, 2, s.Permits)
	require.NotNil(t, s.FreePermits)
	assert.Zero(t, *s.FreePermits)
	assert.Equal(t, []string{fmt.Sprintf("%s:%d", hostname(t), procs[third].cmd.Process.Pid)}, s.Waiters)

	code, _, errOut := runDistlock(t, cmdline(runArgs(srv, "--permits", "2", "-n", key), childArgs(t, dir, "try")...)...)
	assert.Equal(t, exitNotAcquired, code, "-n with every permit held; stderr: %s", errOut)
	assert.Contains(t, errOut, "all 2 permits")
	assert.False(t, started(dir, "try"))

	// Still two at most: the third waits until one of the two has finished.
	assert.False(t, started(dir, third), "%s ran while %s and %s held both permits", third, first, second)
	letExit(t, dir, first)
	assert.Equal(t, 0, procs[first].wait(t), "%s's stderr: %s", first, &procs[first].stderr)
	repThird := waitReport(t, dir, third)
	assert.Greater(t, token(t, repThird), max(token(t, repFirst), token(t, repSecond)), "tokens must increase")
	assert.Equal(t, fmt.Sprintf("%s:%d", hostname(t), procs[third].cmd.Process.Pid), repThird.Owner)
	assert.ElementsMatch(t, []string{repSecond.Owner, repThird.Owner}, owners(inspectJSON(t, srv, key)))

	for _, name := range []string{second, third} {
		letExit(t, dir, name)
		assert.Equal(t, 0, procs[name].wait(t), "%s's stderr: %s", name, &procs[name].stderr)
	}
	s = inspectJSON(t, srv, key)
	assert.Equal(t, "free", s.State)
	assert.Zero(t, s.Holding)
}

func hostname(t *testing.T) string {
	t.Helper()
	host, err := os.Hostname()
	require.NoError(t, err)
	return host
}

func TestRunPermitsUsage(t *testing.T) {
	srv := redistest.Start(t)
	cases := []struct {
		permits string
		stderr  string
	}{
		{"0", "--permits 0: a semaphore needs at least 1 permit"},
		{"-1", "--permits -1: a semaphore needs at least 1 permit"},
		{"two", `invalid value "two" for flag -permits`},
		{"1048577", "permits"},
	}
	for _, tc := range cases {
		t.Run(tc.permits, func(t *testing.T) {
			code, _, errOut := runDistlock(t, cmdline(runArgs(srv, "--permits", tc.permits, "k"), "true")...)
			assert.Equal(t, exitUsage, code, "stderr: %s", errOut)
			assert.Contains(t, errOut, tc.stderr)
			assert.Contains(t, errOut, "Run 'distlock help run' for usage.")
		})
	}
	keys, err := srv.MustDo("KEYS", "*").AsStrSlice()
	require.NoError(t, err)
	assert.Empty(t, keys, "a refused run touched Redis")
}

// A key that another kind uses (a semaphore's name given without
// --permits, or a lock's with it) exits with exitWrongKind, neither a
// usage error nor a Redis failure, with a message that names both kinds
// and the fix; the holder of the other kind is not disturbed.
func TestRunRefusesAKeyOfAnotherKind(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	sem := start(t, nil, cmdline(runArgs(srv, "--permits", "2", "semname"), childArgs(t, dir, "sem")...)...)
	waitReport(t, dir, "sem")
	for _, args := range [][]string{{"-n", "semname"}, {"-s", "-n", "semname"}, {"semname"}} {
		code, _, errOut := runDistlock(t, cmdline(runArgs(srv, args...), "true")...)
		assert.Equal(t, exitWrongKind, code, "%q: stderr: %s", args, errOut)
		for _, want := range []string{`KEY "semname" is a semaphore`, "asks for a lock", "--permits N", "distlock inspect semname", "pick another KEY"} {
			assert.Contains(t, errOut, want, "%q", args)
		}
	}

	holder := start(t, nil, cmdline(runArgs(srv, "lockname"), childArgs(t, dir, "lock")...)...)
	waitReport(t, dir, "lock")
	code, _, errOut := runDistlock(t, cmdline(runArgs(srv, "--permits", "2", "-n", "lockname"), "true")...)
	assert.Equal(t, exitWrongKind, code, "stderr: %s", errOut)
	for _, want := range []string{`KEY "lockname" is a lock`, "asks for a semaphore", "without --permits"} {
		assert.Contains(t, errOut, want)
	}

	for name, p := range map[string]*proc{"lock": holder, "sem": sem} {
		assert.Empty(t, signalsOf(dir, name), "the %s holder was disturbed", name)
		letExit(t, dir, name)
		assert.Equal(t, 0, p.wait(t), "%s holder", name)
	}
}
