package distlock

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// Renewals in batches: the guards of one client renew through one batcher,
// which sends one script for many leases (lease.Client.RenewBatch).
//
// # A transport, not a window
//
// The batcher changes how a renewal travels, not when it is due or what
// its answer means. Each guard stays its own actor: when its renewal is
// due it asks the batcher, with the guard's own deadline (the lease
// deadline D, as for a renewal sent alone), and goes on with its loop;
// its own answer is written into its ask, and the actor is woken on its
// one-slot wake-up channel; renewed reads the answer exactly as that of
// lease.Client.Renew. No goroutine waits for an answer, and a renewal
// allocates nothing of its own: each actor has one ask, which it fills
// anew for each renewal, and the batcher's call answers every member
// without blocking. An actor whose guard ends drops its ask.
//
// A renewal has slack: a lease renewed a little before it is due is just
// as safe (it is only renewed more often). So the actor wakes
// renewSlack before the renewal is due, and asks with latest = the due
// time. The batcher sends a group's pending renewals when the
// earliest latest among them arrives, or at once when a renewal is asked
// for with latest already past (a retry, the keeper's restart poke),
// taking every renewal of the group pending then, MaxRenewBatch to a
// script. A lone guard's renewal is so sent when it is due, as it was
// without the batcher; many guards' renewals that fall due within the
// slack of each other share a script. Their answers date their leases
// from the batch's send time, so renewing together keeps them together:
// after one batch, its members are due together again. When more
// renewals of a group are due than one script takes, they go earliest
// deadline first: the first script carries the leases that lapse first,
// so a process that falls behind loses, if any, only the guards whose
// deadlines truly pass.
//
// # Deadlines (L1)
//
// Every member's wait ends at its own deadline: a member whose deadline D
// comes before the batch's reply is answered context.DeadlineExceeded at
// D, as a renewal sent alone returns when its context's deadline passes
// (renewed makes the guard Lost for it), and the batch's answer, when it
// comes, is dropped for it. The batcher keeps those deadlines itself, with
// one timer per batch in flight rather than a context and a timer per
// renewal: with 100,000 held locks, a context.WithDeadline per renewal
// was a fifth of the client's CPU. A member that gives up (the guard
// ends) before its batch is sent is taken out of it; one whose deadline
// passes before it is sent is answered and not sent. The batch's own call
// is bounded by the latest deadline among its members: those whose
// deadline is later still want the answer, and those whose deadline is
// earlier have been answered at their own. Splitting batches by deadline would only
// matter if a member's renewal could do harm after its D, and it cannot:
// the script extends a lease only while it holds the member's value, and
// never re-creates one (L4), and the guard, Lost at D, regains only
// through a renewal that it sends and sees confirmed. When every member of
// a batch in flight has given up, the call is cancelled.
//
// # What is batched
//
// Every kind of lease (Mutex, Election, RWMutex in either mode, Semaphore)
// may share a batch: the script renews each as its kind's own script does.
// A guard whose engine waits for replicas (WithReplicaAck) renews alone,
// since each renewal needs its own WAIT; so does one whose store cannot
// batch (the tests' fakes). On a Redis Cluster a batch holds the leases of
// one slot (lease.Client.BatchGroup; lease/batch.go says what batching per
// node would need), on a client that shards by hash tag (go-redis's Ring)
// one lock's; on a standalone server or behind Sentinel, every lease of
// the client.
//
// # Who owns it
//
// A batcher belongs to its client's session (session.go): the session
// starts it at the first renewal of the client's guards that can be
// batched, and stops it when the session stops, which is after the last
// guard of the client has ended and its restart watch has lingered. An
// actor that exits only stops asking. A batcher that stops answers what
// is still pending, and its goroutine ends once its calls in flight
// (cancelled by then) have returned, as background work that Settle waits
// for and the session's stop is acknowledged by.

// batchRenewer is what a store offers to renew in batches
// (*lease.Client does).
type batchRenewer interface {
	RenewBatch(ctx context.Context, items []lease.RenewItem, out []lease.Renewal) error
	BatchGroup(k lease.Keys) string
}

