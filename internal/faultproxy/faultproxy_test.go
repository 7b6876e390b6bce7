package faultproxy_test

import (
	"bytes"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/distkit-go/distlock/internal/faultproxy"
)

const (
	// ioTimeout bounds every read and wait that is expected to succeed.
	ioTimeout = 5 * time.Second
	// poll is the interval of require.Eventually.
	poll = 5 * time.Millisecond
	// quiet is how long a test watches for bytes that must not arrive. A
	// check for absence can only watch for a while; bytes let through on
	// loopback arrive in well under this.
	quiet = 150 * time.Millisecond
)

// echoServer is a TCP echo server on a free loopback port. It counts the
// bytes it reads and writes and the connections it has finished.
type echoServer struct {
	ln       net.Listener
	wg       sync.WaitGroup
	received atomic.Int64
	sent     atomic.Int64
	finished atomic.Int64

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	closing bool
}

// startEcho starts an echo server, stopped and waited for when the test ends.
func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err, "listen")
	e := &echoServer{ln: ln, conns: make(map[net.Conn]struct{})}
	e.wg.Go(e.accept)
	t.Cleanup(func() {
		_ = e.ln.Close()
		e.mu.Lock()
		e.closing = true
		e.mu.Unlock()
		e.closeConns()
		e.wg.Wait()
	})
	return e
}

func (e *echoServer) addr() string { return e.ln.Addr().String() }

func (e *echoServer) accept() {
	for {
		c, err := e.ln.Accept()
		if err != nil {
			return // closed
		}
		e.mu.Lock()
		if e.closing {
			e.mu.Unlock()
			_ = c.Close()
			return
		}
		e.conns[c] = struct{}{}
		e.mu.Unlock()
		e.wg.Go(func() { e.serve(c) })
	}
}

func (e *echoServer) serve(c net.Conn) {
	defer e.finished.Add(1)
	defer func() {
		e.mu.Lock()
		delete(e.conns, c)
		e.mu.Unlock()
		_ = c.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		e.received.Add(int64(n))
		if n > 0 {
			m, werr := c.Write(buf[:n])
			e.sent.Add(int64(m))
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// closeConns closes the server side of every open connection.
func (e *echoServer) closeConns() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for c := range e.conns {
		_ = c.Close()
	}
}

// dial connects to addr and closes the connection when the test ends.
func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, ioTimeout)
	require.NoError(t, err, "dial %s", addr)
	t.Cleanup(func() { _ = c.Close() })
	return c.(*net.TCPConn)
}

// write writes s to c.
func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	require.NoError(t, c.SetWriteDeadline(time.Now().Add(ioTimeout)))
	_, err := c.Write([]byte(s))
	require.NoError(t, err, "write %q", s)
}

// readN reads exactly n bytes from c within ioTimeout.
func readN(t *testing.T, c net.Conn, n int) string {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(ioTimeout)))
	buf := make([]byte, n)
	got, err := io.ReadFull(c, buf)
	require.NoError(t, err, "read %d bytes, got %q", n, buf[:got])
	return string(buf)
}

// echo writes s to c and checks that it comes back.
func echo(t *testing.T, c net.Conn, s string) {
	t.Helper()
	write(t, c, s)
	got := readN(t, c, len(s))
	require.Equal(t, s, got, "echo of %q", s)
}

// assertNothingArrives checks that c delivers no byte for a while.
func assertNothingArrives(t *testing.T, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(quiet)))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	require.Zero(t, n, "bytes that arrived: %q", buf[:n])
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "read error")
}

// readClosed reads c until it fails and returns what it read, checking that
// the connection was closed (EOF or reset) rather than timing out.
func readClosed(t *testing.T, c net.Conn) string {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(ioTimeout)))
	got, err := io.ReadAll(c)
	if err != nil {
		require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "connection still open; read %q", got)
	}
	return string(got)
}

// warmLink starts an echo server and a proxy to it, and returns them with
// a connection through the proxy that has echoed "warm".
func warmLink(t *testing.T) (*echoServer, *faultproxy.Proxy, *net.TCPConn) {
	t.Helper()
	e := startEcho(t)
	p := faultproxy.New(t, e.addr())
	c := dial(t, p.Addr())
	echo(t, c, "warm")
	return e, p, c
}

