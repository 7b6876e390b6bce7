package distlock

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// Waiting for a lock, without polling.
//
// Waiters in one process for one lock (same client, same key) stand in a
// local FIFO queue, whatever Mutex they came through. Only the head of the
// queue talks to Redis: it tries, and when the lock is held it sleeps until
// it hears that the holder released it, or until the holder's lease would
// expire (in case it died), whichever comes first. Everyone behind it sleeps
// on a channel. So a release wakes one waiter per process, not all of them.
//
// A guard of this process that releases the lock hands it straight to the
// head, if the head has posted an offer: one script deletes the old value
// and writes the head's, with a new fencing token (at most maxHandoffs times
// in a row). Otherwise the head hears of a release in two ways. A guard of
// this process tells the queue directly. A holder elsewhere publishes its
// value on the lock's release channel, to which the queue subscribes while
// it has waiters (one subscription per queue, see lease.Subscribe). An
// announcement carries the released value, so the head ignores the stale
// ones and wakes only for the release of the holder it saw. If the
// subscription breaks, the queue wakes the head to try again, and until it
// is back the head also re-checks at the polling interval.

// recentReleases is how many past releases a queue remembers, to tell
// whether the one a waiter waits for is among those since it last looked.
const recentReleases = 16

// maxHandoffs is how many times in a row a release hands the lock straight
// to the next waiter of the same process. After that it is released in Redis
// and announced, so that waiters in other processes get their chance.
const maxHandoffs = 8

// queueLinger is how long an empty queue keeps its subscription, so that a
// lock that is taken over and over does not subscribe and unsubscribe at
// every hand-off.
const queueLinger = 250 * time.Millisecond

// Subscription retry back-off.
const (
	minResubscribe = 20 * time.Millisecond
	maxResubscribe = time.Second
)

// queueKey identifies the queue of one lock on one client.
type queueKey struct {
	client any // the rueidis client (or a test store)
	lease  string
}

// The process-wide wait queues, spread over shards so that unrelated locks
// do not contend for one mutex.
var (
	queueShards [64]queueSet
	shardSeed   = maphash.MakeSeed()
)

// queuesFor returns the shard that holds k's queue.
func queuesFor(k queueKey) *queueSet {
	return &queueShards[maphash.String(shardSeed, k.lease)%uint64(len(queueShards))]
}

type queueSet struct {
	mu sync.Mutex
	m  map[queueKey]*waitQueue
	// draining holds, per lock, the end of the subscription of a queue that
	// was closed and is still unsubscribing.
	draining map[queueKey]chan struct{}
}

// handoff is a waiter's offer to take a lock over directly from a local
// guard that releases it. The releasing guard claims it and answers on done.
type handoff struct {
	value string
	ttl   time.Duration
	done  chan handoffResult // capacity 1: the releaser never blocks
	// acked: the waiter waits for replicas (WithReplicaAck). A hand-off
	// does not, so a releaser never claims such an offer; the waiter then
	// acquires on its own after the release.
	acked bool
}

// handoffResult is the outcome of a hand-off.
type handoffResult struct {
	granted bool
	token   int64
	sent    time.Time // when the hand-off was sent: the new lease's start
	err     error
}

// waiter is one acquire call standing in a queue.
type waiter struct {
	turn chan struct{} // closed when the waiter becomes the head
}

// waitQueue is the local queue of one lock. Its fields are guarded by mu,
// except those set at creation.
type waitQueue struct {
	key   queueKey
	set   *queueSet
	store store
	keys  lease.Keys

	mu      sync.Mutex
	waiters []*waiter // FIFO; waiters[0] is the head
	linger  *time.Timer

	// Releases heard of. epoch counts them; changed is closed and replaced
	// at each one; recent holds the released values by epoch. An empty value
	// means "something may have changed" (a gap in the subscription, a local
	// guard that found its lease gone): it concerns every waiter.
	epoch   uint64
	changed chan struct{}
	recent  [recentReleases]string

	// A guard of this process that holds the lock, as far as the queue
	// knows: the value it was granted with, and the epoch at the grant.
	localHolder string
	localEpoch  uint64

	// The head's standing offer to take the lock over from a local guard
	// that releases it (nil when the head is not waiting), and how many
	// hand-offs have happened in a row.
	offer    *handoff
	handoffs int

	// Subscription state.
	ready     chan struct{} // closed at the first outcome of subscribing
	readyDone bool
	notified  bool // the subscription is up: announcements arrive
	everReady bool
	cancelSub context.CancelFunc
	subDone   chan struct{} // closed when the subscription goroutine exits
}

