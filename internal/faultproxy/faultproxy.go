// Package faultproxy is an in-process TCP proxy that injects network faults
// between one client and a server, for tests.
//
// Each direction (client to server, server to client) has its own [Mode]:
// pass bytes through, pause them (hold and deliver on the next change of
// mode), blackhole them (read and discard), or delay each chunk by a fixed
// time. [Proxy.Reset] closes every connection, as a crashed network path or
// a restarted server would, and [Proxy.Refuse] also closes the proxy's port
// until [Proxy.Heal], as a dead server or a rejecting firewall would. Give
// each client under test its own proxy to cut it off alone.
package faultproxy

import (
	"net"
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
	conns  map[net.Conn]struct{}
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
	p := &Proxy{tb: tb, target: target, addr: ln.Addr().String(), ln: ln, conns: make(map[net.Conn]struct{})}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Go(func() { p.accept(ln) })
	tb.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's "host:port", to give to the client. It stays the
// same across [Proxy.Refuse] and [Proxy.Heal].
func (p *Proxy) Addr() string { return p.addr }

// Set sets the mode of one direction.
func (p *Proxy) Set(d Direction, m Mode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.modes[d] = m
	p.cond.Broadcast()
}

// SetBoth sets the mode of both directions.
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

// Mode returns the mode of one direction.
func (p *Proxy) Mode(d Direction) Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.modes[d]
}

// Reset closes every open connection; new connections are accepted as usual.
// Bytes held by Pause are discarded with their connection.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
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
	for c := range p.conns {
		_ = c.Close()
	}
	p.cond.Broadcast()
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
	for c := range p.conns {
		_ = c.Close()
	}
	p.cond.Broadcast()
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
		p.conns[client] = struct{}{}
		p.conns[server] = struct{}{}
		p.mu.Unlock()
		link := &link{p: p, client: client, server: server}
		p.wg.Go(func() { link.pipe(Up, client, server) })
		p.wg.Go(func() { link.pipe(Down, server, client) })
	}
}

// link is one proxied connection: two sockets and two pipes.
type link struct {
	p              *Proxy
	client, server net.Conn
	once           sync.Once
}

// close closes both sockets and wakes the other pipe.
func (l *link) close() {
	l.once.Do(func() {
		p := l.p
		p.mu.Lock()
		_ = l.client.Close()
		_ = l.server.Close()
		delete(p.conns, l.client)
		delete(p.conns, l.server)
		p.cond.Broadcast()
		p.mu.Unlock()
	})
}

type chunk struct {
	data []byte
	at   time.Time
}

// pipe copies src to dst in direction d, applying the direction's mode. A
// reader goroutine queues chunks; this goroutine delivers them.
func (l *link) pipe(d Direction, src, dst net.Conn) {
	defer l.close()
	p := l.p
	var queue []chunk
	eof := false
	done := make(chan struct{})
	defer func() { <-done }()
	go func() {
		defer close(done)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			p.mu.Lock()
			if n > 0 && p.modes[d] != Blackhole {
				queue = append(queue, chunk{data: append([]byte(nil), buf[:n]...), at: time.Now()})
			}
			if err != nil {
				eof = true
			}
			p.cond.Broadcast()
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	for {
		p.mu.Lock()
		for !p.closed && !eof && (len(queue) == 0 || p.modes[d] == Pause || p.modes[d] == Blackhole) {
			if p.modes[d] == Blackhole {
				queue = nil
			}
			p.cond.Wait()
		}
		if p.closed || (eof && (len(queue) == 0 || p.modes[d] == Pause)) {
			p.mu.Unlock()
			_ = src.Close() // unblock the reader
			return
		}
		c := queue[0]
		queue = queue[1:]
		wait := time.Duration(0)
		if p.modes[d] == Delay {
			wait = time.Until(c.at.Add(p.delay[d]))
		}
		p.mu.Unlock()
		if wait > 0 {
			time.Sleep(wait)
		}
		if _, err := dst.Write(c.data); err != nil {
			_ = src.Close() // unblock the reader
			return
		}
	}
}
