package distlock_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/distkit-go/distlock"
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
//
// Before it looks, it waits for what the last tests' closed clients left
// to end on its own: each client's session lingers a moment after its last
// lock, room or watch, and then stops its restart watch, which may be
// waiting out a retry of its subscription inside the client (a second on
// a Sentinel client whose primary went away). goleak's own retries last
// about as long, so under load the check could catch that stop halfway.
// The wait is bounded: a session that never goes is still reported, by
// goleak (its goroutines) and here.
func TestMain(m *testing.M) {
	if role := helperproc.Role(); role != "" {
		os.Exit(runHelper(role))
	}
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(exitSettle)
		for distlock.Sessions() > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := distlock.Settle(ctx)
		cancel()
		if n := distlock.Sessions(); err != nil || n > 0 {
			fmt.Fprintf(os.Stderr, "after the tests: %d client sessions still live and Settle returned %v, %v later\n", n, err, exitSettle)
			code = 1
		}
		if err := goleak.Find(
			goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
			goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on a successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// exitSettle bounds TestMain's wait for the sessions of closed clients.
const exitSettle = 10 * time.Second