// join puts a new waiter at the end of m's queue, creating the queue (and
// starting its subscription) if needed.
func (s *queueSet) join(m *Mutex) (*waitQueue, *waiter) {
	k := m.queueKey()
	w := &waiter{turn: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[queueKey]*waitQueue)
		s.draining = make(map[queueKey]chan struct{})
	}
	q := s.m[k]
	if q == nil {
		q = &waitQueue{
			key:     k,
			set:     s,
			store:   m.store,
			keys:    m.keys,
			changed: make(chan struct{}),
			ready:   make(chan struct{}),
			subDone: make(chan struct{}),
		}
		s.m[k] = q
		ctx, cancel := context.WithCancel(context.Background())
		q.cancelSub = cancel
		go q.subscribe(ctx, s.draining[k])
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.linger != nil {
		q.linger.Stop()
		q.linger = nil
	}
	q.waiters = append(q.waiters, w)
	if len(q.waiters) == 1 {
		close(w.turn)
	}
	return q, w
}

// lookup returns the queue of k, if there is one.
func (s *queueSet) lookup(k queueKey) *waitQueue {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[k]
}

// busy reports whether k's queue has waiters, in which case a newcomer
// stands in line instead of trying first.
func (s *queueSet) busy(k queueKey) bool {
	q := s.lookup(k)
	if q == nil {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiters) > 0
}

// claim takes the head's hand-off offer for a guard of this process that is
// about to release the lock, unless hand-offs have used up their turn (then
// the lock is released in Redis for everyone).
func (s *queueSet) claim(k queueKey) *handoff {
	q := s.lookup(k)
	if q == nil {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	h := q.offer
	if h == nil || h.acked || q.handoffs >= maxHandoffs {
		q.handoffs = 0
		return nil
	}
	q.offer = nil
	q.handoffs++
	// The local holder the queue knew is handing the lock over, and a
	// hand-off is not announced: forget it, so that if the waiter does not
	// keep the lock, the next head tries at once instead of waiting for a
	// release that will not come.
	q.localHolder = ""
	return h
}

// released is called by a guard of this process when its release is done:
// deleted reports whether the lease held its value until the delete.
func (s *queueSet) released(k queueKey, value string, deleted bool) {
	q := s.lookup(k)
	if q == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.localHolder == value {
		q.localHolder = ""
	}
	if deleted {
		q.bumpLocked(value)
	} else {
		q.bumpLocked("")
	}
}

// leave takes w out of the queue. acquired is the value w's call was
// granted, or empty if it gave up. When w was the head, the next waiter
// becomes the head.
func (q *waitQueue) leave(w *waiter, acquired string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, x := range q.waiters {
		if x != w {
			continue
		}
		q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
		if i == 0 && len(q.waiters) > 0 {
			close(q.waiters[0].turn)
		}
		break
	}
	if acquired != "" {
		q.localHolder, q.localEpoch = acquired, q.epoch
	}
	if len(q.waiters) == 0 && q.linger == nil {
		q.linger = time.AfterFunc(queueLinger, q.close)
	}
}

// close removes an idle queue and ends its subscription. A queue that got
// a waiter again since the timer was set stays.
func (q *waitQueue) close() {
	q.set.mu.Lock()
	defer q.set.mu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiters) > 0 || q.set.m[q.key] != q {
		return
	}
	delete(q.set.m, q.key)
	q.set.draining[q.key] = q.subDone
	q.cancelSub()
}

// observe returns what the head needs before it tries: the current epoch,
// and, if a local guard holds the lock, its value (then trying is pointless
// until that guard releases).
func (q *waitQueue) observe() (epoch uint64, localHolder string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.localHolder != "" {
		return q.localEpoch, q.localHolder
	}
	return q.epoch, ""
}

// since reports whether, after epoch, the queue heard of the release of
// holder (or of something that may concern every waiter). If not, it
// returns the channel that is closed at the next release, and whether
// announcements currently arrive.
func (q *waitQueue) since(epoch uint64, holder string) (bool, <-chan struct{}, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.epoch-epoch >= recentReleases {
		return true, nil, q.notified
	}
	for e := epoch + 1; e <= q.epoch; e++ {
		if v := q.recent[e%recentReleases]; v == "" || v == holder {
			return true, nil, q.notified
		}
	}
	return false, q.changed, q.notified
}

// bumpLocked records a release of value (empty: of anything).
func (q *waitQueue) bumpLocked(value string) {
	q.epoch++
	q.recent[q.epoch%recentReleases] = value
	close(q.changed)
	q.changed = make(chan struct{})
}

// onRelease handles an announcement from the release channel.
func (q *waitQueue) onRelease(value string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.bumpLocked(value)
}

// onReady is called when the server confirms the subscription.
func (q *waitQueue) onReady() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.everReady {
		// Back after a gap: a release may have gone unheard.
		q.bumpLocked("")
	}
	q.everReady, q.notified = true, true
	q.markReadyLocked()
}

// onGap is called when the subscription ended or could not start.
func (q *waitQueue) onGap() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.notified = false
	q.bumpLocked("")
	q.markReadyLocked()
}

