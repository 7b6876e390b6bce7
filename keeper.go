package distlock

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/lease"
)

// Noticing a restart: a keeper watches the connection to one node of a
// client for the guards of this process that live on that node, and has
// them renew at once when the connection comes back after it dropped.
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
// Every live guard is watched, from its acquisition until its end or its
// final loss: an actor is told on its renewNow slot, and a young guard (no
// goroutine yet) has its renewal timer fired at once, which brings its
// first renewal forward.
//
// # When it subscribes
//
// On rueidis, a keeper subscribes only once one of its guards has lived
// keeperDelay, and a lock taken and released within that never makes it
// subscribe. There the subscription shares its connection with the
// commands, and is not free for them: rueidis sends a lone command on a
// connection that nothing else uses straight from the caller's goroutine,
// and moves the connection to its background pipeline (two goroutines
// and a queue that every command passes through) once a subscription is
// made on it, for the rest of the connection's life. Subscribing at the
// first Lock cost serial Lock+Release pairs with a context that cannot be
// cancelled about a fifth of their rate, and any command the client sends
// alone as much. A client that holds a lock longer than keeperDelay moves
// its connection all the same, from then on (before keepers watched young
// guards, that took a guard's first renewal, a third of the TTL in).
// Elsewhere (go-redis, whose subscriptions have connections of their own)
// a keeper subscribes as soon as it is made.
//
// A restart between a guard's acquisition and a delayed keeper's first
// confirmation breaks no subscription of the keeper's, so at that first
// confirmation every guard it watches renews at once, as after a break: a
// guard whose lease the server forgot learns it then, at most keeperDelay
// (or a pause between two tries to subscribe, no longer) after the server
// answers again. The keeper's timer (wake) runs while it has guards and no
// subscription: it finds the oldest guard, and subscribes or waits for
// that guard to reach keeperDelay.
//
// # Which node
//
// The keepers of a client are parts of its session (session.go), one per
// watch group: on a Redis Cluster the group is the hash slot of the
// guard's lock (lease.Client.BatchGroup), and the keeper subscribes to a
// channel of that slot, "<lock>:keeper:<process>" for the first lock of
// the slot it watched, so its subscription lives on the node that holds
// the slot's guards, and a restart of any node that a guard of the client
// lives on is noticed. A client whose locks share a few slots keeps a few
// subscriptions; one whose locks spread over many slots keeps one per
// slot: on rueidis, whose sharded subscriptions share one connection per
// node, a channel each; on go-redis, whose every subscription has a
// connection of its own, a connection each (as its waiting rooms do). Everywhere else (one server,
// Sentinel, a client that shards by hash tag, whose shards distlock cannot
// see) the group is one, and so is the keeper: a restart of another shard
// of a tag-sharded client is noticed at each guard's next renewal.
//
// A keeper whose last guard left lingers for keeperLinger with its
// subscription, on its session's linger timer, so that a client that
// takes and releases locks one after the other keeps one subscription
// rather than making one per lock. Then the linger's goroutine ends the
// subscription and waits for it, as background work that Settle waits
// for; nothing a guard does waits for a keeper.

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

// keeperDelay is how long a guard lives before its keeper subscribes (see
// "When it subscribes"): a tenth of a second, the longest pause between
// two tries to subscribe, so a restart before the subscription is noticed
// no later than one while the server is down.
const keeperDelay = keeperMaxRetry

// keeper is one watch group's watch, a part of its client's session; see
// above. Its fields are guarded by the session's mu, except those set at
// creation.
type keeper struct {
	s      *session
	group  string
	store  store
	keys   lease.Keys         // whose channel it subscribes to
	cancel context.CancelFunc // ends run's context; set with started
	done   chan struct{}      // closed when the subscription goroutine has ended

	guards map[*Guard]struct{}
	// idleSince is when its last guard left; the session's linger closes
	// it keeperLinger after that, unless a guard came meanwhile.
	idleSince time.Time
	// delayed: it subscribes once a guard has lived keeperDelay (see
	// "When it subscribes"); set at creation.
	delayed bool
	// started: its subscription goroutine (run) has been started.
	// waking: the timer wake, made at its first arming and reused, will
	// run woken, which starts it once a guard is keeperDelay old.
	started bool
	waking  bool
	wake    *time.Timer
	// off: the subscription has ended for good (the server refused
	// pub/sub); the guards renew on their schedule.
	off bool
	// asking is closed when the server confirms the subscription that run
	// is asking for, or when that call returns; nil while run is not
	// asking (it is confirmed, or pausing before it asks again).
	asking chan struct{}
	// probing: a probe (see answered) runs.
	probing bool
}