// waitHeldUp waits until p holds n bytes on the way up.
func waitHeldUp(t *testing.T, p *faultproxy.Proxy, n int) {
	t.Helper()
	require.True(t, p.WaitHeld(faultproxy.Up, n, ioTimeout), "held up: %d bytes, want %d", p.Held(faultproxy.Up), n)
}

// noMoreHeldUp checks, for a while, that p holds no more than n bytes on
// the way up, and that it holds n.
func noMoreHeldUp(t *testing.T, p *faultproxy.Proxy, n int) {
	t.Helper()
	assert.False(t, p.WaitHeld(faultproxy.Up, n+1, quiet), "more held than sent")
	assert.Equal(t, n, p.Held(faultproxy.Up), "bytes held up")
}

// waitReceived waits until the echo server has read want bytes in all.
func waitReceived(t *testing.T, e *echoServer, want int64) {
	t.Helper()
	require.Eventually(t, func() bool { return e.received.Load() >= want }, ioTimeout, poll,
		"echo server received %d bytes, want %d", e.received.Load(), want)
	require.Equal(t, want, e.received.Load(), "bytes the echo server received")
}

func TestPass(t *testing.T) {
	e := startEcho(t)
	p := faultproxy.New(t, e.addr())
	assert.Equal(t, faultproxy.Pass, p.Mode(faultproxy.Up), "initial mode up")
	assert.Equal(t, faultproxy.Pass, p.Mode(faultproxy.Down), "initial mode down")

	c := dial(t, p.Addr())
	echo(t, c, "hello")
	echo(t, c, "world")

	t.Run("large", func(t *testing.T) {
		// More than the socket buffers hold, so the proxy must keep both
		// directions moving at once.
		want := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
		werr := make(chan error, 1)
		go func() {
			if err := c.SetWriteDeadline(time.Now().Add(ioTimeout)); err != nil {
				werr <- err
				return
			}
			_, err := c.Write(want)
			werr <- err
		}()
		got := readN(t, c, len(want))
		require.NoError(t, <-werr, "write")
		assert.True(t, bytes.Equal(want, []byte(got)), "1 MiB echo differs")
	})

	t.Run("two clients", func(t *testing.T) {
		c2 := dial(t, p.Addr())
		echo(t, c2, "second")
		echo(t, c, "first")
	})
}

func TestPauseDown(t *testing.T) {
	e, p, c := warmLink(t)

	p.Set(faultproxy.Down, faultproxy.Pause)
	assert.Equal(t, faultproxy.Pause, p.Mode(faultproxy.Down))
	assert.Equal(t, faultproxy.Pass, p.Mode(faultproxy.Up), "the other direction")

	parts := []string{"one,", "two,", "three"}
	sent := int64(len("warm"))
	for _, s := range parts {
		write(t, c, s)
		sent += int64(len(s))
		waitReceived(t, e, sent) // up still passes; the server echoes
	}
	assertNothingArrives(t, c)

	p.Set(faultproxy.Down, faultproxy.Pass)
	got := readN(t, c, len("one,two,three"))
	assert.Equal(t, "one,two,three", got, "held replies, in order")
	echo(t, c, "after")
}

func TestPauseUp(t *testing.T) {
	e, p, c := warmLink(t)
	before := e.received.Load()

	p.Set(faultproxy.Up, faultproxy.Pause)
	for _, s := range []string{"one,", "two,", "three"} {
		write(t, c, s)
	}
	assertNothingArrives(t, c)
	assert.Equal(t, before, e.received.Load(), "bytes the server received while up was paused")

	p.Set(faultproxy.Up, faultproxy.Pass)
	got := readN(t, c, len("one,two,three"))
	assert.Equal(t, "one,two,three", got, "held requests, in order")
	waitReceived(t, e, before+int64(len("one,two,three")))
}