func (q *waitQueue) markReadyLocked() {
	if !q.readyDone {
		q.readyDone = true
		close(q.ready)
	}
}

// subscribe keeps the queue subscribed to the lock's release channel until
// ctx is cancelled by close. It waits for the subscription of the queue
// before it (same lock, same client) to end, since ending that one would
// also end this one on the shared connection.
func (q *waitQueue) subscribe(ctx context.Context, prev <-chan struct{}) {
	defer func() {
		q.set.mu.Lock()
		if q.set.draining[q.key] == q.subDone {
			delete(q.set.draining, q.key)
		}
		q.set.mu.Unlock()
		close(q.subDone)
	}()
	if prev != nil {
		select {
		case <-prev:
		case <-ctx.Done():
			return
		}
	}
	backoff := minResubscribe
	for {
		err := q.store.Subscribe(ctx, q.keys, q.onReady, q.onRelease)
		if ctx.Err() != nil {
			return
		}
		q.onGap()
		if errors.Is(err, lease.ErrNoPubSub) {
			return // the head polls instead
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		backoff = min(2*backoff, maxResubscribe)
	}
}

// queue is the default way to wait: stand in the local queue and, at the
// head, try whenever a release is heard of or the holder's lease would end.
func (a *acquirer) queue() (*Guard, error) {
	m := a.m
	// Nobody in line: try straight away, without subscribing. Most locks
	// are free most of the time.
	k := m.queueKey()
	queues := queuesFor(k)
	if !queues.busy(k) {
		g, _, err := a.try()
		if g != nil || err != nil {
			return g, err
		}
	}
	q, w := queues.join(m)
	acquired := ""
	defer func() { q.leave(w, acquired) }()

	if _, err := a.pause(-1, w.turn); err != nil {
		return nil, err
	}
	if _, err := a.pause(-1, q.ready); err != nil {
		return nil, err
	}
	for {
		epoch, holder := q.observe()
		holderTTL := m.ttl
		if holder == "" {
			g, grant, err := a.try()
			if err != nil {
				return nil, err
			}
			if g != nil {
				acquired = a.value
				return g, nil
			}
			holder, holderTTL = grant.Holder, grant.HolderTTL
		}
		h, err := a.waitRelease(q, epoch, holder, holderTTL)
		if err != nil {
			return nil, err
		}
		if h != nil && h.granted {
			a.attempts++ // the hand-off was an attempt made for us
			g, err := a.granted(h.token, h.sent)
			if g != nil {
				acquired = a.value
			}
			if g != nil || err != nil {
				return g, err
			}
		}
	}
}

// waitRelease sleeps until q hears of the release of holder after epoch,
// until holder's lease would have expired (holderTTL, negative for no
// expiry), until it is time to re-check anyway, or until a local guard hands
// the lock over. It returns the hand-off's result if there was one.
func (a *acquirer) waitRelease(q *waitQueue, epoch uint64, holder string, holderTTL time.Duration) (*handoffResult, error) {
	offer := q.post(a.value, a.m.ttl, a.m.ack.Replicas > 0)
	start := time.Now()
	for {
		relevant, changed, notified := q.since(epoch, holder)
		if relevant {
			return q.withdraw(offer), nil
		}
		// With announcements, the holder's expiry is the only event that
		// comes unannounced; without them, poll.
		recheck := noExpiryRecheck
		if holderTTL >= 0 {
			recheck = holderTTL + expiryGrace
		}
		if !notified {
			recheck = min(recheck, DefaultRetryInterval)
		}
		left := recheck - time.Since(start)
		if left <= 0 {
			return q.withdraw(offer), nil
		}
		why, r, err := a.wait(left, changed, offer.done)
		switch {
		case err != nil:
			// Give back a lock that was handed over meanwhile.
			if r := q.withdraw(offer); r != nil && r.granted {
				a.m.cleanup(a.ctx, a.value)
			}
			return nil, err
		case why == wokeByHandoff:
			return &r, nil
		case why == wokeByTimer:
			return q.withdraw(offer), nil
		}
	}
}

// post records the head's offer to take the lock over.
func (q *waitQueue) post(value string, ttl time.Duration, acked bool) *handoff {
	h := &handoff{value: value, ttl: ttl, done: make(chan handoffResult, 1), acked: acked}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.offer = h
	return h
}

// withdraw takes offer back. If a releasing guard claimed it first, it waits
// for that hand-off (which is bounded by the release's deadline) and returns
// its result.
func (q *waitQueue) withdraw(offer *handoff) *handoffResult {
	q.mu.Lock()
	claimed := q.offer != offer
	if !claimed {
		q.offer = nil
	}
	q.mu.Unlock()
	if !claimed {
		return nil
	}
	r := <-offer.done
	return &r
}
