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
	"github.com/distkit-go/distlock/distlocktest"
)

// exampleRedis starts an in-process Redis for the examples, with the
// distlocktest package that your own tests can use too. In your code, the
// client comes from rueidis.NewClient with your server's address.
func exampleRedis() *distlocktest.Server {
	srv, err := distlocktest.Start()
	if err != nil {
		log.Fatal(err)
	}
	return srv
}

// Lock, do the work under the guard's context, release.
func Example() {
	srv := exampleRedis()
	defer srv.Close()
	client := srv.Client()

	m, err := distlock.NewMutex(client, "customer-42", distlock.WithTTL(5*time.Second))
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
	// holding distlock:{customer-42} state acquired
	// release: released
}

// Watch the guard's events while working, and stop as soon as the lease is
// lost. Here an operator deletes the key half-way.
func ExampleGuard_Subscribe() {
	srv := exampleRedis()
	defer srv.Close()
	client := srv.Client()

	m, err := distlock.NewMutex(client, "reindex", distlock.WithTTL(time.Second))
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
	if err := srv.ForceLoss(m); err != nil {
		log.Fatal(err)
	}

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
	srv := exampleRedis()
	defer srv.Close()
	client := srv.Client()

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
	srv := exampleRedis()
	defer srv.Close()
	client := srv.Client()
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
	if err := srv.ForceLoss(m); err != nil {
		log.Fatal(err)
	}
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

// TryLock reports who holds the lock when it cannot take it. For a job that
// one replica of many should run, see the run-once example.
func ExampleMutex_TryLock() {
	srv := exampleRedis()
	defer srv.Close()
	client := srv.Client()
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

// runNightlyReport is what every replica of a service runs when its
// scheduler fires. Exactly one replica runs the report; the others find the
// lock held and skip it. It reports whether this replica ran it.
func runNightlyReport(ctx context.Context, client rueidis.Client, replica string,
	report func(ctx context.Context, token int64) error) (bool, error) {
	m, err := distlock.NewMutex(client, "nightly-report", distlock.WithOwner(replica))
	if err != nil {
		return false, err
	}
	g, err := m.TryLock(ctx) // one attempt: never wait for the lock
	if errors.Is(err, distlock.ErrNotAcquired) {
		return false, nil // another replica is running it: skip
	}
	if err != nil {
		return false, err // Redis failed: nobody may run it this time, so say so
	}
	defer g.Release(context.WithoutCancel(ctx))
	return true, report(g.Context(), g.Token())
}

// A scheduled job that must run once, although all replicas are scheduled to
// run it: TryLock, and skip when it reports ErrNotAcquired. Lock would be
// wrong here: each replica would wait for the lock and then run the job
// again, one after another.
//
// TryLock keeps the other replicas out while the job runs. A replica whose
// scheduler fires after the job has finished and released the lock would run
// it again; if replicas can start that far apart, keep the lease until the
// period ends instead of releasing it (see the README, "Jobs that must run
// once").
func ExampleMutex_TryLock_runOnce() {
	srv := exampleRedis()
	defer srv.Close()
	ctx := context.Background()

	const replicas = 5
	// A real report takes a while; this one lasts until the other replicas
	// have tried (or 5 s at most).
	othersTried := make(chan struct{})
	report := func(ctx context.Context, token int64) error {
		select {
		case <-othersTried:
		case <-time.After(5 * time.Second):
		}
		return nil
	}
	results := make(chan bool, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() {
			ran, err := runNightlyReport(ctx, srv.Client(), fmt.Sprintf("replica-%d", i), report)
			if err != nil {
				log.Fatal(err)
			}
			results <- ran
		})
	}
	ran, skipped := 0, 0
	for n := 1; n <= replicas; n++ {
		if <-results {
			ran++
		} else {
			skipped++
		}
		if n == replicas-1 {
			close(othersTried)
		}
	}
	wg.Wait()
	fmt.Println("ran the report:", ran)
	fmt.Println("skipped it:", skipped)
	// Output:
	// ran the report: 1
	// skipped it: 4
}
