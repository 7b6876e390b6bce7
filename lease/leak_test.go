package lease_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them.
//
// One goroutine of rueidis is exempt, as in the distlock package: when a
// cluster client's topology refresh drops connections (TestQueueCluster's
// client may refresh while the new cluster settles), rueidis closes them
// from a goroutine that first sleeps five seconds, and nothing can stop or
// wait for it, not even Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}