// keeperSettle bounds how long a keeper's stop waits for its
// subscription's first confirmation before ending it: a subscription
// ended while the server has yet to confirm it may be confirmed after its
// end, and stay on the connection.
const keeperSettle = time.Second

// watchGroup returns the watch group of e's lock: its hash slot on a
// Redis Cluster, and "" everywhere else (see "Which node").
func watchGroup(e *engine) string {
	br, ok := e.store.(batchRenewer)
	if !ok {
		return ""
	}
	g := br.BatchGroup(e.keys)
	if strings.HasPrefix(g, "{") {
		return "" // a hash tag: one keeper for every shard
	}
	return g
}

// watch adds a new guard to the keeper of its watch group in its client's
// session, making one if there is none (its subscription waits for a guard
// to have lived keeperDelay: see "When it subscribes"), sets the watch on
// its Lock context and arms its renewal timer to fire due from now; the
// guard leaves the keeper at its end or its final loss. The order matters, and
// all of it is done under the session's lock: g.keeper first, since the
// watch's run and the timer's may read it as soon as they are set; the
// watch before the timer, since the actor that the timer starts stops the
// watch; and the timer before the keeper's restart poke, which fires it,
// can see the guard (neither the watch's run nor the timer's reads
// g.renewal).
func (ss *sessionSet) watch(g *Guard, due time.Duration) {
	e := g.e
	s := ss.lock(e, true)
	defer s.mu.Unlock()
	group := watchGroup(e)
	k := s.keepers[group]
	if k == nil {
		// Its channel, "<lock>:keeper:<process>", shares the lock's hash
		// tag (and so its node) but is none of the lock's wake channels.
		keys := e.keys
		keys.Wake = e.keys.Lease + ":keeper"
		k = &keeper{s: s, group: group, store: e.store, keys: keys, done: make(chan struct{}),
			guards: make(map[*Guard]struct{}), delayed: delaysWatch(e.client)}
		s.keepers[group] = k
		if !k.delayed {
			k.start()
		}
	}
	k.guards[g] = struct{}{}
	g.keeper = k
	if !k.started && !k.waking {
		k.arm(keeperDelay)
	}
	if g.lockCtx.Done() != nil {
		g.unwatch = context.AfterFunc(g.lockCtx, g.lockCtxEnded)
	}
	g.renewal = time.AfterFunc(due, g.activate)
}

// delaysWatch reports whether the keepers of client subscribe only once a
// guard has lived keeperDelay: on rueidis (see "When it subscribes").
func delaysWatch(client any) bool {
	_, ok := client.(rueidis.Client)
	return ok
}

// start starts the keeper's subscription. The caller holds the session's
// mu.
func (k *keeper) start() {
	ctx, cancel := context.WithCancel(context.Background())
	k.started, k.cancel = true, cancel
	k.s.spawn(func() { k.run(ctx) })
}

// arm has woken run in d. The caller holds the session's mu.
func (k *keeper) arm(d time.Duration) {
	k.waking = true
	if k.wake == nil {
		k.wake = time.AfterFunc(d, k.woken)
	} else {
		k.wake.Reset(d)
	}
}

// woken is the function of the keeper's timer: it starts the subscription
// once the oldest guard the keeper watches has lived keeperDelay, and
// otherwise arms the timer for when it will have. A keeper with no guard
// left waits for the next one's watch, which arms the timer again; one
// that has left its session stays as it is (its stop does not wait for a
// subscription it never started).
func (k *keeper) woken() {
	s := k.s
	s.mu.Lock()
	defer s.mu.Unlock()
	k.waking = false
	if k.started || k.off || s.stopped || s.keepers[k.group] != k {
		return
	}
	var oldest time.Time
	for g := range k.guards {
		if oldest.IsZero() || g.acquired.Before(oldest) {
			oldest = g.acquired
		}
	}
	if oldest.IsZero() {
		return
	}
	if left := keeperDelay - time.Since(oldest); left > 0 {
		k.arm(left)
		return
	}
	k.start()
}

// detach removes a guard; the last one out leaves the keeper idle, to
// linger (with its subscription, if it has made one), or to go at once
// when the server refused its subscription. It never waits.
func (k *keeper) detach(g *Guard) {
	s := k.s
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(k.guards, g)
	if len(k.guards) > 0 {
		return
	}
	k.idleSince = time.Now()
	if !k.off {
		s.idle()
		return
	}
	if s.keepers[k.group] == k {
		s.dropKeeper(k)
		s.leftIdle()
	}
}

