// Package redisbin finds the server program that distlock's tests start
// (redis-server, or Valkey's valkey-server) and the command-line client that
// comes with it (redis-cli or valkey-cli, which builds a test Cluster). It
// is shared by the test harness (internal/redistest) and the public test
// helper (distlocktest), so that both run the same server.
//
// By default the programs are looked up on PATH. The environment variable
// named by [Env] picks another server, so that one checkout can be tested
// against several Redis and Valkey versions (scripts/compat does that):
//
//	DISTLOCK_REDIS_SERVER=/work/servers/redis-6.2.16/src go test ./...
//	DISTLOCK_REDIS_SERVER=/opt/valkey/bin/valkey-server go test ./...
//
// Its value is the server program itself, or a directory that holds one.
// Sentinels are that same program run with --sentinel, which every Redis
// and Valkey the tests run on accepts, so no separate redis-sentinel (or
// valkey-sentinel) is needed.
package redisbin

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Env is the environment variable that picks the server program: a path to
// redis-server or valkey-server (any name will do), or a directory that
// holds one of them. When it is empty, the programs are looked up on PATH.
const Env = "DISTLOCK_REDIS_SERVER"

// ErrNotFound means that [Env] is empty and neither redis-server nor
// valkey-server is on PATH.
var ErrNotFound = errors.New("redisbin: neither redis-server nor valkey-server is on PATH")

// The names the two projects give their programs. Valkey's install step
// adds redis-* links to its own programs, but a build tree (valkey/src) has
// only the valkey-* names, so both are looked for, Redis's first.
var (
	serverNames = []string{"redis-server", "valkey-server"}
	cliNames    = []string{"redis-cli", "valkey-cli"}
)

// Server returns the path of the server program the tests start: the one
// [Env] names, or redis-server (else valkey-server) on PATH. It returns an
// error matching [ErrNotFound] when Env is empty and neither is on PATH,
// and another error when Env names something that is not a server program
// (a test run that asked for a server must not quietly run another).
func Server() (string, error) {
	v := os.Getenv(Env)
	if v == "" {
		for _, name := range serverNames {
			if p, err := exec.LookPath(name); err == nil {
				return p, nil
			}
		}
		return "", ErrNotFound
	}
	fi, err := os.Stat(v)
	if err != nil {
		return "", fmt.Errorf("redisbin: %s=%s: %w", Env, v, err)
	}
	if !fi.IsDir() {
		if !executable(fi) {
			return "", fmt.Errorf("redisbin: %s=%s is not an executable file", Env, v)
		}
		return v, nil
	}
	if p, ok := inDir(v, serverNames); ok {
		return p, nil
	}
	return "", fmt.Errorf("redisbin: %s=%s: the directory holds neither %s", Env, v, strings.Join(serverNames, " nor "))
}

// CLI returns the path of the command-line client for the server that
// [Server] returns: redis-cli or valkey-cli in the server's own directory
// (valkey-cli first beside a valkey-server), else either on PATH: the
// client only sends the commands that build a Cluster, which every version
// the tests run on shares, so another version's client serves when the
// server's directory has none.
func CLI() (string, error) {
	server, err := Server()
	if err != nil {
		return "", err
	}
	names := cliNames
	if strings.HasPrefix(filepath.Base(server), "valkey") {
		names = []string{"valkey-cli", "redis-cli"}
	}
	if p, ok := inDir(filepath.Dir(server), names); ok {
		return p, nil
	}
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("redisbin: neither %s is beside %s or on PATH", strings.Join(names, " nor "), server)
}

// inDir returns the first of names that is an executable file in dir.
func inDir(dir string, names []string) (string, bool) {
	for _, name := range names {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && executable(fi) {
			return p, true
		}
	}
	return "", false
}

func executable(fi os.FileInfo) bool { return fi.Mode().Perm()&0o111 != 0 }
