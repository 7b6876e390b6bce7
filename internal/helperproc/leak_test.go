package helperproc_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/distkit-go/distlock/internal/helperproc"
)

// TestMain runs a helper's main when this binary was started as one, and
// otherwise the tests, failing them if any goroutine outlives them.
func TestMain(m *testing.M) {
	if role := helperproc.Role(); role != "" {
		os.Exit(runHelper(role))
	}
	goleak.VerifyTestMain(m)
}
