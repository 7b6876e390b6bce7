package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/redis/rueidis"
)

// CommandCounter counts the commands a client sends, as the client sees
// them: a script run by EVALSHA is one command, whatever it calls inside
// (Redis's own total_commands_processed counts those calls too).
type CommandCounter struct {
	n atomic.Int64
}

// Load returns the number of commands sent so far.
func (c *CommandCounter) Load() int64 { return c.n.Load() }

// CountingClient returns a client of the server, closed when the test ends,
// and the counter of the commands it sends.
func (s *Server) CountingClient(tb testing.TB) (rueidis.Client, *CommandCounter) {
	tb.Helper()
	opt, counter := WithCounting(s.ClientOption())
	return NewClient(tb, opt), counter
}

// WithCounting returns opt with a dialer whose connections count the
// commands written to them, and the counter. It replaces opt's DialCtxFn and
// dials plain TCP. It serves where no test is at hand, such as a helper
// process that gets the server's address from its parent.
func WithCounting(opt rueidis.ClientOption) (rueidis.ClientOption, *CommandCounter) {
	counter := &CommandCounter{}
	opt.DialCtxFn = func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return counter.Wrap(conn), nil
	}
	return opt, counter
}

// Wrap returns conn with the commands written to it counted in c, for a
// client that dials through a function of its own (go-redis's
// Options.Dialer, say). Several connections may share one counter.
func (c *CommandCounter) Wrap(conn net.Conn) net.Conn {
	return &countingConn{Conn: conn, counter: c}
}

// countingConn parses the RESP arrays written to it and counts them.
type countingConn struct {
	net.Conn
	counter *CommandCounter

	mu    sync.Mutex
	state respState
}

// SyscallConn gives the file descriptor of the connection underneath, so
// that a client that peeks at a pooled connection's socket to check its
// health (go-redis does, to drop one with a stale reply in it) treats a
// counted connection as it treats a plain one.
func (c *countingConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("redistest: the counted connection has no file descriptor")
	}
	return sc.SyscallConn()
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.counter.n.Add(int64(c.state.feed(p)))
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// respState follows a stream of RESP requests (arrays of bulk strings) and
// counts the complete arrays.
type respState struct {
	header   []byte // the "*N" or "$N" line being read
	inHeader bool
	elems    int // bulk strings left in the current array
	skip     int // bytes of the current bulk string (and its CRLF) left
}

func (r *respState) feed(p []byte) int {
	done := 0
	for len(p) > 0 {
		if r.skip > 0 {
			n := min(r.skip, len(p))
			r.skip -= n
			p = p[n:]
			if r.skip == 0 && r.elems == 0 {
				done++
			}
			continue
		}
		b := p[0]
		p = p[1:]
		if !r.inHeader {
			if b == '*' || b == '$' {
				r.inHeader, r.header = true, append(r.header[:0], b)
			}
			continue
		}
		if b == '\n' {
			r.inHeader = false
			n := 0
			for _, d := range r.header[1:] {
				if d >= '0' && d <= '9' {
					n = n*10 + int(d-'0')
				}
			}
			if r.header[0] == '*' {
				r.elems = n
				if n == 0 {
					done++
				}
			} else {
				r.elems--
				r.skip = n + 2
			}
			continue
		}
		r.header = append(r.header, b)
	}
	return done
}
