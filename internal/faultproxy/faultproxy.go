// Package faultproxy is an in-process TCP proxy that injects network faults
// between one client and a server, for tests.
//
// Each direction (client to server, server to client) has its own [Mode]:
// pass bytes through, pause them (hold and deliver on the next change of
// mode), hold them as a stalled path does (deliver them later even if the
// sender has moved on and closed), blackhole them (read and discard), or
// delay each chunk by a fixed time; a connection can also be given modes
// of its own ([Proxy.Conns]). [Proxy.Reset] closes every connection, as a
// crashed network path or a restarted server would, and [Proxy.Refuse]
// also closes the proxy's port until [Proxy.Heal], as a dead server or a
// rejecting firewall would. Give each client under test its own proxy to
// cut it off alone.
package faultproxy

import (
	"net"
	"slices"
	"sync"
	"testing"
	"time"
)

// Direction selects which way bytes flow.
type Direction int

const (
	// Up is client to server.
	Up Direction = iota
	// Down is server to client.
	Down
)

func (d Direction) String() string {
	if d == Up {
		return "up"
	}
	return "down"
}

// Mode is what the proxy does with bytes in one direction.
type Mode int

const (
	// Pass forwards bytes as they come.
	Pass Mode = iota
	// Pause holds bytes; they are delivered, in order, once the mode changes
	// to Pass or Delay.
	Pause
	// Blackhole reads bytes and discards them. A connection that lost bytes
	// is no longer a valid byte stream, so heal a blackhole with [Proxy.Heal]
	// (which also resets), as a real partition ends with a dead connection.
	Blackhole
	// Delay forwards each chunk after the proxy's delay (see [Proxy.SetDelay]).
	Delay
	// Hold is delayed delivery: a path that stalls and later delivers, not
	// one that breaks. Bytes are held and delivered, in order, once the
	// mode changes to Pass or Delay, like Pause; unlike Pause, they are
	// delivered even if their sender has closed its connection meanwhile
	// (the proxy then half-closes the receiver's side after the last held
	// byte and reads its answers to the end, as the network's buffers would
	// have delivered what was sent before a close), and the other
	// direction keeps flowing. Held on the client-to-server side, requests
	// land after the client has given up on them. Only [Proxy.Reset],
	// [Proxy.Refuse], [Proxy.Heal] and [Proxy.Close] discard held bytes.
	Hold
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Pause:
		return "pause"
	case Blackhole:
		return "blackhole"
	case Delay:
		return "delay"
	case Hold:
		return "hold"
	}
	return "mode?"
}

// Proxy forwards connections from its own loopback address to a target.
type Proxy struct {
	tb     testing.TB
	target string
	addr   string

	mu     sync.Mutex
	cond   *sync.Cond   // signalled on every change of mode and on close
	ln     net.Listener // nil while the port is closed by Refuse
	modes  [2]Mode
	delay  [2]time.Duration
	held   [2]int // bytes read from a sender and not yet written, by direction
	links  map[*link]struct{}
	seq    int // connections accepted so far
	closed bool
	wg     sync.WaitGroup
}

// New starts a proxy to target ("host:port") on a free loopback port. It is
// closed when the test ends.
func New(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("faultproxy: listen: %v", err)
	}
	p := &Proxy{tb: tb, target: target, addr: ln.Addr().String(), ln: ln, links: make(map[*link]struct{})}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Go(func() { p.accept(ln) })
	tb.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's "host:port", to give to the client. It stays the
// same across [Proxy.Refuse] and [Proxy.Heal].
func (p *Proxy) Addr() string { return p.addr }

// Set sets the mode of one direction, for every connection but those given
// a mode of their own ([Conn.Set]).
func (p *Proxy) Set(d Direction, m Mode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.modes[d] = m
	p.cond.Broadcast()
}

// SetBoth sets the mode of both directions, as Set does.
func (p *Proxy) SetBoth(m Mode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.modes = [2]Mode{m, m}
	p.cond.Broadcast()
}

// SetDelay sets the delay used by [Delay] mode in one direction.
func (p *Proxy) SetDelay(d Direction, delay time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay[d] = delay
	p.cond.Broadcast()
}

// Held returns how many bytes of direction d the proxy has read from their
// senders and not yet written to their receivers, over every connection:
// while d is paused or held, the bytes sent since. A test that holds a
// path waits for Held to grow to know that a request is on its way.
func (p *Proxy) Held(d Direction) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held[d]
}

