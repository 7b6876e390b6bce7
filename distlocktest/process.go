package distlocktest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/distkit-go/distlock/internal/loopback"
	"github.com/distkit-go/distlock/internal/redisbin"
)

const (
	// startTimeout bounds how long a new redis-server gets to answer PING.
	startTimeout = 10 * time.Second
	// startAttempts is how many free ports are tried: another process may
	// take a port between the probe and redis-server's bind.
	startAttempts = 5
	// pingInterval is how often a starting redis-server is asked for PING.
	pingInterval = 10 * time.Millisecond
)

// redisProcess is a private redis-server process.
type redisProcess struct {
	addr   string
	cmd    *exec.Cmd
	done   chan struct{} // closed once cmd has exited
	dir    string        // its working directory, with redis.log
	ownDir bool          // dir was made here and is removed by kill
}

// startRedisServer starts redis-server (the program internal/redisbin
// finds: see [WithRealRedis]) on a free loopback port, with its log in dir
// (a new temporary directory if dir is empty), and waits until it answers
// PING.
func startRedisServer(dir string) (*redisProcess, error) {
	path, err := redisbin.Server()
	if errors.Is(err, redisbin.ErrNotFound) {
		return nil, ErrNoRedisServer
	}
	if err != nil {
		return nil, fmt.Errorf("distlocktest: %w", err)
	}
	ownDir := dir == ""
	if ownDir {
		if dir, err = os.MkdirTemp("", "distlocktest-"); err != nil {
			return nil, fmt.Errorf("distlocktest: %w", err)
		}
	}
	for range startAttempts {
		var port int
		if port, err = loopback.FreePort(); err != nil {
			continue
		}
		var p *redisProcess
		if p, err = startOn(path, dir, port); err == nil {
			p.ownDir = ownDir
			return p, nil
		}
	}
	if ownDir {
		_ = os.RemoveAll(dir)
	}
	return nil, fmt.Errorf("distlocktest: cannot start redis-server: %w", err)
}

// startOn starts redis-server on port and waits until it answers PING. On
// failure the process is gone.
func startOn(path, dir string, port int) (*redisProcess, error) {
	logFile := filepath.Join(dir, "redis.log")
	cmd := exec.Command(path,
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--logfile", logFile,
		"--daemonize", "no",
		"--protected-mode", "no",
	)
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &redisProcess{
		addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		cmd:  cmd,
		done: make(chan struct{}),
		dir:  dir,
	}
	go func() {
		defer close(p.done)
		_ = cmd.Wait()
	}()

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-p.done:
			log, _ := os.ReadFile(logFile)
			return nil, fmt.Errorf("redis-server on port %d exited at start: %s", port, lastLines(log, 5))
		default:
		}
		err := loopback.Ping(p.addr)
		if err == nil {
			return p, nil
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("redis-server on port %d did not answer PING within %v: %w", port, startTimeout, err)
		}
		time.Sleep(pingInterval) // polling an external process, nothing to wait on
	}
}

// stop kills the process and waits for it to exit.
func (p *redisProcess) stop() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// kill stops the process and removes its directory if it made it.
func (p *redisProcess) kill() {
	p.stop()
	if p.ownDir {
		_ = os.RemoveAll(p.dir)
	}
}

// lastLines returns the last n lines of b.
func lastLines(b []byte, n int) string {
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
