// Package redistest starts private redis-server processes for tests.
//
// Each [Server] listens on a free loopback port, keeps nothing on disk, and
// is killed when the test ends. Tests can pause it (SIGSTOP), resume it
// (SIGCONT), kill it (SIGKILL) and restart it on the same port, which is how
// the distlock tests simulate a hung, crashed or restarted Redis.
//
// # Which server
//
// Every server, cluster node and sentinel runs the program that
// internal/redisbin finds: the one the environment variable
// DISTLOCK_REDIS_SERVER names (a redis-server or valkey-server, or a
// directory that holds one), else redis-server on PATH, else
// valkey-server. If there is none, [Start] fails the test with a message
// saying how to install it.
//
// The servers differ: Redis 6.2 has no sharded pub/sub, for one.
// [Server.Version] says what a server is, [Server.Has] whether it has a
// [Feature], and [Server.SkipUnless] skips a test that needs one, saying
// so. The helpers here pass a setting only to the servers that know it.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/internal/loopback"
	"github.com/distkit-go/distlock/internal/redisbin"
)

// startTimeout bounds how long Start waits for a new server to answer PING.
const startTimeout = 10 * time.Second

// InstallHint tells how to get redis-server, or how to pick another.
const InstallHint = "redis-server is not on PATH; install it, e.g. `sudo apt-get install -y redis-server` " +
	"on Debian/Ubuntu or `brew install redis` on macOS (the tests start their own private servers), " +
	"or set " + redisbin.Env + " to a redis-server or valkey-server, or to a directory that holds one"

// Server is a private redis-server process.
type Server struct {
	tb      testing.TB
	bin     string // the server program (redisbin.Server)
	port    int
	bus     bus // how a cluster node's bus port is chosen; noBus if not one
	busPort int // the cluster bus port of a cluster node, else 0
	dir     string
	pre     []string // arguments before the common ones: a sentinel's config file
	args    []string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd has exited
	version *Version      // what the server said it is, once asked
}

// bus is how a cluster node's cluster bus port is chosen.
type bus int

const (
	noBus bus = iota // not a cluster node
	// busFlag: any free port, passed with --cluster-port (Redis 7.0 and
	// later), so that nothing depends on port+10000 being free.
	busFlag
	// busOffset: port+10000, where a server without cluster-port (Redis
	// 6.2) puts its bus; the port is chosen so that both are free.
	busOffset
)

// busOffsetPorts is how far above a node's port a server without the
// cluster-port setting puts its cluster bus.
const busOffsetPorts = 10000

// Start starts a redis-server for the test on a free loopback port, with
// extra command-line arguments such as "--maxmemory", "1mb". It is killed
// when the test and its subtests finish.
func Start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	return startServer(tb, &Server{args: args})
}

// startServer fills in s and starts it. A cluster node (s.bus not noBus)
// gets a free port for its cluster bus as well.
func startServer(tb testing.TB, s *Server) *Server {
	tb.Helper()
	var err error
	if s.bin, err = redisbin.Server(); errors.Is(err, redisbin.ErrNotFound) {
		tb.Fatal(InstallHint)
	} else if err != nil {
		tb.Fatal(err)
	}
	s.tb = tb
	if s.dir == "" {
		s.dir = tb.TempDir()
	}
	tb.Cleanup(s.Kill)
	for range 5 { // another process may take the port between probe and bind
		if err = s.choosePorts(); err != nil {
			continue
		}
		if err = s.start(); err == nil {
			return s
		}
	}
	tb.Fatalf("redistest: cannot start %s: %v", s.bin, err)
	return nil
}

// choosePorts picks free ports for the server and, for a cluster node, its
// cluster bus.
func (s *Server) choosePorts() error {
	var err error
	switch s.bus {
	case noBus:
		s.port, err = loopback.FreePort()
	case busFlag:
		if s.port, err = loopback.FreePort(); err != nil {
			return err
		}
		if s.busPort, err = loopback.FreePort(); err == nil && s.busPort == s.port {
			err = errors.New("the same free port twice")
		}
	case busOffset:
		// A free port below 65536-10000 whose bus port is free too; a few
		// tries find one (the kernel hands out ports at random).
		for range 50 {
			if s.port, err = loopback.FreePort(); err != nil {
				return err
			}
			s.busPort = s.port + busOffsetPorts
			if s.busPort <= 65535 && loopback.IsFree(s.busPort) {
				return nil
			}
		}
		err = fmt.Errorf("no free port with a free port %d above it", busOffsetPorts)
	}
	return err
}