// WaitHeld blocks until at least n bytes of direction d are held (see
// [Proxy.Held]) or the timeout passes, and reports whether they were.
func (p *Proxy) WaitHeld(d Direction, n int, timeout time.Duration) bool {
	// The timer says it has fired under the lock, so the waiter cannot
	// miss it: a deadline read from the clock instead could still lie
	// ahead when the timer's one broadcast came.
	timedOut := false
	stop := time.AfterFunc(timeout, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		timedOut = true
		p.cond.Broadcast()
	})
	defer stop.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.held[d] < n && !p.closed && !timedOut {
		p.cond.Wait()
	}
	return p.held[d] >= n
}

// Conn is one connection through the proxy, for a fault of that
// connection alone: a client that pools connections can have the requests
// of one held while the others flow, or have its held connections
// released one at a time, in an order of the test's choosing.
type Conn struct{ l *link }

// Conns returns the proxy's open connections, in the order it accepted
// them.
func (p *Proxy) Conns() []*Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*Conn, 0, len(p.links))
	for l := range p.links {
		out = append(out, &Conn{l})
	}
	slices.SortFunc(out, func(a, b *Conn) int { return a.l.seq - b.l.seq })
	return out
}

// Set sets the mode of one direction of this connection alone; the
// proxy's own Set, SetBoth and Heal (which ends the connection) no longer
// change it, until [Conn.Follow].
func (c *Conn) Set(d Direction, m Mode) {
	p := c.l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	c.l.own[d], c.l.owned[d] = m, true
	p.cond.Broadcast()
}

// Follow makes direction d of this connection follow the proxy's mode
// again.
func (c *Conn) Follow(d Direction) {
	p := c.l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	c.l.owned[d] = false
	p.cond.Broadcast()
}

// Held returns how many bytes of direction d this connection has read from
// their sender and not yet written (see [Proxy.Held]).
func (c *Conn) Held(d Direction) int {
	p := c.l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	return size(c.l.queue[d])
}

// HeldSince returns when the oldest byte of direction d that this
// connection holds was read, or the zero Time if it holds none: of several
// held connections, the one whose bytes were sent first.
func (c *Conn) HeldSince(d Direction) time.Time {
	p := c.l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(c.l.queue[d]) == 0 {
		return time.Time{}
	}
	return c.l.queue[d][0].at
}

// Mode returns the mode of one direction.
func (p *Proxy) Mode(d Direction) Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.modes[d]
}

// Reset closes every open connection; new connections are accepted as usual.
// Bytes held by Pause or Hold are discarded with their connection.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.breakLinks()
}

// breakLinks closes both sockets of every connection and wakes its pipes,
// which drop what they hold. The caller holds p.mu.
func (p *Proxy) breakLinks() {
	for l := range p.links {
		l.broken = true
		_ = l.client.Close()
		_ = l.server.Close()
	}
	p.cond.Broadcast()
}

// Refuse closes the proxy's port and every connection: until [Proxy.Heal],
// clients see their connections end and new ones refused, as when the
// server has died or a firewall rejects them.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	p.breakLinks()
}

// Heal sets both directions to Pass, resets every connection and reopens
// the port if [Proxy.Refuse] closed it, as the end of a partition does. If
// the port cannot be reopened (another process took it meanwhile), Heal
// reports an error to the test.
func (p *Proxy) Heal() {
	p.SetBoth(Pass)
	p.Reset()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil || p.closed {
		return
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.tb.Errorf("faultproxy: reopening %s: %v", p.addr, err)
		return
	}
	p.ln = ln
	p.wg.Go(func() { p.accept(ln) })
}

// Close stops the proxy, closes every connection and waits for its
// goroutines. It is safe to call more than once.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	if p.ln != nil {
		_ = p.ln.Close()
	}
	p.breakLinks()
	p.mu.Unlock()
	p.wg.Wait()
}

// accept serves one listener until it is closed.
func (p *Proxy) accept(ln net.Listener) {
	for {
		client, err := ln.Accept()
		if err != nil {
			return // closed
		}
		server, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed || p.ln != ln {
			// Closed or refusing since the client connected.
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			if p.closed {
				return
			}
			continue
		}
		p.seq++
		link := &link{p: p, client: client, server: server, seq: p.seq}
		p.links[link] = struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { link.pipe(Up, client, server) })
		p.wg.Go(func() { link.pipe(Down, server, client) })
	}
}

