package helperproc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/internal/helperproc"
)

const (
	// waitFor bounds every wait for something that should happen soon.
	waitFor = 10 * time.Second
	// tickEvery is how often the ticker helper writes.
	tickEvery = 10 * time.Millisecond
	// frozen is how long a paused helper is watched for output.
	frozen = 300 * time.Millisecond
)

type msg struct {
	N    int    `json:"n"`
	Text string `json:"text,omitempty"`
}

// runHelper is the helpers' main.
func runHelper(role string) int {
	link := helperproc.Parent()
	switch role {
	case "echo": // answers each message with n+1, exits 0 at EOF
		for {
			var m msg
			if err := link.Recv(&m); err != nil {
				if errors.Is(err, io.EOF) {
					return 0
				}
				fmt.Fprintln(os.Stderr, "echo:", err)
				return 1
			}
			m.N++
			m.Text = os.Getenv("ECHO_PREFIX") + m.Text
			if err := link.Send(m); err != nil {
				return 1
			}
		}
	case "ticker": // writes a numbered line every tickEvery
		for i := 0; ; i++ {
			if err := link.Send(msg{N: i}); err != nil {
				return 1
			}
			time.Sleep(tickEvery)
		}
	case "flood": // writes far more than a pipe holds, then exits 0
		for i := range 20000 {
			if err := link.Send(msg{N: i, Text: "0123456789abcdef0123456789abcdef"}); err != nil {
				return 1
			}
		}
		return 0
	case "fail":
		fmt.Fprintln(os.Stderr, "failing on purpose")
		return 3
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

func ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	t.Cleanup(cancel)
	return ctx
}

func TestRoleEmptyInTests(t *testing.T) {
	assert.Empty(t, helperproc.Role())
}

func TestEcho(t *testing.T) {
	p := helperproc.Start(t, "echo", "ECHO_PREFIX=re: ")
	assert.Positive(t, p.Pid())
	for i := range 3 {
		require.NoError(t, p.Send(msg{N: i * 10, Text: "hi"}))
	}
	for i := range 3 {
		var got msg
		require.NoError(t, p.Recv(ctx(t), &got))
		assert.Equal(t, msg{N: i*10 + 1, Text: "re: hi"}, got)
	}
	require.NoError(t, p.CloseInput())
	var m msg
	require.ErrorIs(t, p.Recv(ctx(t), &m), helperproc.ErrExited)
	require.NoError(t, p.Wait(ctx(t)), "exit status")
}

func TestPauseResumeKill(t *testing.T) {
	p := helperproc.Start(t, "ticker")
	var m msg
	require.NoError(t, p.Recv(ctx(t), &m))

	p.Pause()
	// Drain what was written before the stop took effect, then expect
	// silence.
	drain := func() int {
		n := 0
		for {
			c, cancel := context.WithTimeout(t.Context(), frozen)
			err := p.Recv(c, &m)
			cancel()
			if err != nil {
				require.ErrorIs(t, err, context.DeadlineExceeded)
				return n
			}
			n++
		}
	}
	drain()
	assert.Zero(t, drain(), "lines from a stopped helper")

	p.Resume()
	require.NoError(t, p.Recv(ctx(t), &m), "no line after SIGCONT")

	p.Kill()
	for {
		err := p.Recv(ctx(t), &m)
		if err != nil {
			require.ErrorIs(t, err, helperproc.ErrExited)
			break
		}
	}
	err := p.Wait(ctx(t))
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, "signal: killed", ee.Error())
	p.Kill() // again: harmless
}

func TestKillWhilePaused(t *testing.T) {
	p := helperproc.Start(t, "ticker")
	var m msg
	require.NoError(t, p.Recv(ctx(t), &m))
	p.Pause()
	p.Kill()
	require.Error(t, p.Wait(ctx(t)))
}

func TestExitStatus(t *testing.T) {
	p := helperproc.Start(t, "fail")
	err := p.Wait(ctx(t))
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 3, ee.ExitCode())
}

func TestUnreadOutputDoesNotBlock(t *testing.T) {
	// A helper that writes far more than a pipe holds, to a test that reads
	// nothing yet, still runs to its end; every line is kept, in order.
	p := helperproc.Start(t, "flood")
	require.NoError(t, p.Wait(ctx(t)))
	var m msg
	for i := range 20000 {
		require.NoError(t, p.Recv(ctx(t), &m))
		require.Equal(t, i, m.N)
	}
	require.ErrorIs(t, p.Recv(ctx(t), &m), helperproc.ErrExited)
}
