package distlock

import (
	"context"
	"sync"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// Noticing a restart: a keeper watches one client's connection for the
// guards of this process that renew through it, and has them renew at once
// when the connection comes back after it dropped.
//
// A Redis restarted without persistence has forgotten every lease, and
// nothing a client does can keep one. What a holder can do is learn it
// within a round trip of the server answering again, rather than at its
// next renewal (up to a third of the TTL later, while another client may
// already hold the lock). A keeper keeps one subscription on the client,
// to a channel nobody publishes on: it breaks when the connection does,
// and when the keeper's subscription is confirmed again, the server
// answers again, and every guard the keeper watches renews at once. A
// guard whose lease the server forgot is refused, and Lost.
//
// A guard is watched from its first confirmed renewal until its end or
// its final loss, whether or not it has a goroutine at that moment: a
// dormant guard is woken by its renewal timer, set to fire at once (a
// guard younger than its first renewal is not watched, and learns at that
// renewal, a third of the TTL in at most). On a Redis Cluster the
// subscription lives on one node, the one of the lock that started the
// keeper: a restart of another node is noticed at each guard's next
// renewal, as before.
//
// The keepers belong to the process (proc.keepers): one per client while
// any of its guards is watched. The last guard to leave a keeper ends its
// subscription and waits for its goroutine (a guard lives for a third of
// its TTL at least before it is watched, so subscribing again for the next
// one costs little).

// Bounds of the keeper's pause between two tries to subscribe again: short,
// so that a server that is back is noticed soon, and one try a tenth of a
// second at most while it is down.
const (
	keeperFirstRetry = 10 * time.Millisecond
	keeperMaxRetry   = 100 * time.Millisecond
)

// keeperSet is the process's keepers, by client.
type keeperSet struct {
	mu sync.Mutex
	m  map[any]*keeper
}

// keeper is one client's watch; see above.
type keeper struct {
	set    *keeperSet
	client any
	store  store
	keys   lease.Keys // whose channel it subscribes to

	mu     sync.Mutex
	guards map[*Guard]struct{}
	cancel context.CancelFunc
	// asking is closed when the server confirms the subscription that run
	// is asking for, or when that call returns; nil while run is not
	// asking (it is confirmed, or pausing before it asks again).
	asking chan struct{}
	done   chan struct{} // closed when the subscription goroutine has ended
}

// keeperSettle bounds how long the last guard to leave a keeper waits for
// its subscription's first confirmation before ending it: a subscription
// ended while the server has yet to confirm it may be confirmed after its
// end, and stay on the connection.
const keeperSettle = time.Second

// watch adds a guard to its client's keeper, starting one if there is
// none, and returns the keeper; the guard leaves it at its end or its
// final loss.
func (s *keeperSet) watch(g *Guard) *keeper {
	e := g.e
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.m[e.client]
	if k == nil {
		if s.m == nil {
			s.m = make(map[any]*keeper)
		}
		ctx, cancel := context.WithCancel(context.Background())
		k = &keeper{set: s, client: e.client, store: e.store, keys: e.keys,
			guards: make(map[*Guard]struct{}), cancel: cancel, done: make(chan struct{})}
		s.m[e.client] = k
		go k.run(ctx)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.guards[g] = struct{}{}
	return k
}

// detach removes a guard and reports whether it was the last: then the
// keeper is no longer in the process's set, and whoever detached it must
// stop it. It never waits, so a caller that ends a dormant guard can call
// it on its own goroutine and leave the stop to the background.
func (k *keeper) detach(g *Guard) (last bool) {
	k.set.mu.Lock()
	defer k.set.mu.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.guards, g)
	last = len(k.guards) == 0
	if last {
		delete(k.set.m, k.client)
		if len(k.set.m) == 0 {
			k.set.m = nil
		}
	}
	return last
}

// stop ends the subscription of a keeper that its last guard has left
// (if a subscription is being asked for, once the server has answered it,
// or after keeperSettle) and waits for its goroutine to end (the
// unsubscribe is bounded by the lease package's unsubscribe timeout).
func (k *keeper) stop() {
	k.mu.Lock()
	asking := k.asking
	k.mu.Unlock()
	if asking != nil {
		t := time.NewTimer(keeperSettle)
		select {
		case <-asking:
		case <-t.C:
		}
		t.Stop()
	}
	k.cancel()
	<-k.done
}

// ask records that run asks for the subscription, and returns the
// function that records its answer (the confirmation, or the call's
// return), which may be called more than once.
func (k *keeper) ask() (answered func()) {
	ch := make(chan struct{})
	k.mu.Lock()
	k.asking = ch
	k.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			k.mu.Lock()
			if k.asking == ch {
				k.asking = nil
			}
			k.mu.Unlock()
			close(ch)
		})
	}
}

// run keeps the keeper subscribed until ctx ends, and has the guards
// renew each time the subscription is confirmed again after it broke.
// The ready callback runs in the goroutine that calls Subscribe, or in
// the client's own; confirmed is only used by one of them at a time.
// Where the server refuses pub/sub it stops: the guards renew on their
// schedule.
func (k *keeper) run(ctx context.Context) {
	defer close(k.done)
	pause := backoff{first: keeperFirstRetry, most: keeperMaxRetry}
	confirmed := false
	// Every confirmation after the first follows a break: rueidis
	// subscribes again on a new connection within the same call (calling
	// ready again), go-redis's adapter returns and resubscribe calls again.
	resubscribe(ctx, &pause, func() error {
		answered := k.ask()
		defer answered()
		return k.store.Subscribe(ctx, k.keys, "keeper:"+proc.roomID, func() {
			answered()
			pause.reset()
			if confirmed {
				k.renewAll()
			}
			confirmed = true
		}, func(string, int64) {})
	}, func(noPubSub bool) bool { return !noPubSub })
}

// renewAll asks every guard the keeper watches to renew now. It runs in
// the subscription's ready callback, so it never blocks (see
// Guard.renewSoon).
//
// Through the client's batcher (batcher.go), the renewals that this asks
// for go out together: each is asked for with no slack left, and the
// renewals already waiting for their batch are sent now too.
func (k *keeper) renewAll() {
	k.mu.Lock()
	for g := range k.guards {
		g.renewSoon()
	}
	k.mu.Unlock()
	if b := proc.batchers.get(k.client); b != nil {
		b.flushAll()
	}
}
