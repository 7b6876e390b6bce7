package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/distkit-go/distlock/internal/loopback"
	"github.com/distkit-go/distlock/internal/redisbin"
)

// serverStartTimeout bounds how long startServer waits for PONG.
const serverStartTimeout = 10 * time.Second

// server is the private redis-server every library of a run talks to. It
// is internal/redistest's server without a testing.TB, which a plain main
// has none of: a free loopback port, nothing kept on disk, killed with the
// process that started it.
type server struct {
	bin  string // the server program (internal/redisbin: DISTLOCK_REDIS_SERVER, else PATH)
	addr string
	dir  string
	// node makes it a Redis Cluster node (cluster.go), its bus on a free
	// port of its own (cluster-port: Redis 7.0 and later).
	node bool
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// startServer starts redis-server (or the program DISTLOCK_REDIS_SERVER
// names, as for the tests) on a free loopback port and waits until it
// answers PING.
func startServer() (*server, error) { return startServerOf(false) }

// startServerOf is startServer, of a cluster node if node is true.
func startServerOf(node bool) (*server, error) {
	bin, err := redisbin.Server()
	if errors.Is(err, redisbin.ErrNotFound) {
		return nil, errors.New("redis-server is not on PATH; install it, e.g. `sudo apt-get install -y redis-server`")
	}
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "distlock-benchmarks-")
	if err != nil {
		return nil, err
	}
	for range 5 { // another process may take the port between probe and bind
		var port int
		if port, err = loopback.FreePort(); err != nil {
			continue
		}
		s := &server{bin: bin, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, node: node}
		if err = s.start(port); err == nil {
			return s, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, fmt.Errorf("cannot start redis-server: %w", err)
}

func (s *server) start(port int) error {
	args := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
		"--daemonize", "no",
		"--protected-mode", "no",
	}
	if s.node {
		bus, err := loopback.FreePort()
		if err != nil {
			return err
		}
		if bus == port {
			return errors.New("the cluster bus got the server's port")
		}
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", // in its own dir
			"--cluster-node-timeout", "5000",
			"--cluster-port", strconv.Itoa(bus),
		)
	}
	s.cmd = exec.Command(s.bin, args...)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the benchmark
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		_ = s.cmd.Wait()
	}()
	for deadline := time.Now().Add(serverStartTimeout); time.Now().Before(deadline); {
		select {
		case <-s.done:
			return fmt.Errorf("redis-server on port %d exited at start", port)
		default:
		}
		if loopback.Ping(s.addr) == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.kill()
	return errors.New("redis-server did not answer PING in time")
}

func (s *server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

// stop kills the server and removes its directory.
func (s *server) stop() {
	s.kill()
	_ = os.RemoveAll(s.dir)
}
