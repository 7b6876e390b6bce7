package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/distkit-go/distlock"
)

// Readers share the lock, a writer has it alone. Two readers hold it; a
// writer waits for them; a reader that comes while the writer waits
// queues behind it (the writer does not starve), and gets the lock when
// the writer releases, with a larger token.
func ExampleRWMutex() {
	srv := exampleRedis()
	defer srv.Close()
	ctx := context.Background()
	rw, err := distlock.NewRWMutex(srv.Client(), "config", distlock.WithTTL(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}

	r1, err := rw.RLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	r2, err := rw.RLock(ctx) // shares the lock with r1
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("two readers:", r1.State(), r2.State())

	writer := make(chan *distlock.Guard)
	go func() {
		g, err := rw.Lock(ctx) // waits for both readers
		if err != nil {
			log.Fatal(err)
		}
		writer <- g
	}()
	// (The example waits until the writer stands in the lock's line.)
	c := srv.Client()
	queued := func() bool {
		n, _ := c.Do(ctx, c.B().Zcard().Key(rw.Key()+":queue").Build()).AsInt64()
		return n > 0
	}
	for !queued() {
		time.Sleep(time.Millisecond)
	}
	if _, err := rw.TryRLock(ctx); errors.Is(err, distlock.ErrNotAcquired) {
		fmt.Println("a new reader is refused while the writer waits")
	}

	r1.Release(context.WithoutCancel(ctx))
	r2.Release(context.WithoutCancel(ctx))
	w := <-writer
	fmt.Println("the writer's token is above the readers':", w.Token() > r2.Token())
	w.Release(context.WithoutCancel(ctx))
	// Output:
	// two readers: acquired acquired
	// a new reader is refused while the writer waits
	// the writer's token is above the readers': true
}

// Downgrade turns a write hold into a read hold of the same guard, in one
// step: the writer keeps the lock (and its token) while readers join it.
// There is no upgrade: to write after reading, release and Lock, then read
// again.
func ExampleGuard_Downgrade() {
	srv := exampleRedis()
	defer srv.Close()
	ctx := context.Background()
	rw, err := distlock.NewRWMutex(srv.Client(), "config", distlock.WithTTL(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}

	g, err := rw.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// ... write the new configuration under g.Token() ...
	if err := g.Downgrade(ctx); err != nil {
		log.Fatal(err)
	}
	r, err := rw.TryRLock(ctx) // a reader gets in beside the downgraded writer
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("downgraded:", g.State(), "reader:", r.State())
	fmt.Println("again:", errors.Is(g.Downgrade(ctx), distlock.ErrNotWriteLock))
	r.Release(context.WithoutCancel(ctx))
	g.Release(context.WithoutCancel(ctx))
	// Output:
	// downgraded: acquired reader: acquired
	// again: true
}
