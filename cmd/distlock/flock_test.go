package main

import (
	"bytes"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// holderTTL is the TTL of the lock that the tests below hold through the
// library while "distlock run" tries to get it. It is renewed, so it only
// needs to be long enough not to be lost on a busy machine.
const holderTTL = 10 * time.Second

// shortWait is a -w that runs out while the lock is held.
const shortWait = 300 * time.Millisecond

func TestParseSeconds(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"0", 0},
		{"5", 5 * time.Second},
		{"0.5", 500 * time.Millisecond},
		{".25", 250 * time.Millisecond},
		{"1.5e1", 15 * time.Second},
		{"1m30s", 90 * time.Second},
		{"500ms", 500 * time.Millisecond},
		{"0s", 0},
	} {
		got, err := parseSeconds(tc.in)
		if assert.NoError(t, err, "%q", tc.in) {
			assert.Equal(t, tc.want, got, "%q", tc.in)
		}
	}
	for _, in := range []string{"", "abc", "5x", "-1", "-0.5", "-1s", "NaN", "Inf", "-Inf", "1e300"} {
		got, err := parseSeconds(in)
		if assert.Error(t, err, "%q gave %v", in, got) {
			assert.Contains(t, err.Error(), "10s", "%q: the error should say what to write", in)
		}
	}
}

// Every flag that takes a time span, in every subcommand, is a
// durationValue: a bare number is seconds, as -w takes it, and a bad value
// is a usage error that says what to write.
func TestEveryDurationFlagTakesSeconds(t *testing.T) {
	found := 0
	for name, sub := range subcommands {
		sub.flags().VisitAll(func(f *flag.Flag) {
			if g, ok := f.Value.(flag.Getter); ok {
				_, isDuration := g.Get().(time.Duration)
				assert.False(t, isDuration, "distlock %s --%s is a flag.Duration, which refuses a bare number: use durationVar", name, f.Name)
			}
			v, ok := f.Value.(*durationValue)
			if !ok {
				return
			}
			found++
			if assert.NoError(t, v.Set("10"), "distlock %s --%s 10", name, f.Name) {
				assert.Equal(t, 10*time.Second, *v.d, "distlock %s --%s 10", name, f.Name)
			}
			if assert.NoError(t, v.Set("1.5"), "distlock %s --%s 1.5", name, f.Name) {
				assert.Equal(t, 1500*time.Millisecond, *v.d, "distlock %s --%s 1.5", name, f.Name)
			}
			err := v.Set("ten")
			if assert.Error(t, err, "distlock %s --%s ten", name, f.Name) {
				assert.Contains(t, err.Error(), "10s", "distlock %s --%s ten", name, f.Name)
			}
		})
	}
	// run's --ttl, -w, --wait and --timeout (-w by other names, as flock(1)
	// has them) and --grace; inspect's --interval; the demo's --ttl,
	// --duration, --hold and --rest.
	assert.Equal(t, 10, found, "duration flags found")

	cfg, err := parseRun([]string{"--ttl", "10", "-w", "0.5", "--grace", "3", "k", "true"})
	require.NoError(t, err)
	assert.Equal(t, 10*time.Second, cfg.ttl)
	assert.Equal(t, 500*time.Millisecond, cfg.wait)
	assert.True(t, cfg.waitSet)
	assert.Equal(t, 3*time.Second, cfg.grace)

	var out, errOut bytes.Buffer
	assert.Equal(t, exitUsage, run(t.Context(), []string{"run", "--ttl", "ten", "k", "true"}, &out, &errOut))
	assert.Contains(t, errOut.String(), `invalid value "ten" for flag -ttl: want a duration such as 10s`)
}

