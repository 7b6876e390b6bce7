package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/embedredis"
)

// exampleRedis starts an embedded Redis for the examples. In your code, the
// client comes from rueidis.NewClient with your server's address.
func exampleRedis() (rueidis.Client, func()) {
	srv, err := embedredis.Start()
	if err != nil {
		log.Fatal(err)
	}
	return srv.Client(), srv.Close
}

// Lock, do the work under the guard's context, release.
func Example() {
	client, closeRedis := exampleRedis()
	defer closeRedis()

	m, err := distlock.NewMutex(client, "nightly-report", distlock.WithTTL(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	g, err := m.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holding", g.Key(), "state", g.State())

	// The critical section runs under g.Context(): it is cancelled if the
	// lease is ever in doubt.
	if err := g.Context().Err(); err != nil {
		log.Fatal(err)
	}

	st, err := g.Release(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("release:", st)
	// Output:
	// holding distlock:{nightly-report} state acquired
	// release: released
}

// Watch the guard's events while working, and stop as soon as the lease is
// lost. Here an operator deletes the key half-way.
func ExampleGuard_Subscribe() {
	client, closeRedis := exampleRedis()
	defer closeRedis()

	m, err := distlock.NewMutex(client, "reindex", distlock.WithTTL(300*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	g, err := m.Lock(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	defer g.Release(context.Background())

	events := g.Subscribe(context.Background())
	fmt.Println("first event:", (<-events).State)

	// Somebody deletes the lease; the next renewal finds out.
	client.Do(context.Background(), client.B().Del().Key(m.Key()).Build())

	work := time.NewTicker(10 * time.Millisecond)
	defer work.Stop()
	for {
		select {
		case ev := <-events:
			fmt.Println("event:", ev.State)
			var lost *distlock.LostError
			if errors.As(ev.Err, &lost) {
				fmt.Println("reason:", lost.Reason)
				return
			}
		case <-work.C:
			// ... one more batch of work ...
		}
	}
	// Output:
	// first event: acquired
	// event: lost
	// reason: refused
}

// Cancelling the context given to Lock releases the lock: no explicit
// Release is needed.
func ExampleMutex_Lock_cancel() {
	client, closeRedis := exampleRedis()
	defer closeRedis()

	m, err := distlock.NewMutex(client, "leader")
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g, err := m.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	cancel() // e.g. on shutdown
	<-g.Done()
	fmt.Println("state:", g.State())
	fmt.Println("cause:", context.Cause(g.Context()))

	// The lock is free again at once.
	g2, err := m.TryLock(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("next holder:", g2.State())
	g2.Release(context.Background())
	// Output:
	// state: released
	// cause: context canceled
	// next holder: acquired
}

// fencedStore is a resource that accepts a write only with a fencing token
// at least as high as any it has seen.
type fencedStore struct {
	mu      sync.Mutex
	highest int64
	value   string
}

func (s *fencedStore) Write(token int64, v string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token < s.highest {
		return fmt.Errorf("stale token: %d < %d", token, s.highest)
	}
	s.highest, s.value = token, v
	return nil
}

// Pass the fencing token with every write. A holder that was paused past its
// lease comes back with an old token, and the store turns it away.
func ExampleGuard_Token() {
	client, closeRedis := exampleRedis()
	defer closeRedis()
	ctx := context.Background()
	store := &fencedStore{}

	m, err := distlock.NewMutex(client, "balance")
	if err != nil {
		log.Fatal(err)
	}
	slow, err := m.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// The slow holder stalls; its lease runs out (simulated here by
	// deleting the key) and another process takes the lock.
	client.Do(ctx, client.B().Del().Key(m.Key()).Build())
	fast, err := m.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("newer token is higher:", fast.Token() > slow.Token())
	fmt.Println("fast writes:", store.Write(fast.Token(), "fast"))
	fast.Release(ctx)

	// The slow holder wakes up and writes without checking: fenced off.
	err = store.Write(slow.Token(), "slow")
	fmt.Println("slow write rejected:", err != nil)
	fmt.Println("value:", store.value)
	slow.Release(ctx)
	// Output:
	// newer token is higher: true
	// fast writes: <nil>
	// slow write rejected: true
	// value: fast
}

// TryLock reports who holds the lock when it cannot take it.
func ExampleMutex_TryLock() {
	client, closeRedis := exampleRedis()
	defer closeRedis()
	ctx := context.Background()

	a, _ := distlock.NewMutex(client, "import", distlock.WithOwner("host-a"))
	b, _ := distlock.NewMutex(client, "import", distlock.WithOwner("host-b"))
	g, err := a.TryLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Release(ctx)

	_, err = b.TryLock(ctx)
	var held *distlock.NotAcquiredError
	if errors.As(err, &held) {
		fmt.Println("busy, held by", held.Holder)
	}
	// Output:
	// busy, held by host-a
}