// Addr returns the server's "host:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the server's port.
func (s *Server) Port() int { return s.port }

// URL returns the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Pause stops the server with SIGSTOP: it keeps its connections open but
// answers nothing until [Server.Resume].
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

// Kill kills the server with SIGKILL and waits for it to exit. Its data is
// gone (it keeps nothing on disk). Killing a server that is not running does
// nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// Restart kills the server if it runs and starts a fresh, empty one on the
// same port.
func (s *Server) Restart() {
	s.tb.Helper()
	s.mu.Lock()
	s.killLocked()
	s.mu.Unlock()
	var err error
	for range 50 { // the old socket may linger for a moment
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.tb.Fatalf("redistest: cannot restart %s on port %d: %v", s.bin, s.port, err)
}

// Pid returns the process id of the running server, or 0 if it is not
// running.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// ClientOption returns the rueidis options for a client of this server:
// client-side caching off (the tests do not need it) and one connection.
func (s *Server) ClientOption() rueidis.ClientOption {
	return rueidis.ClientOption{
		InitAddress:  []string{s.Addr()},
		DisableCache: true,
	}
}

// Client returns a new rueidis client of the server, closed when the test
// ends.
func (s *Server) Client() rueidis.Client {
	s.tb.Helper()
	return NewClient(s.tb, s.ClientOption())
}

// NewClient returns a rueidis client built from opt, closed when the test
// ends.
func NewClient(tb testing.TB, opt rueidis.ClientOption) rueidis.Client {
	tb.Helper()
	c, err := rueidis.NewClient(opt)
	if err != nil {
		tb.Fatalf("redistest: rueidis client: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// Do runs one admin command on a short-lived connection of its own, so that
// it is not queued behind the clients under test, and returns the reply.
func (s *Server) Do(ctx context.Context, args ...string) (rueidis.RedisMessage, error) {
	c, err := s.adminClient()
	if err != nil {
		return rueidis.RedisMessage{}, err
	}
	defer c.Close()
	return c.Do(ctx, c.B().Arbitrary(args...).Build()).ToMessage()
}

// adminClient returns a client of this server alone (never a cluster or
// sentinel client, whatever the server is), without retries; close it after
// use.
func (s *Server) adminClient() (rueidis.Client, error) {
	return rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{s.Addr()},
		DisableCache:      true,
		DisableRetry:      true,
		ForceSingleClient: true,
	})
}

// MustDo is [Server.Do] that fails the test on an error (a nil reply is not
// an error).
func (s *Server) MustDo(args ...string) *rueidis.RedisMessage {
	s.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg, err := s.Do(ctx, args...)
	if err != nil && !rueidis.IsRedisNil(err) {
		s.tb.Fatalf("redistest: %v: %v", args, err)
	}
	return &msg
}

func (s *Server) start() error {
	args := append(append([]string(nil), s.pre...),
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
		"--daemonize", "no",
		"--protected-mode", "no",
	)
	if s.bus == busFlag {
		args = append(args, "--cluster-port", strconv.Itoa(s.busPort))
	}
	args = append(args, s.args...)
	cmd := exec.Command(s.bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test binary
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cmd.Wait()
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("%s on port %d exited at start: %s", s.bin, s.port, lastLines(log, 5))
		default:
		}
		if err := loopback.Ping(s.Addr()); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.Kill()
	return fmt.Errorf("%s did not answer PING in time", s.bin)
}

func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	select {
	case <-s.done:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGCONT) // a stopped process still dies, but be tidy
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

func (s *Server) signal(sig syscall.Signal) {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.tb.Fatalf("redistest: signal %v: server is not running", sig)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.tb.Fatalf("redistest: signal %v: %v", sig, err)
	}
}

func lastLines(b []byte, n int) string {
	end := len(b)
	for i := len(b) - 1; i >= 0 && n >= 0; i-- {
		if b[i] == '\n' {
			n--
			if n < 0 {
				return string(b[i+1 : end])
			}
		}
	}
	return string(b[:end])
}
