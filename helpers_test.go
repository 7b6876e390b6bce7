package distlock_test

import (
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/suite"
)

// Helpers shared by the package's tests; those that the client-independent
// tests in internal/suite use as well are written there once.

// Timing used across the tests. Scheduling on a busy 2-core machine can add
// tens of milliseconds to any wake-up, so waits for an outcome are generous
// and assertions about "not before" use the contract's own bounds.
const (
	eventually = 5 * time.Second // upper bound for something that should happen soon
	pollEvery  = 5 * time.Millisecond
)

// The helpers that the suite's tests use too, from internal/suite.
var (
	release      = suite.Release
	waitState    = suite.WaitState
	nextEvent    = suite.NextEvent
	waitRenewed  = suite.WaitRenewed
	get          = suite.Get
	inLine       = suite.InLine
	waitInLine   = suite.WaitInLine
	wakeChannels = suite.WakeChannels
	exists       = suite.Exists
	lockAsync    = suite.LockAsync
	acquireAsync = suite.Async
	await        = suite.Await
)

// outcome is what an acquisition in the background (acquireAsync,
// lockAsync) returned, and when.
type outcome = suite.Outcome

// newMutex returns a Mutex of c, failing the test on an error.
func newMutex(t *testing.T, c rueidis.Client, key string, opts ...distlock.Option) *distlock.Mutex {
	t.Helper()
	m, err := distlock.NewMutex(c, key, opts...)
	require.NoError(t, err)
	return m
}

// pollUntil polls cond every pollEvery until it holds or within has
// passed, and reports whether it held.
func pollUntil(within time.Duration, cond func() bool) bool {
	return pollEveryUntil(pollEvery, within, cond)
}

// pollEveryUntil is pollUntil with a pause of every between two polls.
func pollEveryUntil(every, within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(every)
	}
	return true
}
