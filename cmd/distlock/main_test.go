package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Timing used across the tests. The machine may be busy (two cores shared
// with other test runs), so waits for an outcome are generous, and the
// assertions about time are lower bounds only.
const (
	eventually = 10 * time.Second // upper bound for something that should happen soon
	pollEvery  = 10 * time.Millisecond
	// exitWait bounds how long a distlock process may take to exit once it
	// has every reason to.
	exitWait = 15 * time.Second
)

// childEnv marks a run of the test binary as a child command of distlock
// (see child_test.go) instead of a test run.
const childEnv = "DISTLOCK_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain(os.Args[1:]))
	}
	code := m.Run()
	if code == 0 {
		// As in the root package: a cluster client's topology refresh
		// closes dropped connections from a goroutine of rueidis that
		// sleeps five seconds first, and that nothing can stop or wait for.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	binDir    string // holds the built distlock; removed by TestMain
	binPath   string
	buildErr  error
)

// distlockBin builds the distlock command once per test binary (with -race
// when the tests run with it) and returns its path.
func distlockBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "distlock-cmd-test-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "distlock")
		args := []string{"build", "-o", binPath}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command(goTool(), append(args, ".")...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return binPath
}

// goTool finds the go command that runs these tests.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(os.Getenv("GOROOT"), "bin", "go")
}

// proc is a running distlock process.
type proc struct {
	cmd    *exec.Cmd
	stdout lockedBuffer
	stderr lockedBuffer
	done   chan struct{} // closed when the process has exited and its output is read
}

// lockedBuffer is a bytes.Buffer that may be read while the process writes
// to it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// start starts distlock with args. Its environment is the test's, without
// REDIS_URL, plus whatever env adds; the child commands find the test binary
// in the same environment (see child). It is killed when the test ends if
// it is still running.
func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(distlockBin(t), args...), done: make(chan struct{})}
	// A -race binary sleeps a second at exit unless told otherwise; the
	// tests start many of them (distlock and its child commands).
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	p.cmd.Env = append(os.Environ(), "REDIS_URL=", childEnv+"=1", "GORACE="+gorace)
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	// A command left behind holding distlock's output open must not hang
	// the test.
	p.cmd.WaitDelay = 5 * time.Second
	require.NoError(t, p.cmd.Start())
	go func() {
		defer close(p.done)
		_ = p.cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			// distlock's command dies with it (Pdeathsig).
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits for p to exit and returns its exit status.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(exitWait):
		t.Fatalf("distlock %q did not exit; stderr so far:\n%s", p.cmd.Args[1:], p.stderr.String())
	}
	assert.NotContains(t, p.stderr.String(), "DATA RACE")
	return p.cmd.ProcessState.ExitCode()
}

// waitStderr waits until p has written want to stderr.
func (p *proc) waitStderr(t *testing.T, want string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(p.stderr.String(), want) }, eventually, pollEvery,
		"distlock never wrote %q; stderr:\n%s", want, &p.stderr)
}

// signal sends sig to the distlock process.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// runDistlock runs distlock to the end and returns its status, stdout and
// stderr.
func runDistlock(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := start(t, nil, args...)
	code = p.wait(t)
	return code, p.stdout.String(), p.stderr.String()
}

// Help goes to stdout: the overview, and each command's text, flags and
// exit codes, asked for with "help COMMAND" or "COMMAND -h".
func TestHelp(t *testing.T) {
	code, out, errOut := runDistlock(t, "help")
	assert.Equal(t, exitOK, code)
	assert.Empty(t, errOut)
	for _, want := range []string{"distlock run --", "distlock run -n", "distlock run -w 30", "-c '",
		"distlock inspect ", "if distlock inspect", "distlock inspect --watch", "distlock demo --workers",
		"distlock break ",
		"distlock --version", "Exit status:", "64 ", "75", "125"} {
		assert.Contains(t, out, want, "the overview lacks it")
	}
	for _, sub := range []string{"run", "inspect", "break", "demo"} {
		for _, args := range [][]string{{sub, "-h"}, {sub, "--help"}, {"help", sub}} {
			code, out, errOut := runDistlock(t, args...)
			assert.Equal(t, exitOK, code, "%q", args)
			assert.Empty(t, errOut, "%q", args)
			for _, want := range []string{"Usage: distlock " + sub + " ", "Example", "Exit status:", "64 ", "Flags:",
				"--redis URL", "--namespace NAMESPACE"} {
				assert.Contains(t, out, want, "%q", args)
			}
		}
	}
	_, out, _ = runDistlock(t, "help", "run")
	for _, want := range []string{"DISTLOCK_TOKEN", "75", "76", "125", "126", "127", "128+N", "--grace DURATION",
		"-n, --nonblock, --try\n", "-w, --timeout, --wait SECONDS\n", "-E, --conflict-exit-code CODE\n", "-c, --command LINE\n",
		"-v, --verbose\n", "flock(1)", "--permits N\n", "distlock run --permits 4"} {
		assert.Contains(t, out, want)
	}
	_, out, _ = runDistlock(t, "help", "inspect")
	for _, want := range []string{"semaphore", "election", "observers", "free_permits"} {
		assert.Contains(t, out, want)
	}
	assert.Regexp(t, `(?m)^  0 +the lock is held`, out)
	assert.Regexp(t, `(?m)^  1 +the lock is free`, out)
}

func TestUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	assert.Equal(t, exitUsage, run(t.Context(), nil, &out, &errOut))
	assert.Equal(t, exitUsage, run(t.Context(), []string{"nope"}, &out, &errOut))
	assert.True(t, strings.Contains(errOut.String(), "unknown command"))
	errOut.Reset()
	assert.Equal(t, exitUsage, run(t.Context(), []string{"demo", "--workers", "0"}, &out, &errOut))
	assert.Contains(t, errOut.String(), "--workers")
	assert.Equal(t, exitOK, run(t.Context(), []string{"help"}, &out, &errOut))
	assert.Equal(t, exitOK, run(t.Context(), []string{"demo", "-h"}, &out, &errOut))
}