// TestHoldUp: requests held on the way up wait at the proxy, counted by
// Held, while replies to earlier requests keep coming down; on release they
// land in order.
func TestHoldUp(t *testing.T) {
	e, p, c := warmLink(t)

	// A reply on its way down when the uplink stalls still arrives.
	p.Set(faultproxy.Down, faultproxy.Pause)
	write(t, c, "early")
	waitReceived(t, e, int64(len("warmearly")))
	p.Set(faultproxy.Up, faultproxy.Hold)
	p.Set(faultproxy.Down, faultproxy.Pass)
	assert.Equal(t, "early", readN(t, c, len("early")), "the reply sent before the hold")

	for _, s := range []string{"one,", "two,", "three"} {
		write(t, c, s)
	}
	waitHeldUp(t, p, len("one,two,three"))
	assert.Equal(t, len("one,two,three"), p.Held(faultproxy.Up), "bytes held up")
	assert.Zero(t, p.Held(faultproxy.Down), "bytes held down")
	assertNothingArrives(t, c)
	assert.Equal(t, int64(len("warmearly")), e.received.Load(), "bytes the server received while up was held")

	p.Set(faultproxy.Up, faultproxy.Pass)
	assert.Equal(t, "one,two,three", readN(t, c, len("one,two,three")), "held requests, in order")
	assert.Zero(t, p.Held(faultproxy.Up), "bytes held up after the release")
	echo(t, c, "after")
}

// TestHoldOutlivesTheSender: requests held on the way up land after their
// sender has closed its connection, as a stalled path delivers what was
// sent before the close; Pause drops them instead. The server then reads
// the end of the stream and the connection ends.
func TestHoldOutlivesTheSender(t *testing.T) {
	for _, tc := range []struct {
		mode faultproxy.Mode
		want int64 // bytes of "late" the server gets
	}{
		{faultproxy.Hold, int64(len("late"))},
		{faultproxy.Pause, 0},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			e, p, c := warmLink(t)

			p.Set(faultproxy.Up, tc.mode)
			write(t, c, "late")
			waitHeldUp(t, p, len("late"))
			require.NoError(t, c.Close())
			if tc.mode == faultproxy.Pause {
				// The proxy drops the paused bytes once it reads the close.
				require.Eventually(t, func() bool { return p.Held(faultproxy.Up) == 0 }, ioTimeout, poll, "paused bytes dropped")
			} else {
				// Nothing the proxy can watch for: give it the time to
				// read the close before the release.
				noMoreHeldUp(t, p, len("late"))
			}
			assert.Equal(t, int64(len("warm")), e.received.Load(), "bytes the server received while held")

			p.Set(faultproxy.Up, faultproxy.Pass)
			waitReceived(t, e, int64(len("warm"))+tc.want)
			require.Eventually(t, func() bool { return e.finished.Load() == 1 }, ioTimeout, poll, "the server's side of the connection ended")
			assert.Zero(t, p.Held(faultproxy.Up), "bytes held up at the end")
		})
	}
}

// TestHoldReplyToAClosedSender: the replies to requests delivered after
// their sender closed are read and discarded; the held bytes behind the
// first still land.
func TestHoldReplyToAClosedSender(t *testing.T) {
	e, p, c := warmLink(t)
	p.Set(faultproxy.Up, faultproxy.Hold)
	big := bytes.Repeat([]byte("x"), 1<<20) // more than one chunk, with echoes in between
	require.NoError(t, c.SetWriteDeadline(time.Now().Add(ioTimeout)))
	_, err := c.Write(big)
	require.NoError(t, err)
	waitHeldUp(t, p, len(big))
	require.NoError(t, c.Close())
	noMoreHeldUp(t, p, len(big))
	p.Set(faultproxy.Up, faultproxy.Pass)
	waitReceived(t, e, int64(len("warm")+len(big)))
	require.Eventually(t, func() bool { return e.finished.Load() == 1 }, ioTimeout, poll, "the server's side of the connection ended")
}

