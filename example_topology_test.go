package distlock_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock"
)

// A lock on a primary with replicas behind Sentinel, where a failover must
// not grant the lock twice: every acquisition and renewal waits until one
// replica has it. (No output: this example needs a Sentinel deployment.)
func ExampleWithReplicaAck() {
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"},
		Sentinel: rueidis.SentinelOption{
			MasterSet:               "mymaster",
			TopologyRefreshInterval: 5 * time.Second,
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	m, err := distlock.NewMutex(client, "nightly-report",
		distlock.WithTTL(10*time.Second),
		distlock.WithReplicaAck(1, 200*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	g, err := m.Lock(ctx)
	if errors.Is(err, distlock.ErrNotReplicated) {
		// The primary granted the lock but no replica confirmed it in time;
		// the lease was deleted again. Retry later, or alert: a replica is
		// down or lagging.
		log.Print(err)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer g.Release(context.WithoutCancel(ctx))
	// ... work under g.Context(), writes fenced with g.Token() ...
}
