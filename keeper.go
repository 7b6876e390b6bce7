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
// A guard is watched from its acquisition until its end or its final
// loss: an actor is told on its renewNow slot, and a young guard (no goroutine
// yet) has its renewal timer fired at once, which brings its first
// renewal forward. On a Redis Cluster the subscription lives on one node,
// the one of the lock that started the keeper: a restart of another node
// is noticed at each guard's next renewal, as before.
//
// The keepers belong to the process (proc.keepers): one per client while
// any of its guards is watched, and for keeperLinger after the last one
// left, so that a client that takes and releases locks one after the
// other keeps one subscription rather than making one per lock. The
// linger's timer then ends the subscription and waits for its goroutine,
// as background work that Settle waits for; nothing a guard does waits
// for a keeper.

// Bounds of the keeper's pause between two tries to subscribe again: short,
// so that a server that is back is noticed soon, and one try a tenth of a
// second at most while it is down.
const (
	keeperFirstRetry = 10 * time.Millisecond
	keeperMaxRetry   = 100 * time.Millisecond
)

// keeperLinger is how long a keeper stays after its last guard left: as
// long as a waiting room lingers (roomLinger), for the same reason.
const keeperLinger = roomLinger

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
	// linger stops the keeper keeperLinger after its last guard left
	// (lingering), unless one came meanwhile; made the first time, then
	// reused. stopped: it has left the process's set.
	linger    *time.Timer
	lingering bool
	stopped   bool
	cancel    context.CancelFunc
	// asking is closed when the server confirms the subscription that run
	// is asking for, or when that call returns; nil while run is not
	// asking (it is confirmed, or pausing before it asks again).
	asking chan struct{}
	done   chan struct{} // closed when the subscription goroutine has ended
}

// keeperSettle bounds how long a keeper's stop waits for its
// subscription's first confirmation before ending it: a subscription
// ended while the server has yet to confirm it may be confirmed after its
// end, and stay on the connection.
const keeperSettle = time.Second

// watch adds a new guard to its client's keeper, starting one if there
// is none, sets the watch on its Lock context and arms its renewal timer
// to fire due from now; the guard leaves the keeper at its end or its
// final loss. The order matters, and all of it is done under the keeper's
// lock: g.keeper first, since the watch's run and the timer's may read
// it as soon as they are set; the watch before the timer, since the
// actor that the timer starts stops the watch; and the timer before the
// keeper's restart poke, which fires it, can see the guard (neither the
// watch's run nor the timer's reads g.renewal).
func (s *keeperSet) watch(g *Guard, due time.Duration) {
	e := g.e
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.m[e.client]
	if k == nil {
		if s.m == nil {
			s.m = make(map[any]*keeper)
		}
		ctx, cancel := context.WithCancel(context.Background())
		// Its channel, "<lock>:keeper:<process>", shares the lock's hash
		// tag (and so its node) but is none of the lock's wake channels.
		keys := e.keys
		keys.Wake = e.keys.Lease + ":keeper"
		k = &keeper{set: s, client: e.client, store: e.store, keys: keys,
			guards: make(map[*Guard]struct{}), cancel: cancel, done: make(chan struct{})}
		s.m[e.client] = k
		go k.run(ctx)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.guards[g] = struct{}{}
	k.lingering = false
	g.keeper = k
	if g.lockCtx.Done() != nil {
		g.unwatch = context.AfterFunc(g.lockCtx, g.lockCtxEnded)
	}
	g.renewal = time.AfterFunc(due, g.activate)
}

// detach removes a guard; the last one out has the keeper linger. It
// never waits.
func (k *keeper) detach(g *Guard) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.guards, g)
	if len(k.guards) == 0 && !k.lingering {
		k.lingering = true
		if k.linger == nil {
			k.linger = time.AfterFunc(keeperLinger, k.lingered)
		} else {
			k.linger.Reset(keeperLinger)
		}
	}
}

// lingered is the linger's timer: a keeper that no guard came back to
// leaves the process's set and is stopped, on the timer's goroutine,
// counted as background work.
func (k *keeper) lingered() {
	s := k.set
	s.mu.Lock()
	k.mu.Lock()
	idle := k.lingering && len(k.guards) == 0 && !k.stopped
	if idle {
		k.stopped = true
		delete(s.m, k.client)
		if len(s.m) == 0 {
			s.m = nil
		}
		proc.work.add(1)
	}
	k.mu.Unlock()
	s.mu.Unlock()
	if idle {
		defer proc.work.done()
		k.stop()
	}
}

// stop ends the subscription of a keeper that has left the process's set
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
		return k.store.Subscribe(ctx, k.keys, proc.roomID, func() {
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
