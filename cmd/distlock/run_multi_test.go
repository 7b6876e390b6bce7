package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// tokensOf parses a child's DISTLOCK_TOKENS: NAME=TOKEN lines, in the
// order the names were given. It checks that DISTLOCK_KEY and
// DISTLOCK_TOKEN are the first name's.
func tokensOf(t *testing.T, rep childReport) (names []string, tokens map[string]int64) {
	t.Helper()
	tokens = make(map[string]int64)
	for line := range strings.Lines(rep.Tokens) {
		line = strings.TrimSuffix(line, "\n")
		i := strings.LastIndex(line, "=")
		require.Positive(t, i, "DISTLOCK_TOKENS line %q", line)
		n, err := strconv.ParseInt(line[i+1:], 10, 64)
		require.NoError(t, err, "DISTLOCK_TOKENS line %q", line)
		require.Positive(t, n, "DISTLOCK_TOKENS line %q", line)
		names = append(names, line[:i])
		tokens[line[:i]] = n
	}
	require.NotEmpty(t, names, "DISTLOCK_TOKENS is empty")
	assert.Equal(t, names[0], rep.Key, "DISTLOCK_KEY is the first name")
	assert.Equal(t, tokens[names[0]], token(t, rep), "DISTLOCK_TOKEN is the first name's")
	return names, tokens
}

// holderOf returns the owner of the value that holds name, written by a
// run (a read-write lock's writer) or a MultiMutex (a lock's string), or
// "" when it is free.
func holderOf(t *testing.T, srv *redistest.Server, name string) string {
	t.Helper()
	typ, err := srv.MustDo("TYPE", leaseKey(name)).ToString()
	require.NoError(t, err)
	switch typ {
	case "none":
		return ""
	case "hash":
		v, err := srv.MustDo("HGET", leaseKey(name), "~w").ToString()
		require.NoError(t, err, "%s: a hash without a writer", name)
		return lease.Owner(v)
	}
	v, err := srv.MustDo("GET", leaseKey(name)).ToString()
	require.NoError(t, err)
	return lease.Owner(v)
}

// Two runs whose -k sets overlap exclude each other: the second waits
// (holding what it can of its names, standing in the line of the shared
// one), and runs once the first has finished, with a larger token for the
// shared name. Each command gets every name's token in DISTLOCK_TOKENS.
// One -k is the same run as a KEY.
func TestRunSeveralNames(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()

	one := start(t, nil, cmdline(runArgs(srv, "--ttl", "2s", "-k", "ab-a", "-k", "ab-b"), childArgs(t, dir, "one")...)...)
	repOne := waitReport(t, dir, "one")
	names, tokOne := tokensOf(t, repOne)
	assert.Equal(t, []string{"ab-a", "ab-b"}, names, "DISTLOCK_TOKENS names every name, in the order given")
	assert.Equal(t, repOne.Owner, holderOf(t, srv, "ab-a"))
	assert.Equal(t, repOne.Owner, holderOf(t, srv, "ab-b"))

	// -n on an overlapping set gives up and takes nothing.
	code, _, errOut := runDistlock(t, cmdline(runArgs(srv, "-n", "-k", "ab-c", "-k", "ab-b"), childArgs(t, dir, "try")...)...)
	assert.Equal(t, exitNotAcquired, code, "-n on an overlapping set; stderr: %s", errOut)
	assert.Contains(t, errOut, repOne.Owner, "the message names the holder")
	assertFree(t, srv, "ab-c")

	two := start(t, nil, cmdline(runArgs(srv, "--ttl", "2s", "-k", "ab-c", "-k", "ab-b"), childArgs(t, dir, "two")...)...)
	require.Eventually(t, func() bool { return inspectJSON(t, srv, "ab-b").Waiting == 1 }, eventually, pollEvery,
		"the second run never stood in the shared name's line")
	assert.False(t, started(dir, "two"), "two runs sharing ab-b ran at once")
	assert.False(t, started(dir, "try"))

	letExit(t, dir, "one")
	assert.Equal(t, 0, one.wait(t), "one's stderr: %s", &one.stderr)
	repTwo := waitReport(t, dir, "two")
	names, tokTwo := tokensOf(t, repTwo)
	assert.Equal(t, []string{"ab-c", "ab-b"}, names)
	assert.Greater(t, tokTwo["ab-b"], tokOne["ab-b"], "the shared name's tokens must increase")
	assert.Equal(t, repTwo.Owner, holderOf(t, srv, "ab-b"))
	assert.Equal(t, repTwo.Owner, holderOf(t, srv, "ab-c"))
	assertFree(t, srv, "ab-a")
	letExit(t, dir, "two")
	assert.Equal(t, 0, two.wait(t), "two's stderr: %s", &two.stderr)
	for _, name := range []string{"ab-a", "ab-b", "ab-c"} {
		assertFree(t, srv, name)
	}

	// One -k is KEY: the read-write lock, held for writing.
	single := start(t, nil, cmdline(runArgs(srv, "-k", "ab-single"), childArgs(t, dir, "single")...)...)
	repSingle := waitReport(t, dir, "single")
	assert.Equal(t, "ab-single", repSingle.Key)
	assert.Equal(t, "ab-single="+repSingle.Token, repSingle.Tokens)
	assert.Equal(t, "rwmutex", inspectJSON(t, srv, "ab-single").Kind)
	assert.Equal(t, repSingle.Owner, holderOf(t, srv, "ab-single"))
	letExit(t, dir, "single")
	assert.Equal(t, 0, single.wait(t))
	assertFree(t, srv, "ab-single")
}