// stop ends the subscription of a keeper that has left its session (if a
// subscription is being asked for, once the server has answered it, or
// after keeperSettle) and waits for its goroutine to end (the unsubscribe
// is bounded by the lease package's unsubscribe timeout). A keeper that
// never subscribed only has its timer stopped (woken, if it runs anyway,
// finds it out of its session).
func (k *keeper) stop() {
	k.s.mu.Lock()
	asking, started := k.asking, k.started
	if k.wake != nil {
		k.wake.Stop()
	}
	k.s.mu.Unlock()
	if !started {
		return
	}
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
	s := k.s
	s.mu.Lock()
	k.asking = ch
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if k.asking == ch {
				k.asking = nil
			}
			s.mu.Unlock()
			close(ch)
		})
	}
}

// run keeps the keeper subscribed until ctx ends, and has the guards
// renew each time the subscription is confirmed again after it broke, and
// at its first confirmation too when the keeper subscribed late (for a
// restart before it: see "When it subscribes"). The ready callback runs
// in the goroutine that calls Subscribe, or in the client's own;
// confirmed is only used by one of them at a time. Where the server
// refuses pub/sub it stops: the guards renew on their schedule.
func (k *keeper) run(ctx context.Context) {
	defer close(k.done)
	defer k.cancel() // ends a probe when run ends on its own (see down)
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
			if confirmed || k.delayed {
				k.answered(ctx)
			}
			confirmed = true
		}, func(string, int64) {})
	}, k.down)
}

// down is the subscription's answer to its end (see resubscribe): it
// subscribes again while the keeper watches a guard and the server allows
// pub/sub. A keeper that watches none leaves its session then, without
// waiting out its linger: it never sets a subscription up again for no
// guard, on a client that its owner may have closed.
func (k *keeper) down(noPubSub bool) (again bool) {
	s := k.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if noPubSub {
		k.off = true
	} else if len(k.guards) > 0 {
		return true
	}
	if len(k.guards) == 0 && s.keepers[k.group] == k {
		s.dropKeeper(k)
		s.leftIdle()
	}
	return false
}

// answered is told, in the subscription's ready callback, that the
// subscription is confirmed again after it broke (or for the first time,
// on a keeper that subscribed late): every guard renews at once
// (renewAll). A confirmed subscription does not always mean that the
// server serves the guards' keys: a Cluster primary that rejoins after a
// restart confirms subscriptions at once but refuses commands
// (CLUSTERDOWN) for two seconds of its own, and a server loading its data
// refuses them (LOADING); the renewals sent then fail, and their retries
// come a growing pause later. So a probe, a goroutine of the session, asks
// the server too, and when it had to ask more than once, has every guard
// renew again once the server serves the keeper's slot. answered never
// blocks.
func (k *keeper) answered(ctx context.Context) {
	k.renewAll()
	s := k.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if !k.probing {
		k.probing = true
		s.spawn(func() { k.probe(ctx) })
	}
}

// probeValue is the value the probe renews with: no lease ever holds it
// (a holder's value is a random hex string), so the renewal is refused and
// changes nothing.
const probeValue = "keeper-probe"

// probe renews probeValue's lease on the keeper's lock, which no lease
// holds, until the server answers it with anything but an error that says
// "not now" (lease.SaysNotNow), pausing between tries as
// the subscription does; if it was refused "not now" first, every guard
// renews again then. It ends when ctx does. Each try is bounded by
// keeperMaxRetry.
func (k *keeper) probe(ctx context.Context) {
	defer func() {
		k.s.mu.Lock()
		k.probing = false
		k.s.mu.Unlock()
	}()
	pause := backoff{first: keeperFirstRetry, most: keeperMaxRetry}
	for first := true; ; first = false {
		tctx, cancel := context.WithTimeout(ctx, keeperMaxRetry)
		_, err := k.store.Renew(tctx, k.keys, probeValue, time.Second)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil || lease.IsReply(err) && !lease.SaysNotNow(err) {
			if !first {
				k.renewAll()
			}
			return
		}
		if !sleepCtx(ctx, pause.next()) {
			return
		}
	}
}

// renewAll asks every guard the keeper watches to renew now. It runs in
// the subscription's ready callback, so it never blocks (see
// Guard.renewSoon).
//
// Through the client's batcher (batcher.go), the renewals that this asks
// for go out together: each is asked for with no slack left, and the
// renewals already waiting for their batch are sent now too.
func (k *keeper) renewAll() {
	s := k.s
	s.mu.Lock()
	for g := range k.guards {
		g.renewSoon()
	}
	b := s.batcher
	s.mu.Unlock()
	if b != nil {
		b.flushAll()
	}
}
