package redisbin

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// program writes an executable file (a shell script that does nothing) at
// dir/name and returns its path.
func program(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755))
	return p
}

func TestServerAndCLI(t *testing.T) {
	for _, tc := range []struct {
		name string
		// make lays out the programs and returns the variable's value, a
		// PATH, and the server and client that must be found.
		make func(t *testing.T) (env, path, server, cli string)
	}{
		{"a directory with Redis's programs", func(t *testing.T) (string, string, string, string) {
			dir := t.TempDir()
			program(t, dir, "valkey-server") // Redis's name comes first
			return dir, t.TempDir(), program(t, dir, "redis-server"), program(t, dir, "redis-cli")
		}},
		{"a Valkey build tree", func(t *testing.T) (string, string, string, string) {
			dir := t.TempDir()
			program(t, dir, "redis-cli") // beside a valkey-server, Valkey's own first
			return dir, t.TempDir(), program(t, dir, "valkey-server"), program(t, dir, "valkey-cli")
		}},
		{"the program itself, its client on PATH", func(t *testing.T) (string, string, string, string) {
			server, onPath := program(t, t.TempDir(), "my-redis"), t.TempDir()
			return server, onPath, server, program(t, onPath, "redis-cli")
		}},
		{"PATH alone, with valkey-server", func(t *testing.T) (string, string, string, string) {
			onPath := t.TempDir()
			return "", onPath, program(t, onPath, "valkey-server"), program(t, onPath, "valkey-cli")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, path, server, cli := tc.make(t)
			t.Setenv(Env, env)
			t.Setenv("PATH", path)
			got, err := Server()
			require.NoError(t, err)
			assert.Equal(t, server, got, "Server")
			got, err = CLI()
			require.NoError(t, err)
			assert.Equal(t, cli, got, "CLI")
		})
	}
	t.Run("no client anywhere", func(t *testing.T) {
		t.Setenv(Env, program(t, t.TempDir(), "redis-server"))
		t.Setenv("PATH", t.TempDir())
		_, err := CLI()
		assert.Error(t, err)
	})
}

func TestServerNotFound(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(Env, "")
	_, err := Server()
	assert.ErrorIs(t, err, ErrNotFound, "nothing on PATH")

	// A variable that names no server program is another error: the tests
	// that asked for a server fail rather than skip.
	notExec := filepath.Join(t.TempDir(), "redis-server")
	require.NoError(t, os.WriteFile(notExec, nil, 0o644))
	for name, v := range map[string]string{
		"a missing path":          filepath.Join(t.TempDir(), "nope"),
		"a directory without one": t.TempDir(),
		"a file not executable":   notExec,
	} {
		t.Setenv(Env, v)
		_, err := Server()
		if assert.Error(t, err, name) {
			assert.NotErrorIs(t, err, ErrNotFound, name)
			assert.Contains(t, err.Error(), Env, "%s: the error names the variable", name)
		}
	}
}
