package distlock_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/distkit-go/distlock/internal/helperproc"
)

// TestMain fails the package's tests if any goroutine outlives them: a
// guard's actor, its renewals, a subscription or a test helper. When the
// fault suite has started this binary as a lock-holding helper process, it
// runs that instead (see safety_helper_test.go).
//
// One goroutine of rueidis is exempt: when a cluster client's topology
// refresh drops connections (after a failover or a slot migration, for
// instance), rueidis closes them from a goroutine that first sleeps five
// seconds, and nothing can stop or wait for it, not even Close. The same
// holds for the goroutine in which a cluster client delays the refresh
// that a MOVED or a failed call asks for (its singleflight's DelayDo,
// about a second).
func TestMain(m *testing.M) {
	if role := helperproc.Role(); role != "" {
		os.Exit(runHelper(role))
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"))
}