// errBatcherStopped answers a renewal still pending when its batcher
// stops, which happens only when no actor uses it (so no one is there to
// read it): a failed attempt, like any call without a reply.
var errBatcherStopped = errors.New("distlock: renewal batcher stopped")

// batcher sends the renewals of one client's guards in batches; see above.
type batcher struct {
	store batchRenewer

	mu     sync.Mutex
	groups map[string]*askGroup // the groups with renewals pending
	due    groupHeap            // the same groups, the earliest latest first
	armed  time.Time            // when the loop wakes next; zero when it waits for an ask
	flush  bool                 // send every pending renewal now (flushAll)
	closed bool                 // the batcher has stopped

	wake chan struct{} // one slot: something is due before armed
	ctx  context.Context
	stop context.CancelFunc
	// calls counts the batches in flight and their deadline timers' runs
	// (armed or running), which run waits for when the batcher stops.
	calls sync.WaitGroup
}

// askGroup is the pending renewals of one batch group, and the earliest
// latest among them (it does not move later when one of them leaves: the
// group is then sent a little early, within the others' slack).
type askGroup struct {
	id     string
	asks   []*renewAsk
	latest time.Time
	index  int // in the heap
}

// renewAsk is one guard's renewal, pending or in flight. An actor has one,
// which it asks with again for each renewal once it has read the answer
// to the last: a batch in flight that it has left (its deadline passed)
// may still hold it, and answers it only while it is that batch's
// (batch). The fields from latest on are the batcher's, under its mu,
// but ans, which the asker reads once ready says it is there.
type renewAsk struct {
	// Set by the asker before its first ask, and never changed.
	keys  *lease.Keys // the engine's
	value string
	ttl   time.Duration
	group string
	wake  chan struct{} // the asker's one-slot wake-up
	// moved is where a quiet ask's confirmation is published at once, as
	// the lease deadline it sets, in nanoseconds after base (nil: nowhere;
	// see Guard.vouched).
	moved *atomic.Int64
	base  time.Time

	latest   time.Time
	deadline time.Time // the member's lease deadline; zero when it has none
	asked    time.Time // when the member asked, the send time of an answer without a batch
	quiet    bool      // an answer that confirms the lease does not wake the asker

	batch    *renewBatch // the batch it went into, once sent
	gone     bool        // the member stopped waiting
	answered bool        // ans holds its one answer
	ans      renewAnswer
	ready    atomic.Bool // ans is there (set after ans is written)
}

// renewAnswer is the answer to one member: the batch's send time, when
// the answer came, and its outcome or the batch's error.
type renewAnswer struct {
	sent, at time.Time
	r        lease.Renewal
	err      error
}

// renewBatch is one script in flight; live counts the members that still
// wait for it (under batcher.mu).
type renewBatch struct {
	asks   []*renewAsk
	ctx    context.Context
	cancel context.CancelFunc
	live   int
	timer  *time.Timer // at the earliest deadline of a member not answered yet
}

// batcherFor returns the store's batch renewal if the engine's renewals
// may be batched (see "What is batched").
func batcherFor(e *engine) (batchRenewer, bool) {
	if e.ack.Replicas > 0 {
		return nil, false
	}
	br, ok := e.store.(batchRenewer)
	return br, ok
}

// renewSlack is the slack of the engine's renewals of a lease renewed
// every period: renewSlack's when they are batched, none when they go
// alone (nothing to wait for).
func (e *engine) renewSlack(period time.Duration) time.Duration {
	if _, ok := batcherFor(e); !ok {
		return 0
	}
	return renewSlack(period)
}

// newBatcher returns a batcher that sends its renewals through store; its
// session runs its loop (run) and stops it.
func newBatcher(store batchRenewer) *batcher {
	ctx, stop := context.WithCancel(context.Background())
	return &batcher{store: store, groups: make(map[string]*askGroup),
		wake: make(chan struct{}, 1), ctx: ctx, stop: stop}
}

// newAsk returns the ask of a member that renews value's lease of keys
// for ttl, and is woken on wake (one slot) when an answer is there.
func (b *batcher) newAsk(keys *lease.Keys, value string, ttl time.Duration, wake chan struct{}) renewAsk {
	return renewAsk{keys: keys, value: value, ttl: ttl, group: b.store.BatchGroup(*keys), wake: wake}
}