// The flags of flock(1) on a lock that someone else holds: -n and -w 0
// give up at once, -w after that many seconds, with the status of -E (75 by
// default); flags may follow KEY; the command never runs.
func TestRunBusyLikeFlock(t *testing.T) {
	srv := redistest.Start(t)
	const key = "busy"
	writeLockFor(t, srv, key, "holder:1", holderTTL) // what "distlock run KEY" takes
	dir := t.TempDir()

	cases := []struct {
		name    string
		args    []string // between "run --redis URL" and the child
		want    int
		atLeast time.Duration // the least time it should have waited
		noChild bool          // args have the command (-c), which creates NAME.env if it runs
	}{
		{name: "n", args: []string{"-n", key, "--"}, want: exitNotAcquired},
		{name: "nonblock", args: []string{"--nonblock", key, "--"}, want: exitNotAcquired},
		{name: "try", args: []string{"--try", key, "--"}, want: exitNotAcquired},
		{name: "w0", args: []string{"-w", "0", key, "--"}, want: exitNotAcquired},
		{name: "wait0", args: []string{"--wait=0", key, "--"}, want: exitNotAcquired},
		{name: "w-seconds", args: []string{"-w", "0.3", key, "--"}, want: exitNotAcquired, atLeast: shortWait},
		{name: "w-duration", args: []string{"-w", "300ms", key, "--"}, want: exitNotAcquired, atLeast: shortWait},
		{name: "timeout", args: []string{"--timeout", "0.3", key, "--"}, want: exitNotAcquired, atLeast: shortWait},
		{name: "E", args: []string{"-n", "-E", "9", key, "--"}, want: 9},
		{name: "E0", args: []string{"-E", "0", "-w", "0", key, "--"}, want: 0},
		{name: "conflict-exit-code", args: []string{"-w", "0.3", "--conflict-exit-code", "3", key, "--"}, want: 3, atLeast: shortWait},
		{name: "flags after KEY", args: []string{key, "-n", "-E", "9", "--"}, want: 9},
		{name: "flags after KEY, no --", args: []string{key, "-w", "0", "-E", "8"}, want: 8},
		{name: "flags around KEY", args: []string{"-E", "7", key, "-n"}, want: 7},
		{name: "c", args: []string{"-n", key, "-c", "echo ran > " + dir + "/c.env"}, want: exitNotAcquired, noChild: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := runArgs(srv, tc.args...)
			if !tc.noChild {
				args = append(args, childArgs(t, dir, tc.name)...)
			}
			began := time.Now()
			code, _, errOut := runDistlock(t, args...)
			assert.Equal(t, tc.want, code, "stderr: %s", errOut)
			if tc.atLeast == 0 {
				assert.Contains(t, errOut, "not acquired: distlock:{busy} is held by \"holder:1\"", "the message should name the holder")
			} else {
				// A waiter's calls are named for what they are: it stands
				// in line once and refreshes its place; it does not poll.
				assert.Regexp(t, `not acquired within -w 300ms: waited \d+ms for distlock:\{busy\} \((1 call to Redis, which put it in line|\d+ calls to Redis: one to stand in line, \d+ refresh(es)? of its place)\)`, errOut)
				assert.NotContains(t, errOut, "attempt")
			}
			assert.GreaterOrEqual(t, time.Since(began), tc.atLeast, "-w gave up early")
			assert.False(t, started(dir, tc.name), "the command ran without the lock")
		})
	}
}

// The command line: -c runs a string with sh -c and passes its status on;
// the command starts after "--" or at the first word after KEY that is not
// a flag, and what follows is the command's, flags or not.
func TestRunCommandLine(t *testing.T) {
	srv := redistest.Start(t)
	cases := []struct {
		name   string
		args   []string // between "run --redis URL" and the end
		want   int
		stdout string
	}{
		{
			name: "c", args: []string{"k1", "-c", `printf '%s %s' "$DISTLOCK_KEY" "${DISTLOCK_TOKEN:+set}" | tr k K; exit 3`},
			want: 3, stdout: "K1 set",
		},
		{name: "command before KEY", args: []string{"--command", "echo $DISTLOCK_KEY", "k2"}, stdout: "k2\n"},
		{name: "flags after the command are its own", args: []string{"k3", "--", "echo", "x", "-w", "0", "-n"}, stdout: "x -w 0 -n\n"},
		{name: "no --", args: []string{"k4", "echo", "x", "-n"}, stdout: "x -n\n"},
		{name: "flag, then the command", args: []string{"k5", "-w", "5", "echo", "x", "-E", "9"}, stdout: "x -E 9\n"},
		{name: "status", args: []string{"k6", "sh", "-c", "exit 5"}, want: 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out, errOut := runDistlock(t, runArgs(srv, tc.args...)...)
			assert.Equal(t, tc.want, code, "stderr: %s", errOut)
			assert.Equal(t, tc.stdout, out)
			assert.Empty(t, errOut)
		})
	}
	for i := 1; i <= len(cases); i++ {
		assertFree(t, srv, fmt.Sprintf("k%d", i))
	}
}