// TestConnModes: a connection given a mode of its own keeps it while the
// proxy's changes, so held connections can be released one at a time.
func TestConnModes(t *testing.T) {
	e := startEcho(t)
	p := faultproxy.New(t, e.addr())
	c1 := dial(t, p.Addr())
	echo(t, c1, "one")
	c2 := dial(t, p.Addr())
	echo(t, c2, "two")
	conns := p.Conns()
	require.Len(t, conns, 2)

	p.Set(faultproxy.Up, faultproxy.Hold)
	write(t, c1, "first")
	waitHeldUp(t, p, len("first"))
	write(t, c2, "second")
	waitHeldUp(t, p, len("firstsecond"))
	assert.Equal(t, len("first"), conns[0].Held(faultproxy.Up), "held on the first connection")
	assert.Equal(t, len("second"), conns[1].Held(faultproxy.Up), "held on the second")
	assert.True(t, conns[0].HeldSince(faultproxy.Up).Before(conns[1].HeldSince(faultproxy.Up)), "the first was sent first")

	// The later connection goes first; the earlier stays held.
	conns[1].Set(faultproxy.Up, faultproxy.Pass)
	assert.Equal(t, "second", readN(t, c2, len("second")))
	assertNothingArrives(t, c1)
	assert.Zero(t, conns[1].Held(faultproxy.Up))
	assert.True(t, conns[1].HeldSince(faultproxy.Up).IsZero())

	// A connection with a mode of its own ignores the proxy's changes
	// until it follows them again.
	conns[1].Set(faultproxy.Up, faultproxy.Hold)
	p.Set(faultproxy.Up, faultproxy.Pass)
	assert.Equal(t, "first", readN(t, c1, len("first")))
	write(t, c2, "third")
	assertNothingArrives(t, c2)
	conns[1].Follow(faultproxy.Up)
	assert.Equal(t, "third", readN(t, c2, len("third")))
}

// TestHoldDiscardedByReset: Reset drops held bytes with their connection.
func TestHoldDiscardedByReset(t *testing.T) {
	e, p, c := warmLink(t)
	p.Set(faultproxy.Up, faultproxy.Hold)
	write(t, c, "lost")
	waitHeldUp(t, p, len("lost"))
	p.Reset()
	require.Eventually(t, func() bool { return p.Held(faultproxy.Up) == 0 }, ioTimeout, poll, "held bytes dropped")
	readClosed(t, c)
	p.Set(faultproxy.Up, faultproxy.Pass)
	require.Eventually(t, func() bool { return e.finished.Load() == 1 }, ioTimeout, poll, "the server's side of the connection ended")
	assert.Equal(t, int64(len("warm")), e.received.Load(), "bytes the server received")
	c2 := dial(t, p.Addr())
	echo(t, c2, "new")
}

func TestPauseThenDelay(t *testing.T) {
	// Pause is also lifted by a change to Delay; bytes held longer than the
	// delay go out at once.
	e := startEcho(t)
	p := faultproxy.New(t, e.addr())
	c := dial(t, p.Addr())

	p.SetDelay(faultproxy.Down, 10*time.Millisecond)
	p.Set(faultproxy.Down, faultproxy.Pause)
	write(t, c, "held")
	waitReceived(t, e, 4)
	assertNothingArrives(t, c)

	p.Set(faultproxy.Down, faultproxy.Delay)
	assert.Equal(t, "held", readN(t, c, 4))
}

func TestBlackhole(t *testing.T) {
	t.Run("up", func(t *testing.T) {
		e := startEcho(t)
		p := faultproxy.New(t, e.addr())
		c := dial(t, p.Addr())
		echo(t, c, "warm")
		before := e.received.Load()

		p.Set(faultproxy.Up, faultproxy.Blackhole)
		write(t, c, "lost")
		// The proxy reads "lost" before it reads the end of the stream,
		// and closes the link at the end: if it had kept the bytes, the
		// server would read them before its connection ends.
		require.NoError(t, c.CloseWrite())
		assert.Empty(t, readClosed(t, c), "bytes the client got back")
		require.Eventually(t, func() bool { return e.finished.Load() == 1 }, ioTimeout, poll,
			"server connections finished: got %d, want 1", e.finished.Load())
		assert.Equal(t, before, e.received.Load(), "bytes the server received")
	})

	t.Run("down", func(t *testing.T) {
		e := startEcho(t)
		p := faultproxy.New(t, e.addr())
		c := dial(t, p.Addr())
		echo(t, c, "warm")

		p.Set(faultproxy.Down, faultproxy.Blackhole)
		write(t, c, "lost")
		waitReceived(t, e, int64(len("warmlost")))
		require.Eventually(t, func() bool { return e.sent.Load() == int64(len("warmlost")) }, ioTimeout, poll,
			"echo server sent %d bytes", e.sent.Load())
		// The server hangs up after its echo: the proxy reads "lost" before
		// the end of the stream, then closes the link.
		e.closeConns()
		assert.Empty(t, readClosed(t, c), "bytes the client got")
	})
}