// ask asks for one renewal of a's lease, to be sent by latest. It never
// blocks. a must have no ask pending (its last answer read, or none
// asked). The one answer is written into a, unless the asker drops the
// ask first, and the asker is woken, unless quiet is set and the answer
// confirms the lease in time (the asker then reads it when it next wakes
// on its own; louden takes quiet back): the deadline it sets is then
// published in moved at once. The answer carries the batch's send
// time, from which the lease is dated when confirmed; at the member's
// deadline dl (zero: none) it is context.DeadlineExceeded with asked as
// the send time (for the latency), as a renewal sent alone returns when
// its context's deadline passes.
func (b *batcher) ask(a *renewAsk, dl, latest, asked time.Time, quiet bool) {
	a.ready.Store(false)
	b.mu.Lock()
	a.latest, a.deadline, a.asked, a.quiet = latest, dl, asked, quiet
	a.batch, a.gone, a.answered = nil, false, false
	if !dl.IsZero() && !asked.Before(dl) {
		a.expire(asked)
		b.mu.Unlock()
		return
	}
	if !dl.IsZero() && dl.Before(latest) {
		// Sent by its deadline at the latest, where take answers it
		// instead: a pending member also learns its deadline on time.
		a.latest = dl
	}
	wake := b.add(a)
	b.mu.Unlock()
	if wake {
		b.poke()
	}
}

// answer gives a its one answer, unless it has one, and wakes the asker
// (but for a quiet ask's confirmation); the caller holds b.mu. The
// wake-up slot holds one, so this never blocks.
func (a *renewAsk) answer(ans renewAnswer) {
	if !a.answered {
		a.answered = true
		a.ans = ans
		a.ready.Store(true)
		if a.quiet && ans.err == nil && ans.r.OK && (a.deadline.IsZero() || ans.at.Before(a.deadline)) {
			if dl := leaseDeadline(ans.sent, a.ttl); ans.at.Before(dl) {
				if a.moved != nil {
					a.moved.Store(int64(dl.Sub(a.base)))
				}
				return
			}
		}
		// A failure, or a confirmation too late to count, or one that
		// came after the member's deadline (its State has said Lost
		// since: only the asker may make it Acquired again, as a regain
		// it publishes): the asker acts on it now.
		select {
		case a.wake <- struct{}{}:
		default: // woken already
		}
	}
}

// louden has a's answer wake the asker when it comes, confirmation or
// not, and reports whether it is there already (the asker, which reads
// it now, is not woken for it).
func (b *batcher) louden(a *renewAsk) (answered bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	a.quiet = false
	return a.answered
}

// expire answers, at now, a member whose deadline passed first; the
// caller holds b.mu. (Out of line: the frame of ask, which the actor's
// renewals run on, stays small.)
//
//go:noinline
func (a *renewAsk) expire(now time.Time) {
	a.answer(renewAnswer{sent: a.asked, at: now, err: context.DeadlineExceeded})
}

// add puts a in its group, and reports whether the loop must be woken
// (a is due before it would wake); the caller holds b.mu.
func (b *batcher) add(a *renewAsk) (wake bool) {
	if b.closed {
		a.answer(renewAnswer{sent: a.asked, at: a.asked, err: errBatcherStopped})
		return false
	}
	g := b.groups[a.group]
	switch {
	case g == nil:
		g = &askGroup{id: a.group, latest: a.latest}
		b.groups[a.group] = g
		b.due.push(g)
	case a.latest.Before(g.latest):
		g.latest = a.latest
		b.due.up(g.index)
	}
	g.asks = append(g.asks, a)
	wake = b.armed.IsZero() || a.latest.Before(b.armed)
	if wake {
		b.armed = a.latest
	}
	return wake
}

// poke wakes the loop without blocking.
func (b *batcher) poke() {
	select {
	case b.wake <- struct{}{}:
	default: // woken already
	}
}

// drop records that a's member stopped waiting: a pending renewal is left
// out of its batch, and a batch in flight that nobody waits for any more is
// cancelled.
func (b *batcher) drop(a *renewAsk) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if a.gone || a.answered {
		return
	}
	a.gone = true
	if bt := a.batch; bt != nil {
		bt.left()
	}
}

