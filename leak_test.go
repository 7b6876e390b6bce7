package distlock_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: a
// guard's actor, its renewals, a subscription or a test helper.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
