package distlocktest

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: a
// server's clock, the wait for a redis-server process, a client's
// connections, or a guard of the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
