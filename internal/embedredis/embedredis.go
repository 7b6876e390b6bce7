// Package embedredis runs an in-process Redis (miniredis) for the demo and
// for the distlocktest package (and through it the examples), where no real
// Redis is at hand.
//
// miniredis runs Lua scripts and the commands distlock needs, but it only
// counts key TTLs down when told to; [Start] drives that from the real clock
// so that leases expire as they would on a real server. It is a stand-in for
// demonstrations, not for tests of distlock's guarantees: those run against
// redis-server.
package embedredis

import (
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
)

// clockTick is how often the server's key expiry is moved forward.
const clockTick = 5 * time.Millisecond

// Server is a running embedded Redis with a client connected to it.
type Server struct {
	mr      *miniredis.Miniredis
	client  rueidis.Client
	done    chan struct{}
	stopped chan struct{}
}

// Start starts an embedded Redis on a free loopback port and connects a
// rueidis client to it. Call Close when done.
func Start() (*Server, error) {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		return nil, fmt.Errorf("starting the embedded Redis: %w", err)
	}
	// miniredis speaks neither client-side caching nor the CLUSTER commands
	// rueidis uses to detect a cluster, and a connection it sees subscribe
	// refuses other commands even in RESP3; with RESP2, rueidis keeps
	// subscriptions on a connection of their own.
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{mr.Addr()},
		DisableCache:      true,
		ForceSingleClient: true,
		AlwaysRESP2:       true,
	})
	if err != nil {
		mr.Close()
		return nil, fmt.Errorf("connecting to the embedded Redis: %w", err)
	}
	s := &Server{mr: mr, client: c, done: make(chan struct{}), stopped: make(chan struct{})}
	go s.runClock()
	return s, nil
}

// Client returns the connected client. It is closed by Close.
func (s *Server) Client() rueidis.Client { return s.client }

// Addr returns the server's "host:port".
func (s *Server) Addr() string { return s.mr.Addr() }

// Close closes the client, stops the clock and the server, and waits for
// them.
func (s *Server) Close() {
	s.client.Close()
	close(s.done)
	<-s.stopped
	s.mr.Close()
}

// runClock moves the server's key expiry forward with the real clock until
// Close.
func (s *Server) runClock() {
	defer close(s.stopped)
	t := time.NewTicker(clockTick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case now := <-t.C:
			s.mr.FastForward(now.Sub(last))
			last = now
		case <-s.done:
			return
		}
	}
}
