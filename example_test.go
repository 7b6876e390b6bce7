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

// Six workers share four permits: at most four run at once, and the other
// two wait in line until a permit is given back. Each worker holds its
// permit under the guard's context and gives it back with Release.
func ExampleSemaphore() {
	srv := exampleRedis()
	defer srv.Close()
	ctx := context.Background()

	const permits, workers = 4, 6
	s, err := distlock.NewSemaphore(srv.Client(), "video-encoders", permits, distlock.WithTTL(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}

	var (
		mu         sync.Mutex
		inside     int                   // workers holding a permit now
		most       int                   // the most at once
		tokens     []int64               // every grant's fencing token
		full       bool                  // all permits have been held at once
		firstBatch = make(chan struct{}) // closed then
	)
	encode := func(ctx context.Context, token int64) {
		mu.Lock()
		inside++
		most = max(most, inside)
		tokens = append(tokens, token)
		if inside == permits && !full {
			full = true
			close(firstBatch)
		}
		mu.Unlock()
		// The first four hold their permits until all four are in, so that
		// the last two must wait for one.
		select {
		case <-firstBatch:
		case <-ctx.Done(): // the permit is in doubt: stop
		}
		mu.Lock()
		inside--
		mu.Unlock()
	}

	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			g, err := s.Acquire(ctx) // waits in line while all permits are held
			if err != nil {
				log.Fatal(err)
			}
			defer g.Release(context.WithoutCancel(ctx))
			encode(g.Context(), g.Token())
		})
	}
	wg.Wait()

	distinct := make(map[int64]bool)
	for _, tok := range tokens {
		distinct[tok] = true
	}
	fmt.Println("workers that ran:", len(tokens))
	fmt.Println("most at once:", most)
	fmt.Println("distinct tokens:", len(distinct))
	// Output:
	// workers that ran: 6
	// most at once: 4
	// distinct tokens: 6
}

// TryAcquire makes one attempt; when every permit is held, the error says
// how many there are.
func ExampleSemaphore_TryAcquire() {
	srv := exampleRedis()
	defer srv.Close()
	ctx := context.Background()

	s, err := distlock.NewSemaphore(srv.Client(), "exports", 2)
	if err != nil {
		log.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		g, err := s.TryAcquire(ctx)
		var full *distlock.NotAcquiredError
		if errors.As(err, &full) {
			fmt.Printf("export %d: skipped, all %d permits are held\n", i, full.Permits)
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		defer g.Release(ctx)
		fmt.Printf("export %d: running\n", i)
	}
	// Output:
	// export 1: running
	// export 2: running
	// export 3: skipped, all 2 permits are held
}

// Two candidates campaign; an observer follows the leader. When the first
// leader resigns (Release), the lead passes to the next in line, with a
// higher fencing token.
func ExampleElection() {
	srv := exampleRedis()
	defer srv.Close()
	ctx := context.Background()

	// Each candidate would be a process of its own, with its own Election.
	newElection := func() *distlock.Election {
		e, err := distlock.NewElection(srv.Client(), "scheduler", distlock.WithTTL(5*time.Second))
		if err != nil {
			log.Fatal(err)
		}
		return e
	}
	a, b, watcher := newElection(), newElection(), newElection()

	watchCtx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	leaders := watcher.Observe(watchCtx)
	fmt.Println("observer:", <-leaders) // the current leader, at once
	// nextLeader returns the next leader that is somebody, skipping a
	// moment with nobody in between.
	nextLeader := func() distlock.Leader {
		for l := range leaders {
			if !l.IsZero() {
				return l
			}
		}
		panic("the Observe channel closed")
	}

	first, err := a.Campaign(ctx, "node-a:8080") // nobody leads: a leads at once
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("observer: leader is", nextLeader().Value)

	// b waits in line for the lead.
	second := make(chan *distlock.Guard)
	go func() {
		g, err := b.Campaign(ctx, "node-b:8080")
		if err != nil {
			log.Fatal(err)
		}
		second <- g
	}()

	// a resigns; the release passes the lead to b.
	if _, err := first.Release(ctx); err != nil {
		log.Fatal(err)
	}
	l := nextLeader()
	fmt.Println("observer: leader is", l.Value)
	g := <-second
	fmt.Println("b's guard:", g.State())
	fmt.Println("token of the new term is higher:", l.Token == g.Token() && g.Token() > first.Token())
	g.Release(ctx)
	// Output:
	// observer: no leader
	// observer: leader is node-a:8080
	// observer: leader is node-b:8080
	// b's guard: acquired
	// token of the new term is higher: true
}

// Leader asks Redis once who leads. Since is when the term began, on the
// Redis server's clock; the token is the leader guard's.
func ExampleElection_Leader() {
	srv := exampleRedis()
	defer srv.Close()
	ctx := context.Background()

	e, err := distlock.NewElection(srv.Client(), "billing-primary")
	if err != nil {
		log.Fatal(err)
	}
	l, err := e.Leader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("before:", l)

	g, err := e.Campaign(ctx, "10.0.0.7:9000")
	if err != nil {
		log.Fatal(err)
	}
	defer g.Release(ctx)
	l, err = e.Leader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leader:", l.Value)
	fmt.Println("its token:", l.Token == g.Token())
	fmt.Println("term began less than a minute ago:", time.Since(l.Since) < time.Minute)
	// Output:
	// before: no leader
	// leader: 10.0.0.7:9000
	// its token: true
	// term began less than a minute ago: true
}