// A run of several names waits while a plain run holds one of them, and
// runs once that run has finished.
func TestRunSeveralNamesWaitsForAPlainRun(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	plain := start(t, nil, cmdline(runArgs(srv, "--ttl", "2s", "pa"), childArgs(t, dir, "plain")...)...)
	repPlain := waitReport(t, dir, "plain")

	multi := start(t, nil, cmdline(runArgs(srv, "--ttl", "2s", "-v", "-k", "pa", "-k", "pb"), childArgs(t, dir, "multi")...)...)
	require.Eventually(t, func() bool { return inspectJSON(t, srv, "pa").Waiting == 1 }, eventually, pollEvery,
		"the run of several names never stood in pa's line")
	multi.waitStderr(t, "waiting for distlock:{pa}, distlock:{pb} (all at once)")
	assert.False(t, started(dir, "multi"), "the run of several names ran while pa was held")

	letExit(t, dir, "plain")
	assert.Equal(t, 0, plain.wait(t), "plain's stderr: %s", &plain.stderr)
	repMulti := waitReport(t, dir, "multi")
	_, tokens := tokensOf(t, repMulti)
	assert.Greater(t, tokens["pa"], token(t, repPlain), "pa's tokens must increase")
	assert.Equal(t, repMulti.Owner, holderOf(t, srv, "pa"))
	assert.Equal(t, repMulti.Owner, holderOf(t, srv, "pb"))
	letExit(t, dir, "multi")
	assert.Equal(t, 0, multi.wait(t), "multi's stderr: %s", &multi.stderr)
	assert.Contains(t, multi.stderr.String(), "released distlock:{pa}, distlock:{pb}")
	assertFree(t, srv, "pa")
	assertFree(t, srv, "pb")
}

// Bad -k input is a usage error, and touches nothing in Redis.
func TestRunSeveralNamesUsage(t *testing.T) {
	srv := redistest.Start(t)
	tooMany := []string{}
	for i := range lease.MaxSet + 1 {
		tooMany = append(tooMany, "-k", "n"+strconv.Itoa(i))
	}
	cases := []struct {
		name   string
		args   []string
		stderr string
	}{
		{"duplicate", []string{"-k", "a", "-k", "b", "-k", "a"}, `-k "a" is given twice`},
		{"shared", []string{"-s", "-k", "a", "-k", "b"}, "-s takes one name"},
		{"shared after", []string{"-k", "a", "--shared", "-k", "b"}, "-s takes one name"},
		{"permits", []string{"--permits", "2", "-k", "a", "-k", "b"}, "--permits takes one name"},
		{"KEY and -k", []string{"a", "-k", "b"}, `KEY "a" and -k "b" exclude each other`},
		{"empty", []string{"-k", "", "-k", "b"}, "the name is empty"},
		{"bad name", []string{"-k", "a{b}", "-k", "b"}, "braces"},
		{"too many", tooMany, "at most 64"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, errOut := runDistlock(t, cmdline(runArgs(srv, tc.args...), "true")...)
			assert.Equal(t, exitUsage, code, "stderr: %s", errOut)
			assert.Contains(t, errOut, tc.stderr)
			assert.Contains(t, errOut, "Run 'distlock help run' for usage.")
		})
	}
	code, _, errOut := runDistlock(t, runArgs(srv, "-k", "a", "-k", "b")...)
	assert.Equal(t, exitUsage, code, "no command; stderr: %s", errOut)
	assert.Contains(t, errOut, "missing the command")
	keys, err := srv.MustDo("KEYS", "*").AsStrSlice()
	require.NoError(t, err)
	assert.Empty(t, keys, "a refused run touched Redis")
}
