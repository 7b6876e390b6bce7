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

// Take the lease away from a holder and watch it find out, as a test of the
// holder's loss handling would. In a test function, use
// distlocktest.New(t) instead of Start and Close.
func ExampleServer_ForceLoss() {
	srv, err := distlocktest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()

	// A short TTL: the guard renews every third of a second and notices the
	// loss then.
	m, err := distlock.NewMutex(srv.Client(), "nightly-report", distlock.WithTTL(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	g, err := m.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Release(ctx)

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
	srv, err := distlocktest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()

	m, err := distlock.NewMutex(srv.Client(), "reindex", distlock.WithTTL(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	g, err := m.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Release(ctx)

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
