package goredis_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: a
// guard's actor, a waiting room's subscription, a call left behind, or one
// of go-redis's that a Close should have ended.
//
// One goroutine of rueidis is exempt, as in distlock's own tests: when a
// cluster client's topology refresh drops connections, rueidis closes them
// from a goroutine that first sleeps five seconds, and nothing can stop or
// wait for it. The mixed-fleet tests use rueidis clients.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}