// A usage error is two lines: what is wrong, and where to read the usage.
func TestUsageErrorIsShort(t *testing.T) {
	const runHint = "Run 'distlock help run' for usage."
	cases := []struct {
		args  []string
		first string // the first line starts with it
		hint  string
	}{
		{nil, "distlock: missing command", "Run 'distlock help' for usage."},
		{[]string{"nope"}, `distlock: unknown command "nope"`, "Run 'distlock help' for usage."},
		{[]string{"help", "nope"}, `distlock: unknown command "nope"`, "Run 'distlock help' for usage."},
		{[]string{"run", "--", "echo", "hi"}, "distlock run: missing KEY", runHint},
		{[]string{"run"}, "distlock run: missing KEY", runHint},
		{[]string{"run", "-n"}, "distlock run: missing KEY", runHint},
		{[]string{"run", "--nope", "k", "--", "true"}, "distlock run: flag provided but not defined: -nope", runHint},
		{[]string{"run", "k", "--nope", "--", "true"}, "distlock run: flag provided but not defined: -nope", runHint},
		{[]string{"run", "k"}, `distlock run: missing the command after KEY "k"`, runHint},
		{[]string{"run", "k", "--"}, `distlock run: missing the command after "--"`, runHint},
		{[]string{"run", "-w", "abc", "k", "true"}, `distlock run: invalid value "abc" for flag -w: want a duration such as 10s`, runHint},
		{[]string{"run", "-w", "-1", "k", "true"}, `distlock run: invalid value "-1" for flag -w: must not be negative`, runHint},
		{[]string{"run", "-n", "-w", "5", "k", "true"}, "distlock run: -n and -w 5s exclude each other", runHint},
		{[]string{"run", "-E", "256", "k", "true"}, "distlock run: -E 256: the exit status must be 0 to 255", runHint},
		{[]string{"run", "-c", "true", "k", "true"}, "distlock run: -c and a COMMAND after KEY exclude each other", runHint},
		{[]string{"run", "k", "-c", ""}, "distlock run: -c needs a command line", runHint},
		{[]string{"run", "-k", "a"}, "distlock run: missing the command: distlock run [flags] -k NAME", runHint},
		{[]string{"run", "-k", "a", "-k", "a", "true"}, `distlock run: -k "a" is given twice`, runHint},
		{[]string{"run", "-s", "-k", "a", "-k", "b", "true"}, "distlock run: -s takes one name", runHint},
		{[]string{"inspect"}, "distlock inspect: missing KEY", "Run 'distlock help inspect' for usage."},
		{[]string{"inspect", "a", "--json", "a"}, `distlock inspect: KEY "a" is given twice`, "Run 'distlock help inspect' for usage."},
		{[]string{"demo", "--workers", "x"}, "distlock demo: invalid value", "Run 'distlock help demo' for usage."},
	}
	for _, tc := range cases {
		var out, errOut bytes.Buffer
		code := run(t.Context(), tc.args, &out, &errOut)
		assert.Equal(t, exitUsage, code, "%q", tc.args)
		assert.Empty(t, out.String(), "%q", tc.args)
		lines := strings.Split(strings.TrimSuffix(errOut.String(), "\n"), "\n")
		if assert.Len(t, lines, 2, "%q: stderr:\n%s", tc.args, &errOut) {
			assert.True(t, strings.HasPrefix(lines[0], tc.first), "%q: got %q, want it to start with %q", tc.args, lines[0], tc.first)
			assert.Equal(t, tc.hint, lines[1], "%q", tc.args)
		}
	}
}

// "distlock --version" prints the module version the binary was built
// from, or (devel).
func TestVersion(t *testing.T) {
	bin := distlockBin(t)
	info, err := buildinfo.ReadFile(bin)
	require.NoError(t, err)
	want := info.Main.Version
	if want == "" {
		want = "(devel)"
	}
	for _, arg := range []string{"--version", "-version", "-V", "version"} {
		code, out, errOut := runDistlock(t, arg)
		assert.Equal(t, exitOK, code, "%s: stderr: %s", arg, errOut)
		assert.Equal(t, "distlock "+want+"\n", out, arg)
	}
}