// link is one proxied connection: two sockets and two pipes. The fields
// after once are guarded by p.mu.
type link struct {
	p              *Proxy
	client, server net.Conn
	once           sync.Once

	seq    int        // its place in the order of acceptance
	own    [2]Mode    // its own mode of each direction, where set
	owned  [2]bool    // whether own[d] applies rather than the proxy's
	queue  [2][]chunk // read and not yet written, by direction
	eof    [2]bool    // the direction's sender has ended
	drain  [2]bool    // the direction's sender ended while its bytes were held
	broken bool       // Reset, Refuse or Close: drop everything
}

// close closes both sockets and wakes the other pipe.
func (l *link) close() {
	l.once.Do(func() {
		p := l.p
		p.mu.Lock()
		_ = l.client.Close()
		_ = l.server.Close()
		for d := range l.queue {
			p.held[d] -= size(l.queue[d])
			l.queue[d] = nil
		}
		delete(p.links, l)
		p.cond.Broadcast()
		p.mu.Unlock()
	})
}

// mode returns the mode of direction d on this connection. The caller
// holds p.mu.
func (l *link) mode(d Direction) Mode {
	if l.owned[d] {
		return l.own[d]
	}
	return l.p.modes[d]
}

// holding reports whether direction d holds bytes to deliver later. The
// caller holds p.mu.
func (l *link) holding(d Direction) bool {
	return l.mode(d) == Hold && len(l.queue[d]) > 0 || l.drain[d]
}

type chunk struct {
	data []byte
	at   time.Time
}

// size returns the bytes of q.
func size(q []chunk) int {
	n := 0
	for _, c := range q {
		n += len(c.data)
	}
	return n
}

// pipe copies src to dst in direction d, applying the direction's mode. A
// reader goroutine queues chunks; this goroutine delivers them. The link
// ends (both sockets closed) when either pipe ends, except where Hold keeps
// it open: a pipe whose sender ended while its bytes were held delivers
// them, half-closes dst and leaves the link to the other pipe, and a pipe
// whose receiver is gone while the other way holds bytes reads on and
// discards, so that the held bytes' receiver is not closed under them.
func (l *link) pipe(d Direction, src, dst net.Conn) {
	p := l.p
	handedOver := false
	defer func() {
		if !handedOver {
			l.close()
		}
	}()
	done := make(chan struct{})
	defer func() { <-done }()
	go func() {
		defer close(done)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			p.mu.Lock()
			if n > 0 && l.mode(d) != Blackhole && !l.broken {
				l.queue[d] = append(l.queue[d], chunk{data: append([]byte(nil), buf[:n]...), at: time.Now()})
				p.held[d] += n
			}
			if err != nil {
				l.eof[d] = true
				if l.mode(d) == Hold && len(l.queue[d]) > 0 {
					l.drain[d] = true
				}
			}
			p.cond.Broadcast()
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	other := 1 - d
	discard := false // dst is gone but the other way holds bytes
	for {
		p.mu.Lock()
		for {
			m := l.mode(d)
			if m == Blackhole && len(l.queue[d]) > 0 {
				p.held[d] -= size(l.queue[d])
				l.queue[d] = nil
			}
			if p.closed || l.broken ||
				len(l.queue[d]) > 0 && (m == Pass || m == Delay) ||
				l.eof[d] && len(l.queue[d]) == 0 ||
				l.eof[d] && m == Pause && !l.drain[d] {
				break
			}
			p.cond.Wait()
		}
		if p.closed || l.broken || len(l.queue[d]) == 0 || l.mode(d) == Pause {
			// Closed, or the sender ended: with nothing left to deliver, or
			// while paused (Pause drops what it holds when a sender ends).
			if !p.closed && !l.broken && l.drain[d] {
				// Everything held was delivered after the sender ended:
				// the receiver reads the end of the stream, and the other
				// pipe reads its answers and ends the link.
				handedOver = true
				if cw, ok := dst.(interface{ CloseWrite() error }); ok {
					_ = cw.CloseWrite()
				}
			}
			p.mu.Unlock()
			_ = src.Close() // unblock the reader
			return
		}
		c := l.queue[d][0]
		l.queue[d] = l.queue[d][1:]
		p.held[d] -= len(c.data)
		wait := time.Duration(0)
		if l.mode(d) == Delay {
			wait = time.Until(c.at.Add(p.delay[d]))
		}
		p.mu.Unlock()
		if wait > 0 {
			time.Sleep(wait)
		}
		if discard {
			continue
		}
		if _, err := dst.Write(c.data); err != nil {
			p.mu.Lock()
			discard = l.holding(other)
			p.mu.Unlock()
			if !discard {
				_ = src.Close() // unblock the reader
				return
			}
		}
	}
}