func TestDelay(t *testing.T) {
	// The machine is small and busy: assert the delay as a lower bound and
	// give the upper bound a wide margin.
	const (
		delay = 200 * time.Millisecond
		slack = 2 * time.Second
	)

	t.Run("down", func(t *testing.T) {
		e := startEcho(t)
		p := faultproxy.New(t, e.addr())
		c := dial(t, p.Addr())
		echo(t, c, "warm")

		p.SetDelay(faultproxy.Down, delay)
		p.Set(faultproxy.Down, faultproxy.Delay)
		start := time.Now()
		echo(t, c, "slow")
		got := time.Since(start)
		assert.GreaterOrEqual(t, got, delay, "round trip with down delayed")
		assert.Less(t, got, delay+slack, "round trip with down delayed")
	})

	t.Run("both", func(t *testing.T) {
		e := startEcho(t)
		p := faultproxy.New(t, e.addr())
		c := dial(t, p.Addr())
		echo(t, c, "warm")

		p.SetDelay(faultproxy.Up, delay)
		p.SetDelay(faultproxy.Down, delay)
		p.SetBoth(faultproxy.Delay)
		start := time.Now()
		echo(t, c, "slow")
		got := time.Since(start)
		assert.GreaterOrEqual(t, got, 2*delay, "round trip with both directions delayed")
		assert.Less(t, got, 2*delay+slack, "round trip with both directions delayed")

		// Delayed chunks keep their order.
		start = time.Now()
		write(t, c, "a")
		write(t, c, "b")
		assert.Equal(t, "ab", readN(t, c, 2), "order of delayed chunks")
		got = time.Since(start)
		assert.GreaterOrEqual(t, got, 2*delay, "round trip of two chunks")
		assert.Less(t, got, 2*delay+slack, "round trip of two chunks")
	})

	t.Run("back to pass", func(t *testing.T) {
		e := startEcho(t)
		p := faultproxy.New(t, e.addr())
		c := dial(t, p.Addr())

		p.SetDelay(faultproxy.Down, delay)
		p.Set(faultproxy.Down, faultproxy.Delay)
		echo(t, c, "slow")
		p.Set(faultproxy.Down, faultproxy.Pass)
		echo(t, c, "fast")
	})
}

func TestReset(t *testing.T) {
	e := startEcho(t)
	p := faultproxy.New(t, e.addr())
	c1 := dial(t, p.Addr())
	c2 := dial(t, p.Addr())
	echo(t, c1, "one")
	echo(t, c2, "two")

	p.Reset()
	assert.Empty(t, readClosed(t, c1), "bytes on a reset connection")
	assert.Empty(t, readClosed(t, c2), "bytes on a reset connection")
	require.Eventually(t, func() bool { return e.finished.Load() == 2 }, ioTimeout, poll,
		"server connections finished: got %d, want 2", e.finished.Load())

	c3 := dial(t, p.Addr())
	echo(t, c3, "new connection after reset")

	t.Run("discards paused bytes", func(t *testing.T) {
		p.Set(faultproxy.Down, faultproxy.Pause)
		write(t, c3, "held")
		total := int64(len("onetwonew connection after resetheld"))
		waitReceived(t, e, total)
		require.Eventually(t, func() bool { return e.sent.Load() == total }, ioTimeout, poll,
			"echo server sent %d bytes, want %d", e.sent.Load(), total)
		p.Reset()
		assert.Empty(t, readClosed(t, c3), "held bytes delivered after reset")
		assert.Equal(t, faultproxy.Pause, p.Mode(faultproxy.Down), "Reset keeps the modes")
	})
}

