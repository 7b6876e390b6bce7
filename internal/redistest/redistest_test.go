package redistest_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/internal/redistest"
)

const (
	// cmdTimeout bounds every command that is expected to succeed.
	cmdTimeout = 5 * time.Second
	// pausedTimeout is the deadline of a command sent to a paused server.
	pausedTimeout = 200 * time.Millisecond
	// pausedSlack is how much later than pausedTimeout such a command may
	// return on a busy machine.
	pausedSlack = 3 * time.Second
	// poll is the interval of require.Eventually.
	poll = 10 * time.Millisecond
	// sharedRedisPort is the port of a Redis this machine may run for
	// other purposes; the tests must never talk to it.
	sharedRedisPort = 6379
)

// start starts a private server and checks that it is not the shared one.
func start(t *testing.T, args ...string) *redistest.Server {
	t.Helper()
	s := redistest.Start(t, args...)
	require.NotEqual(t, sharedRedisPort, s.Port(), "private server on the shared Redis port")
	return s
}

// do runs cmd on c with a cmdTimeout deadline.
func do(t *testing.T, c rueidis.Client, cmd ...string) rueidis.RedisResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
	defer cancel()
	return c.Do(ctx, c.B().Arbitrary(cmd...).Build())
}

// ping checks that c gets PONG.
func ping(t *testing.T, c rueidis.Client) {
	t.Helper()
	got, err := do(t, c, "PING").ToString()
	require.NoError(t, err, "PING")
	require.Equal(t, "PONG", got, "PING reply")
}

// alive reports whether a process with this pid exists (a zombie counts).
func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

func TestStart(t *testing.T) {
	s := start(t)

	ping(t, s.Client())

	host, port, err := net.SplitHostPort(s.Addr())
	require.NoError(t, err, "Addr() = %q", s.Addr())
	assert.Equal(t, "127.0.0.1", host, "host")
	assert.Equal(t, strconv.Itoa(s.Port()), port, "port in Addr")
	assert.Equal(t, "redis://"+s.Addr(), s.URL(), "URL")
	assert.True(t, alive(s.Pid()), "process %d is not running", s.Pid())

	opt, err := rueidis.ParseURL(s.URL())
	require.NoError(t, err, "ParseURL(%q)", s.URL())
	assert.Equal(t, []string{s.Addr()}, opt.InitAddress, "address parsed from URL")

	// The server keeps nothing on disk.
	save, err := s.MustDo("CONFIG", "GET", "save").AsStrMap()
	require.NoError(t, err)
	assert.Equal(t, "", save["save"], "save setting")
	aof, err := s.MustDo("CONFIG", "GET", "appendonly").AsStrMap()
	require.NoError(t, err)
	assert.Equal(t, "no", aof["appendonly"], "appendonly setting")
}

func TestDoAndMustDo(t *testing.T) {
	s := start(t)

	got, err := s.MustDo("SET", "k", "v").ToString()
	require.NoError(t, err)
	assert.Equal(t, "OK", got, "SET reply")

	ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
	defer cancel()
	msg, err := s.Do(ctx, "GET", "k")
	require.NoError(t, err, "Do GET")
	got, err = msg.ToString()
	require.NoError(t, err)
	assert.Equal(t, "v", got, "GET k")

	// A nil reply is not an error for MustDo.
	assert.True(t, s.MustDo("GET", "missing").IsNil(), "GET of a missing key is nil")

	// A command error is returned by Do.
	_, err = s.Do(ctx, "INCR", "k")
	require.Error(t, err, "INCR of a non-number")
	assert.Contains(t, err.Error(), "not an integer")

	// What Do wrote is visible to a client.
	got, err = do(t, s.Client(), "GET", "k").ToString()
	require.NoError(t, err)
	assert.Equal(t, "v", got, "GET k from a client")
}

func TestTwoServers(t *testing.T) {
	a := start(t)
	b := start(t)
	require.NotEqual(t, a.Port(), b.Port(), "ports of two servers")
	assert.NotEqual(t, a.Pid(), b.Pid(), "pids of two servers")

	ca, cb := a.Client(), b.Client()
	require.NoError(t, do(t, ca, "SET", "k", "a").Error())
	require.NoError(t, do(t, cb, "SET", "k", "b").Error())

	got, err := do(t, ca, "GET", "k").ToString()
	require.NoError(t, err)
	assert.Equal(t, "a", got, "GET k on the first server")
	got, err = do(t, cb, "GET", "k").ToString()
	require.NoError(t, err)
	assert.Equal(t, "b", got, "GET k on the second server")
}

