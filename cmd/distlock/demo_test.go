package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/distkit-go/distlock/internal/redistest"
)

func TestDemoEmbedded(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	var out, errOut bytes.Buffer
	// The holder learns of the operator's overwrite at its next renewal,
	// every 100ms with this TTL: a hold of 250ms leaves room for two, even
	// on a busy machine.
	code := run(t.Context(), []string{"demo", "--workers", "3", "--duration", "2s",
		"--hold", "250ms", "--rest", "20ms", "--ttl", "300ms"}, &out, &errOut)
	assert.Equal(t, exitOK, code, "stderr: %s", errOut.String())
	checkDemoOutput(t, out.String(), 3, true)
	assert.Contains(t, out.String(), "embedded Redis")
}

// checkDemoOutput checks the demo's closing summary.
func checkDemoOutput(t *testing.T, got string, workers int, stolen bool) {
	t.Helper()
	want := []string{"acquired  token=", "released  token=", "wait p50: ", "p99: ",
		"tokens strictly increasing: true", "overlaps: 0"}
	if stolen {
		want = append(want, "LOST", "losses seen: 1")
	}
	for _, w := range want {
		assert.Contains(t, got, w)
	}
	for w := 1; w <= workers; w++ {
		assert.Contains(t, got, fmt.Sprintf("worker %d: ", w))
		assert.NotContains(t, got, fmt.Sprintf("worker %d: 0 acquisitions", w), "a worker never got the lock")
	}
}

func TestDemoOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	code, out, errOut := runDistlock(t, "demo", "--redis", srv.URL(), "--workers", "2", "--duration", "1500ms",
		"--hold", "250ms", "--rest", "20ms", "--ttl", "300ms")
	assert.Equal(t, exitOK, code, "stderr: %s", errOut)
	assert.Contains(t, out, "on "+srv.URL())
	checkDemoOutput(t, out, 2, true)
}

// With -v the demo prints each renewal in its own format, among its other
// lines, and nothing in another format on stderr.
func TestDemoVerbose(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	var out, errOut bytes.Buffer
	code := run(t.Context(), []string{"demo", "-v", "--workers", "2", "--duration", "1200ms",
		"--hold", "300ms", "--rest", "20ms", "--ttl", "300ms"}, &out, &errOut)
	assert.Equal(t, exitOK, code, "stderr: %s", errOut.String())
	assert.Empty(t, errOut.String(), "-v should not write a second log to stderr")
	checkDemoOutput(t, out.String(), 2, true)
	assert.Regexp(t, `(?m)^ +\d+\.\d{3}s  worker \d  renewed   token=\d+  took=\S+$`, out.String())
	assert.Regexp(t, `(?m)^ +\d+\.\d{3}s  worker \d  renewal refused  token=\d+  took=\S+$`, out.String(),
		"the operator's overwrite should show as a refused renewal")
	events, _, _ := strings.Cut(out.String(), "\nsummary")
	for i, line := range strings.Split(strings.TrimSpace(events), "\n")[1:] {
		assert.Regexp(t, `^ +\d+\.\d{3}s  worker \d  \S`, line, "line %d is in another format", i+2)
	}
}
