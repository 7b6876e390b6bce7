package distlocktest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/distlocktest"
)

// startLocked starts an in-process server and locks the Mutex name on it.
// The TTL is short: the guard renews every third of a second and so
// notices a loss within that.
func startLocked(name string) (*distlocktest.Server, *distlock.Mutex, *distlock.Guard) {
	srv, err := distlocktest.Start()
	if err != nil {
		log.Fatal(err)
	}
	m, err := distlock.NewMutex(srv.Client(), name, distlock.WithTTL(time.Second))
	if err != nil {
		srv.Close()
		log.Fatal(err)
	}
	g, err := m.Lock(context.Background())
	if err != nil {
		srv.Close()
		log.Fatal(err)
	}
	return srv, m, g
}

// Take the lease away from a holder and watch it find out, as a test of the
// holder's loss handling would. In a test function, use
// distlocktest.New(t) instead of Start and Close.
func ExampleServer_ForceLoss() {
	srv, m, g := startLocked("nightly-report")
	defer srv.Close()
	defer g.Release(context.Background())

	if err := srv.ForceLoss(m); err != nil {
		log.Fatal(err)
	}

	// The code under test runs its work under g.Context(), which is
	// cancelled at the loss.
	select {
	case <-g.Context().Done():
	case <-time.After(5 * time.Second):
		log.Fatal("the loss went unnoticed")
	}
	cause := context.Cause(g.Context())
	fmt.Println("lost:", errors.Is(cause, distlock.ErrLost))
	var lost *distlock.LostError
	if errors.As(cause, &lost) {
		fmt.Println("reason:", lost.Reason)
	}
	fmt.Println("state:", g.State())
	// Output:
	// lost: true
	// reason: refused
	// state: lost
}

// Another client takes over the lease, as after an expiry during a long
// pause; the holder learns who has it now.
func ExampleServer_OverwriteLease() {
	srv, m, g := startLocked("reindex")
	defer srv.Close()
	defer g.Release(context.Background())

	if err := srv.OverwriteLease(m.Key(), "host-b"); err != nil {
		log.Fatal(err)
	}
	<-g.Context().Done()
	var lost *distlock.LostError
	if errors.As(context.Cause(g.Context()), &lost) {
		fmt.Println("lost to", lost.Holder)
	}
	// Output:
	// lost to host-b
}