func TestPauseResume(t *testing.T) {
	s := start(t)
	c := s.Client()
	require.NoError(t, do(t, c, "SET", "k", "v").Error())

	s.Pause()
	ctx, cancel := context.WithTimeout(t.Context(), pausedTimeout)
	defer cancel()
	begin := time.Now()
	err := c.Do(ctx, c.B().Get().Key("k").Build()).Error()
	took := time.Since(begin)
	require.ErrorIs(t, err, context.DeadlineExceeded, "GET on a paused server")
	assert.GreaterOrEqual(t, took, pausedTimeout, "time GET waited")
	assert.Less(t, took, pausedTimeout+pausedSlack, "time GET waited")
	assert.True(t, alive(s.Pid()), "a paused server is still a process")

	s.Resume()
	got, err := do(t, c, "GET", "k").ToString()
	require.NoError(t, err, "GET after Resume")
	assert.Equal(t, "v", got, "data survives a pause")
}

func TestKillRestart(t *testing.T) {
	s := start(t)
	c := s.Client()
	require.NoError(t, do(t, c, "SET", "k", "v").Error())
	addr, oldPid := s.Addr(), s.Pid()

	s.Kill()
	assert.False(t, alive(oldPid), "process %d still exists after Kill", oldPid)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	assert.Error(t, c.Do(ctx, c.B().Ping().Build()).Error(), "PING a killed server")
	_, err := s.Do(ctx, "PING")
	assert.Error(t, err, "Do PING on a killed server")
	assert.NotPanics(t, s.Kill, "Kill of a killed server")

	s.Restart()
	assert.Equal(t, addr, s.Addr(), "address after Restart")
	assert.NotEqual(t, oldPid, s.Pid(), "pid after Restart")
	assert.True(t, alive(s.Pid()), "restarted process is not running")

	// A fresh, empty database that answers, through the old client too
	// (it reconnects on its own).
	assert.Equal(t, int64(0), mustInt(t, s.MustDo("DBSIZE")), "DBSIZE after Restart")
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		return c.Do(ctx, c.B().Ping().Build()).Error() == nil
	}, cmdTimeout, poll, "old client never reached the restarted server")
	assert.True(t, rueidis.IsRedisNil(do(t, c, "GET", "k").Error()), "GET k after Restart is nil")
	ping(t, s.Client())
}

func TestRestartRunning(t *testing.T) {
	// Restart of a running server kills it first.
	s := start(t)
	s.MustDo("SET", "k", "v")
	oldPid := s.Pid()

	s.Restart()
	assert.False(t, alive(oldPid), "old process %d still exists", oldPid)
	assert.True(t, s.MustDo("GET", "k").IsNil(), "GET k after Restart is nil")
}

func TestKillPaused(t *testing.T) {
	// Kill of a stopped process must not hang.
	s := start(t)
	pid := s.Pid()
	s.Pause()
	s.Kill()
	assert.False(t, alive(pid), "process %d still exists after Kill", pid)
}

func TestExtraArgs(t *testing.T) {
	s := start(t, "--maxmemory", "1mb", "--maxmemory-policy", "noeviction")
	check := func(when string) {
		t.Helper()
		got, err := s.MustDo("CONFIG", "GET", "maxmemory").AsStrMap()
		require.NoError(t, err)
		assert.Equal(t, "1048576", got["maxmemory"], "maxmemory %s", when)
		got, err = s.MustDo("CONFIG", "GET", "maxmemory-policy").AsStrMap()
		require.NoError(t, err)
		assert.Equal(t, "noeviction", got["maxmemory-policy"], "maxmemory-policy %s", when)
	}
	check("at start")

	// The limit is live: a write that would exceed it is refused.
	ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
	defer cancel()
	_, err := s.Do(ctx, "SET", "big", strings.Repeat("x", 2<<20))
	require.Error(t, err, "SET of 2 MiB with maxmemory 1mb")
	assert.Contains(t, err.Error(), "OOM")

	s.Restart()
	check("after Restart")
}

func TestCleanupKills(t *testing.T) {
	var pid int
	t.Run("inner", func(t *testing.T) {
		pid = start(t).Pid()
	})
	assert.False(t, alive(pid), "server %d outlived its test", pid)
}

// mustInt returns msg as an integer.
func mustInt(t *testing.T, msg *rueidis.RedisMessage) int64 {
	t.Helper()
	n, err := msg.AsInt64()
	require.NoError(t, err)
	return n
}