// left counts a member out of bt, and cancels bt's call when nobody waits
// for it any more; the caller holds b.mu.
func (bt *renewBatch) left() {
	if bt.live--; bt.live == 0 {
		bt.cancel()
	}
}

// flushAll has every pending renewal sent now: the keeper's restart poke,
// after which every guard should learn at once whether the server still
// holds its lease.
func (b *batcher) flushAll() {
	b.mu.Lock()
	b.flush = true
	b.mu.Unlock()
	b.poke()
}

// run is the batcher's goroutine: it sends each group when its earliest
// latest arrives, until the batcher stops; then it answers whatever is
// still pending and waits for its calls in flight.
func (b *batcher) run() {
	t := newStoppedTimer()
	defer t.Stop()
	for {
		for _, bt := range b.take(time.Now()) {
			b.calls.Go(func() { b.send(bt) })
		}
		b.mu.Lock()
		next := b.armed
		b.mu.Unlock()
		if !next.IsZero() {
			t.Reset(time.Until(next))
		}
		select {
		case <-b.wake:
			// An ask already due: let the other goroutines that are ready
			// to ask (a retry after a failed batch, the keeper's poke of
			// every guard) join it, without waiting on a clock.
			runtime.Gosched()
		case <-t.C:
		case <-b.ctx.Done():
			b.mu.Lock()
			now := time.Now()
			for _, g := range b.groups {
				for _, a := range g.asks {
					a.answer(renewAnswer{sent: a.asked, at: now, err: errBatcherStopped})
				}
			}
			b.groups, b.due, b.closed = nil, nil, true
			b.mu.Unlock()
			b.calls.Wait()
			return
		}
		t.Stop()
	}
}

// take returns the batches to send at now: every group whose earliest
// latest has come (every group when flushing), MaxRenewBatch renewals to a
// batch, leaving out the members that stopped waiting and answering those
// whose deadline has passed; and arms the loop for the next group's.
func (b *batcher) take(now time.Time) []*renewBatch {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*renewBatch
	for len(b.due) > 0 && (b.flush || !b.due[0].latest.After(now)) {
		g := b.due.pop()
		delete(b.groups, g.id)
		asks := g.asks[:0]
		for _, a := range g.asks {
			switch {
			case a.gone:
			case !a.deadline.IsZero() && !now.Before(a.deadline):
				a.expire(now)
			default:
				asks = append(asks, a)
			}
		}
		// Earliest deadline first: when more are due than one script
		// takes, the first script (and its call, started first) carries
		// the leases that lapse first.
		slices.SortFunc(asks, byDeadline)
		for len(asks) > 0 {
			n := min(len(asks), lease.MaxRenewBatch)
			out = append(out, b.newBatch(asks[:n:n]))
			asks = asks[n:]
		}
	}
	b.flush = false
	b.armed = time.Time{}
	if len(b.due) > 0 {
		b.armed = b.due[0].latest
	}
	return out
}

// byDeadline orders asks by their deadline, those without one last.
func byDeadline(a, b *renewAsk) int {
	switch {
	case a.deadline.Equal(b.deadline):
		return 0
	case a.deadline.IsZero():
		return 1
	case b.deadline.IsZero():
		return -1
	}
	return a.deadline.Compare(b.deadline)
}

// newBatch makes a batch of asks, whose call ends at the latest of their
// deadlines (see "Deadlines"), or when the batcher stops.
func (b *batcher) newBatch(asks []*renewAsk) *renewBatch {
	var dl time.Time
	for _, a := range asks {
		if a.deadline.IsZero() {
			dl = time.Time{}
			break
		}
		if a.deadline.After(dl) {
			dl = a.deadline
		}
	}
	bt := &renewBatch{asks: asks, live: len(asks)}
	if dl.IsZero() {
		bt.ctx, bt.cancel = context.WithCancel(b.ctx)
	} else {
		bt.ctx, bt.cancel = context.WithDeadline(b.ctx, dl)
	}
	for _, a := range asks {
		a.batch = bt
	}
	return bt
}