func TestHeal(t *testing.T) {
	e := startEcho(t)
	p := faultproxy.New(t, e.addr())
	c := dial(t, p.Addr())
	echo(t, c, "before")

	p.SetBoth(faultproxy.Blackhole)
	assert.Equal(t, faultproxy.Blackhole, p.Mode(faultproxy.Up))
	assert.Equal(t, faultproxy.Blackhole, p.Mode(faultproxy.Down))

	p.Heal()
	assert.Equal(t, faultproxy.Pass, p.Mode(faultproxy.Up), "mode up after Heal")
	assert.Equal(t, faultproxy.Pass, p.Mode(faultproxy.Down), "mode down after Heal")
	assert.Empty(t, readClosed(t, c), "bytes on the healed connection")

	c2 := dial(t, p.Addr())
	echo(t, c2, "after")
}

func TestClose(t *testing.T) {
	e := startEcho(t)
	// Everything started from here on belongs to the proxy or to
	// connections it ends.
	ignore := goleak.IgnoreCurrent()
	p := faultproxy.New(t, e.addr())

	idle := dial(t, p.Addr())
	echo(t, idle, "idle")
	paused := dial(t, p.Addr())
	echo(t, paused, "paused")
	p.Set(faultproxy.Down, faultproxy.Pause)
	write(t, paused, "held")

	p.Close()
	assert.Empty(t, readClosed(t, idle), "bytes on a closed proxy's connection")
	assert.Empty(t, readClosed(t, paused), "held bytes after Close")

	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Close()
		p.Close()
	}()
	select {
	case <-done:
	case <-time.After(ioTimeout):
		t.Fatal("second Close did not return")
	}

	// The proxy's goroutines are gone (Close waited for them, the accept
	// loop included), and the echo server's handlers end once the proxy
	// has closed its side.
	goleak.VerifyNone(t, ignore)
}

func TestUnreachableTarget(t *testing.T) {
	// A target that refuses: the proxy accepts, fails to dial, and closes
	// the client at once; it keeps serving.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	target := ln.Addr().String()
	require.NoError(t, ln.Close())

	p := faultproxy.New(t, target)
	c := dial(t, p.Addr())
	assert.Empty(t, readClosed(t, c), "bytes from an unreachable target")
	c2 := dial(t, p.Addr())
	assert.Empty(t, readClosed(t, c2), "bytes from an unreachable target")
}

func TestRefuseAndHeal(t *testing.T) {
	e := startEcho(t)
	p := faultproxy.New(t, e.addr())
	addr := p.Addr()
	c := dial(t, addr)
	echo(t, c, "before")

	p.Refuse()
	assert.Empty(t, readClosed(t, c), "bytes on a connection cut by Refuse")
	_, err := net.DialTimeout("tcp", addr, ioTimeout)
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "dial while refusing")
	p.Refuse() // again: harmless

	p.Heal()
	assert.Equal(t, addr, p.Addr(), "address after Heal")
	c2 := dial(t, addr)
	echo(t, c2, "after")

	t.Run("heal without refuse", func(t *testing.T) {
		p.Heal()
		c3 := dial(t, addr)
		echo(t, c3, "still open")
	})
	t.Run("close while refusing", func(t *testing.T) {
		p2 := faultproxy.New(t, e.addr())
		p2.Refuse()
		p2.Close()
		p2.Heal() // after Close: does nothing
		_, err := net.DialTimeout("tcp", p2.Addr(), ioTimeout)
		require.Error(t, err)
	})
}

func TestStrings(t *testing.T) {
	for _, tc := range []struct {
		got  interface{ String() string }
		want string
	}{
		{faultproxy.Up, "up"},
		{faultproxy.Down, "down"},
		{faultproxy.Pass, "pass"},
		{faultproxy.Pause, "pause"},
		{faultproxy.Blackhole, "blackhole"},
		{faultproxy.Delay, "delay"},
		{faultproxy.Hold, "hold"},
		{faultproxy.Mode(99), "mode?"},
	} {
		assert.Equal(t, tc.want, tc.got.String())
	}
}
