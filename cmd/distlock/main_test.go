package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestDemoEmbedded(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	var out, errOut bytes.Buffer
	code := run(t.Context(), []string{"demo", "--workers", "3", "--duration", "1500ms",
		"--hold", "150ms", "--rest", "20ms", "--ttl", "300ms"}, &out, &errOut)
	assert.Equal(t, exitOK, code, "stderr: %s", errOut.String())
	got := out.String()
	for _, want := range []string{"embedded Redis", "acquired  token=", "released  token=",
		"LOST", "tokens strictly increasing: true", "overlaps: 0", "losses seen: 1"} {
		assert.Contains(t, got, want)
	}
	for w := 1; w <= 3; w++ {
		assert.NotContains(t, got, "worker "+string(rune('0'+w))+": 0 acquisitions", "a worker never got the lock")
	}
}

func TestUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	assert.Equal(t, exitUsage, run(t.Context(), nil, &out, &errOut))
	assert.Equal(t, exitUsage, run(t.Context(), []string{"nope"}, &out, &errOut))
	assert.True(t, strings.Contains(errOut.String(), "unknown command"))
	errOut.Reset()
	assert.Equal(t, exitUsage, run(t.Context(), []string{"demo", "--workers", "0"}, &out, &errOut))
	assert.Contains(t, errOut.String(), "--workers")
	assert.Equal(t, exitOK, run(t.Context(), []string{"help"}, &out, &errOut))
	assert.Equal(t, exitOK, run(t.Context(), []string{"demo", "-h"}, &out, &errOut))
}
