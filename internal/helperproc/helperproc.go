// Package helperproc runs part of a test in a process of its own, so that
// the test can freeze it (SIGSTOP), thaw it (SIGCONT) or kill it (SIGKILL),
// as a scheduler, an operator or the OOM killer would do to a lock holder.
//
// The helper is the test binary itself, started again with the environment
// variable that [Role] reads. A package that uses helpers checks it first
// thing in TestMain, before goleak and before any test runs:
//
//	func TestMain(m *testing.M) {
//		if role := helperproc.Role(); role != "" {
//			os.Exit(runHelper(role)) // the helper's own main
//		}
//		goleak.VerifyTestMain(m)
//	}
//
// The test and its helper talk in JSON lines: the helper reads the test's
// messages on stdin and writes its own on stdout ([Parent] gives it both);
// the test uses [Proc.Send] and [Proc.Recv]. The helper's stderr is kept
// and logged if the test fails.
package helperproc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
)

// roleVar names the environment variable that carries a helper's role.
const roleVar = "DISTLOCK_TEST_HELPER_ROLE"

// maxLine bounds one message line.
const maxLine = 1 << 20

// ErrExited is returned by [Proc.Recv] once the helper has closed its stdout
// (usually because it exited) and every line it wrote has been read.
var ErrExited = errors.New("helperproc: helper exited")

// Role returns the role this process was started in by [Start], or "" in a
// normal test run.
func Role() string { return os.Getenv(roleVar) }

// Proc is a running helper process. Its methods are safe for concurrent
// use; lines from the helper are queued without limit until Recv takes them,
// so a helper never blocks on a test that reads slowly.
type Proc struct {
	tb   testing.TB
	role string
	cmd  *exec.Cmd

	sendMu sync.Mutex
	stdin  io.WriteCloser

	// The reader appends stdout's lines to queue, never blocking on a slow
	// test, and pokes ready; eof and readErr are set at the end of stdout.
	mu      sync.Mutex
	queue   [][]byte
	eof     bool
	readErr error
	ready   chan struct{} // capacity 1: "queue or eof changed"

	exited chan struct{} // closed once the process has been waited for
	stderr lockedBuffer

	waitErr error // set before exited is closed
}

// Start runs the test binary again as a helper in role, with env
// ("NAME=value") added to its environment. The helper is killed when the
// test ends, and it never outlives the test binary (it gets SIGKILL if the
// test binary dies).
func Start(tb testing.TB, role string, env ...string) *Proc {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatalf("helperproc: %v", err)
	}
	// If a package forgot to dispatch on Role in TestMain, run no test and
	// exit rather than run the whole suite again.
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), roleVar+"="+role), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &Proc{tb: tb, role: role, cmd: cmd, ready: make(chan struct{}, 1), exited: make(chan struct{})}
	cmd.Stderr = &p.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatalf("helperproc: %v", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatalf("helperproc: %v", err)
	}
	p.stdin = stdin
	if err := cmd.Start(); err != nil {
		tb.Fatalf("helperproc: starting %s: %v", role, err)
	}
	// The reader owns stdout and ends at EOF, which comes at the latest when
	// the process dies. The waiter reaps the process after the reader is
	// done, as exec.Cmd.Wait requires.
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), maxLine)
		for sc.Scan() {
			p.mu.Lock()
			p.queue = append(p.queue, bytes.Clone(sc.Bytes()))
			p.mu.Unlock()
			p.poke()
		}
		p.mu.Lock()
		p.eof, p.readErr = true, sc.Err()
		p.mu.Unlock()
		p.poke()
	}()
	go func() {
		defer close(p.exited)
		<-readerDone
		p.waitErr = cmd.Wait()
	}()
	tb.Cleanup(func() {
		p.Kill()
		if tb.Failed() {
			tb.Logf("helper %s (pid %d) stderr:\n%s", role, cmd.Process.Pid, p.stderr.String())
		}
	})
	return p
}

// Pid returns the helper's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Pause stops the helper with SIGSTOP. Every thread stops at once, as in a
// stopped VM or a long stop-the-world pause: its timers do not fire and its
// sockets are not read until [Proc.Resume].
func (p *Proc) Pause() { p.signal(syscall.SIGSTOP) }

// Resume continues a paused helper with SIGCONT.
func (p *Proc) Resume() { p.signal(syscall.SIGCONT) }

// Kill kills the helper with SIGKILL, as a crash would, and waits until it
// has been reaped and its output read. Killing a helper that has exited
// does nothing.
func (p *Proc) Kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a stopped process dies as well, but be tidy
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Wait waits until the helper exits and returns its error (nil for exit
// status 0), or returns ctx.Err() if ctx ends first.
func (p *Proc) Wait(ctx context.Context) error {
	select {
	case <-p.exited:
		return p.waitErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Send writes v to the helper's stdin as one JSON line.
func (p *Proc) Send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	_, err = p.stdin.Write(append(b, '\n'))
	return err
}

// CloseInput closes the helper's stdin, so that its [Link.Recv] returns
// [io.EOF].
func (p *Proc) CloseInput() error {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	return p.stdin.Close()
}

// Recv reads the helper's next line into v. It returns [ErrExited] once the
// helper has closed its stdout and every line has been read, and ctx.Err()
// if ctx ends first.
func (p *Proc) Recv(ctx context.Context, v any) error {
	for {
		p.mu.Lock()
		if len(p.queue) > 0 {
			line := p.queue[0]
			p.queue = p.queue[1:]
			p.mu.Unlock()
			if err := json.Unmarshal(line, v); err != nil {
				return fmt.Errorf("helperproc: bad line from %s: %q: %w", p.role, line, err)
			}
			return nil
		}
		eof, readErr := p.eof, p.readErr
		p.mu.Unlock()
		if eof {
			if readErr != nil {
				return fmt.Errorf("helperproc: reading %s: %w", p.role, readErr)
			}
			return ErrExited
		}
		select {
		case <-p.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// poke tells Recv that the queue or eof changed, without blocking.
func (p *Proc) poke() {
	select {
	case p.ready <- struct{}{}:
	default:
	}
}

func (p *Proc) signal(sig syscall.Signal) {
	p.tb.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.tb.Fatalf("helperproc: %v to %s: %v", sig, p.role, err)
	}
}

// Link is a helper's side of the conversation: JSON lines from the test on
// stdin, to the test on stdout. Send is safe for concurrent use; Recv must
// be called from one goroutine at a time.
type Link struct {
	in *bufio.Scanner

	mu  sync.Mutex
	out io.Writer
}

// Parent returns the link to the test that started this helper. Nothing
// else in the helper may use stdin or stdout.
func Parent() *Link {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	return &Link{in: sc, out: os.Stdout}
}

// Send writes v to the test as one JSON line.
func (l *Link) Send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = l.out.Write(append(b, '\n'))
	return err
}

// Recv reads the test's next line into v. It returns [io.EOF] when the test
// has closed the helper's stdin.
func (l *Link) Recv(v any) error {
	if !l.in.Scan() {
		if err := l.in.Err(); err != nil {
			return err
		}
		return io.EOF
	}
	return json.Unmarshal(l.in.Bytes(), v)
}

// lockedBuffer is a bytes.Buffer that exec's stderr copier and the test's
// cleanup may use at once.
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