// With -v, every line distlock writes has its one format, and each event
// is told once: the loss once as it happens, then what became of the
// command.
func TestRunVerboseSaysEachThingOnce(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	const key = "verbose"
	p := start(t, nil, cmdline(runArgs(srv, "-v", "--ttl", "1s", "--grace", "5s", key), childArgs(t, dir, "c")...)...)
	waitReport(t, dir, "c")
	srv.MustDo("DEL", leaseKey(key))
	assert.Equal(t, exitLost, p.wait(t), "stderr: %s", &p.stderr)

	errOut := p.stderr.String()
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	seen := make(map[string]bool)
	for _, line := range lines {
		assert.True(t, strings.HasPrefix(line, "distlock run: "), "a line in another format: %q", line)
		assert.False(t, seen[line], "a line printed twice: %q", line)
		seen[line] = true
	}
	for _, want := range []string{"waiting for", "acquired distlock:{verbose}", "started ", "expired or was deleted; sending SIGTERM",
		"the lock was lost while the command ran; the command exited with status 0"} {
		assert.Equal(t, 1, strings.Count(errOut, want), "want %q once in:\n%s", want, errOut)
	}
	assert.Equal(t, 1, strings.Count(errOut, "expired or was deleted"), "the loss should be told once:\n%s", errOut)
	assert.Equal(t, 1, strings.Count(errOut, "exited with status 0"), "the command's end should be told once:\n%s", errOut)
	assert.Equal(t, "terminated\n", signalsOf(dir, "c"))
}

// runObserver, behind -v, tells a failed renewal and a regained lease in
// the runner's format, and keeps quiet about what the runner says itself.
func TestRunObserver(t *testing.T) {
	var errOut bytes.Buffer
	o := &runObserver{r: &runner{stderr: &errOut}}
	const key = "distlock:{k}"
	o.ObserveAcquire(distlock.AcquireInfo{Key: key, Token: 1})
	o.ObserveRenew(distlock.RenewInfo{Key: key, Token: 1, Latency: time.Millisecond})
	assert.Empty(t, errOut.String(), "a renewal that worked is no news")

	o.ObserveRenew(distlock.RenewInfo{Key: key, Token: 1, Latency: 5 * time.Millisecond, Err: errors.New("i/o timeout")})
	assert.Equal(t, "distlock run: renewing distlock:{k} failed after 5ms: i/o timeout\n", errOut.String())
	errOut.Reset()

	refused := &distlock.LostError{Key: key, Reason: distlock.LostRefused}
	o.ObserveRenew(distlock.RenewInfo{Key: key, Token: 1, Err: refused})
	o.ObserveTransition(distlock.TransitionInfo{Key: key, Token: 1, From: distlock.Acquired, To: distlock.Lost, Err: refused})
	o.ObserveRenew(distlock.RenewInfo{Key: key, Token: 1, Err: errors.New("i/o timeout")})
	assert.Empty(t, errOut.String(), "the runner reports the loss itself; retries after it are no news")

	o.ObserveTransition(distlock.TransitionInfo{Key: key, Token: 1, From: distlock.Lost, To: distlock.Acquired})
	assert.Equal(t, "distlock run: distlock:{k} is held again (a renewal found it unchanged), but the command is stopped all the same\n", errOut.String())
	errOut.Reset()
	o.ObserveTransition(distlock.TransitionInfo{Key: key, Token: 1, From: distlock.Acquired, To: distlock.Released})
	assert.Empty(t, errOut.String())
}

// inspect's exit status tells a script whether the lock is held, with or
// without --json, and with flags after KEY.
func TestInspectExitStatus(t *testing.T) {
	srv := redistest.Start(t)
	script := func(args ...string) int {
		t.Helper()
		code, _, errOut := runDistlock(t, append([]string{"inspect", "--redis", srv.URL()}, args...)...)
		assert.Empty(t, errOut)
		return code
	}
	assert.Equal(t, exitFree, script("job"), "never acquired")
	assert.Equal(t, exitFree, script("job", "--json"), "never acquired")
	g := lockFor(t, srv, "job", "script", holderTTL)
	assert.Equal(t, exitHeld, script("job"), "held")
	assert.Equal(t, exitHeld, script("--json", "job"), "held")
	assert.Equal(t, exitFree, script("job", "--namespace", "other"), "another namespace")
	releaseGuard(t, g)
	assert.Equal(t, exitFree, script("job"), "released")

	dead := redistest.Start(t)
	dead.Kill()
	code, _, errOut := runDistlock(t, "inspect", "--redis", dead.URL(), "job")
	assert.Equal(t, exitFailed, code, "Redis unreachable: neither held nor free")
	assert.Contains(t, errOut, "connection refused")
}