// send makes one batch's call and answers each member that has no answer
// yet; until the reply, a timer answers each member at its deadline.
func (b *batcher) send(bt *renewBatch) {
	defer bt.cancel()
	buf := batchBufs.Get().(*batchBuf)
	defer batchBufs.Put(buf)
	items, out := buf.items[:0], buf.out[:0]
	for _, a := range bt.asks {
		items = append(items, lease.RenewItem{Keys: *a.keys, Value: a.value, TTL: a.ttl})
	}
	if cap(out) < len(items) {
		out = make([]lease.Renewal, len(items))
	}
	out = out[:len(items)]
	defer func() {
		// Kept for the next batch, without the strings they refer to.
		clear(items)
		clear(out)
		buf.items, buf.out = items[:0], out[:0]
	}()
	sent := time.Now()
	b.mu.Lock()
	b.armExpiry(bt, sent)
	b.mu.Unlock()
	err := b.store.RenewBatch(bt.ctx, items, out)
	at := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if bt.timer != nil && bt.timer.Stop() {
		b.calls.Done() // the run it was armed for will not come
	}
	for i, a := range bt.asks {
		if a.batch != bt {
			continue // it left this batch and asked again
		}
		if err != nil {
			a.answer(renewAnswer{sent: sent, at: at, err: err})
			continue
		}
		a.answer(renewAnswer{sent: sent, at: at, r: out[i]})
	}
}

// armExpiry answers the members of bt whose deadline has come by now, and
// arms bt's timer for the earliest deadline of the others, the call's own
// included (a client may let the call run past it). It is
// called by send, before the call, and by the timer. Each arming counts in
// b.calls until its run ends or send stops it. The caller holds b.mu.
func (b *batcher) armExpiry(bt *renewBatch, now time.Time) {
	var next time.Time
	for _, a := range bt.asks {
		switch {
		case a.batch != bt || a.answered || a.gone || a.deadline.IsZero():
		case !now.Before(a.deadline):
			a.expire(now)
			bt.left()
		case next.IsZero() || a.deadline.Before(next):
			// Those whose deadline is the call's too: not every client
			// ends a call at its context's deadline (go-redis waits out
			// its ReadTimeout), and a member's wait ends at its own.
			next = a.deadline
		}
	}
	if next.IsZero() {
		return
	}
	b.calls.Add(1)
	if bt.timer == nil {
		bt.timer = time.AfterFunc(next.Sub(now), func() {
			defer b.calls.Done()
			b.mu.Lock()
			defer b.mu.Unlock()
			b.armExpiry(bt, time.Now())
		})
		return
	}
	bt.timer.Reset(next.Sub(now)) // from its own run: it is not armed
}

// batchBuf is the arguments and results of one batch's call, kept for the
// next batch (a batch is MaxRenewBatch renewals at most).
type batchBuf struct {
	items []lease.RenewItem
	out   []lease.Renewal
}

var batchBufs = sync.Pool{New: func() any { return new(batchBuf) }}

// groupHeap orders the groups with pending renewals by their earliest
// latest: a binary heap, typed (container/heap's interface calls cost an
// asker's renewal stack depth as well as time).
type groupHeap []*askGroup

func (h groupHeap) less(i, j int) bool { return h[i].latest.Before(h[j].latest) }

func (h groupHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

// push adds g.
func (h *groupHeap) push(g *askGroup) {
	g.index = len(*h)
	*h = append(*h, g)
	h.up(g.index)
}

// up moves the group at j up to its place, after its latest moved earlier.
func (h groupHeap) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(j, i) {
			return
		}
		h.swap(i, j)
		j = i
	}
}

// pop removes and returns the group with the earliest latest.
func (h *groupHeap) pop() *askGroup {
	old := *h
	n := len(old) - 1
	old.swap(0, n)
	g := old[n]
	old[n] = nil
	*h = old[:n]
	h.down(0)
	return g
}

// down moves the group at i down to its place.
func (h groupHeap) down(i int) {
	n := len(h)
	for {
		j := 2*i + 1
		if j >= n {
			return
		}
		if r := j + 1; r < n && h.less(r, j) {
			j = r
		}
		if !h.less(j, i) {
			return
		}
		h.swap(i, j)
		i = j
	}
}
