package distlock

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// Waiting: the wait loop of Lock, and the waiting rooms it sleeps in.
//
// Waiters stand in one line per lock, in Redis (see the lease package for
// the protocol): a release passes the lock to the first live waiter and
// announces the grant on the channel of that waiter's room. A room is this
// process's side of one lock's line, for one client: the waiters of this
// process that stand in the line, and one subscription to the room's
// channel, shared by all of them. A grant wakes exactly the waiter it names,
// whether it comes from the announcement or, when a guard of this process
// made the release, straight from the release's reply.
//
// What a room keeps in memory is only a directory: which waiter to wake for
// which value, and whether announcements currently arrive. It never decides
// who holds the lock or who is next; Redis does. A waiter that misses a
// wake-up (the subscription broke, or was not up yet) finds its grant at its
// next call to Redis, which it makes at least every half claim window and
// at once when the subscription comes up.
//
// A room lives while a Lock call waits in it, and lingers for roomLinger
// after that with its subscription, so that a lock taken over and over does
// not subscribe at every turn. The rooms of one client belong to its
// session (session.go), which owns the linger and the subscriptions'
// goroutines.

// queue is the default way to wait: stand in the lock's line in Redis and
// sleep until the lease is passed to us.
//
// Each call to Redis (AcquireOrQueue) acquires the lock if it is free and
// nobody is ahead, and otherwise puts us in line or refreshes our place. In
// between, the waiter sleeps in its room until the room wakes it with a
// grant, until it is time to refresh its place (every half claim window; at
// the polling interval while announcements do not arrive), or, when it is
// first in line, until the holder's lease would end, in case the holder
// died.
//
// The first call is made before the waiter enters a room, unless a room of
// this process waits for the lock already (then a grant may come at once,
// and the waiter joins first so that it cannot miss it): an uncontended
// Lock never touches the rooms. A waiter that joins a room only after its
// first call asks again at once, unless the room is new and will make it
// ask once its subscription is up; either way a grant that reached the room
// before the waiter did is not missed.
//
// A grant passes the lease to us for the claim window, counted from the
// release that made it. We did not send that release, so the lease deadline
// counts from the send time of a call known to precede the grant: our last
// call that found us in line (if the grant's token is above the last token
// that call saw, the grant came after it), or the release itself when a
// guard of this process made it. While the lease deadline counted from
// there leaves at least a third of the window, the guard starts at once,
// and renews the lease to the full TTL a third of the window in (at once,
// if that is past) when it is held that long. Otherwise (a late wake-up,
// or WithReplicaAck, which must see an acknowledged write first) we claim
// it by calling AcquireOrQueue again: the lease holds our value, so Redis
// grants it to us for the full TTL (a lock keeps the grant's token).
func (a *acquirer) queue() (*Guard, error) {
	e := a.e
	line := standing{place: lease.Place{Claim: e.claim, Room: proc.roomID}}
	var (
		r       *room
		failing bool // the last call failed without a reply
		pause   = backoff{first: DefaultRetryInterval, most: 16 * DefaultRetryInterval}
		askNow  bool // ask again at once: a grant may have gone unheard
	)
	defer func() {
		if r != nil {
			r.leave(a.waiter)
		}
	}()
	enter := func(create bool) {
		var fresh bool
		if r, fresh = proc.enterRoom(e, create); r != nil {
			a.waiter = r.join(a.value)
			askNow = !line.queued.IsZero() && !fresh
		}
	}
	enter(false)

	// use acts on a grant: it returns the guard, or an error that ends the
	// call, or neither when the grant must be claimed (claim) or is an
	// announcement older than our last call (neither claim nor a result).
	use := func(note grantNote) (g *Guard, err error, claim bool) {
		from := line.passed(note)
		if from.IsZero() {
			return nil, nil, false
		}
		if e.holdsPass(from) {
			if g, err := a.granted(note.token, from, e.claim); g != nil || err != nil {
				return g, err, false
			}
		}
		return nil, nil, true
	}
	for {
		sent := time.Now()
		g, grant, retry, err := a.attempt(&line.place)
		if errors.Is(err, errNoted) {
			// Passed the lock while asking (a refresh may be stuck on a
			// dead connection): act on the grant now.
			note := *a.noted
			a.noted = nil
			if g, err, _ := use(note); g != nil || err != nil {
				return g, err
			}
			continue // claim it, or ask again after an old announcement
		}
		switch {
		case g != nil:
			return g, nil
		case err != nil && !retry, err != nil && line.queued.IsZero() && !errors.Is(err, ErrNoReply):
			// An error Redis answered with ends the call, as does a failure
			// before we stand in line, other than a call that got no reply
			// in time: that one may well have put us in line, and a Lock
			// that may wait asks again.
			return nil, err
		case err != nil:
			// We stand in line already: keep the place and ask again soon.
			failing = true
			if e.debug() {
				e.logger().Debug("distlock: asking for the lock failed; trying again", "err", err)
			}
		case line.stale(grant):
			// Refused as stale: stand in line again at once (see stale).
			failing = false
			a.dirty = true
			continue
		default:
			failing = false
			pause.reset()
			a.dirty = true
			line.queuedBy(sent, grant)
		}
		if r == nil {
			enter(true)
			if askNow {
				askNow = false
				continue
			}
		}

		wait := nextAsk(e.claim, r.listen(), grant, !failing)
		if failing {
			wait = min(wait, pause.next())
		}
		until := sent.Add(wait)
		for {
			why, note, err := a.wait(max(time.Until(until), 0), a.waiter)
			if err != nil {
				return nil, err
			}
			if why != wokeByGrant {
				break
			}
			g, err, claim := use(note)
			if g != nil || err != nil {
				return g, err
			}
			if claim {
				break
			}
			// An announcement of a grant older than our last call.
		}
	}
}

// The line's rules. A request that waits in a lock's line (a Lock's queue,
// and a MultiMutex's in the line of the name it waits for) follows them
// through these functions, so that both date a grant, decide when to ask
// again and treat a stale refusal in the same way.

// standing is what a waiting request knows of its place in one lock's
// line: what its next call brings (place), and the send time of its last
// call that left it in line (queued), with the last token issued when that
// call ran (queuedFence).
type standing struct {
	place       lease.Place
	queued      time.Time
	queuedFence int64
}

// queuedBy records the reply g to a call sent at sent that left the
// request in line: the call's send time and fence date a grant that comes
// after it, its ticket keeps the place (a reply without one keeps the
// ticket the request has), and its fence is a token the request has seen.
func (s *standing) queuedBy(sent time.Time, g lease.Grant) {
	s.queued, s.queuedFence = sent, g.Fence
	if g.Ticket > 0 {
		s.place.Ticket = g.Ticket
	}
	s.place.Seen = max(s.place.Seen, g.Fence)
}

// stale reports whether g refuses the request's call as stale
// ([lease.Place]'s Seen; issue 31): the request neither holds the lock nor
// stands in line, and a token above the largest it has seen was issued
// meanwhile. Its place lapsed while other grants were made; nothing was
// passed to it, since it was not in line. It then records the reply's
// token as seen, and the request calls again at once, with its ticket,
// which stands it in line again. Each refusal needs another grant since
// the last one, so a request cannot spin on them.
func (s *standing) stale(g lease.Grant) bool {
	if g.Rank >= 0 || g.Fence <= s.place.Seen {
		return false
	}
	s.place.Seen = g.Fence
	return true
}

// moved forgets what the request learnt in the line it stood in, but its
// ticket: a MultiMutex's request moves on to the line of another name,
// whose tokens are its own. (Its ticket is its place in every line.)
func (s *standing) moved() {
	*s = standing{place: lease.Place{Claim: s.place.Claim, Room: s.place.Room, Ticket: s.place.Ticket}}
}

// passed records a grant passed to the request (its token is one seen)
// and returns when its lease counts from, or the zero Time for an
// announcement older than the request's last call, which it must not act
// on. A grant passes the lease for the claim window, counted from the
// release that made it. The request did not send that release, so the
// lease counts from the send time of a call known to precede the grant:
// its last call that found it in line, when the grant's token is above
// the last token that call saw (the grant came after it), or the release
// itself when a guard of this process made it (note.sent).
func (s *standing) passed(note grantNote) time.Time {
	s.place.Seen = max(s.place.Seen, note.token)
	from := note.sent
	if note.token > s.queuedFence && s.queued.After(from) {
		from = s.queued
	}
	return from
}

// holdsPass reports whether a waiter of e holds a lease passed to it,
// counted from from, at once: when it needs no acknowledged write first
// (WithReplicaAck) and the lease leaves a third of its claim window (see
// usableGrant). Otherwise the waiter claims it by calling again: the
// lease holds its value, so Redis grants it the full TTL.
func (e *engine) holdsPass(from time.Time) bool {
	return e.ack.Replicas == 0 && usableGrant(leaseDeadline(from, e.claim), e.claim)
}

// nextAsk returns how long after a call a waiter in line calls again at
// the latest: before its place lapses (half the claim window), at the
// polling interval while its room hears no announcements (listening
// false), and, when the reply g (replied: the call had one) put it first
// in line, just after the holder's lease would end, in case the holder
// died.
func nextAsk(claim time.Duration, listening bool, g lease.Grant, replied bool) time.Duration {
	wait := refreshAfter(claim)
	if !listening {
		wait = min(wait, DefaultRetryInterval)
	}
	if replied && g.Rank == 0 && g.HolderTTL >= 0 {
		wait = min(wait, g.HolderTTL+expiryGrace)
	}
	return wait
}

// wakeReason says what ended a wait.
type wakeReason int

const (
	wokeByTimer wakeReason = iota
	wokeByPoke
	wokeByGrant
)

// wait waits for d to pass (d < 0: no timer), for a poke or a grant to w (w
// may be nil), for the wait limit or for ctx. It returns an error when the
// limit has passed or ctx is done, which ends the call. With d <= 0 it
// only checks the limit, ctx, and a grant already there.
func (a *acquirer) wait(d time.Duration, w *waiter) (wakeReason, grantNote, error) {
	if !a.limit.IsZero() {
		left := time.Until(a.limit)
		if left <= 0 {
			return wokeByTimer, grantNote{}, &TimeoutError{Key: a.e.keys.Lease, Waited: time.Since(a.start), Attempts: a.attempts}
		}
		if d < 0 || d > left {
			d = left
		}
	}
	var grant <-chan grantNote
	var poke <-chan struct{}
	if w != nil {
		grant, poke = w.grant, w.poke
	}
	var timerC <-chan time.Time
	switch {
	case d == 0:
		select {
		case n := <-grant:
			return wokeByGrant, n, nil
		default:
		}
		if a.ctx.Err() != nil {
			return wokeByTimer, grantNote{}, a.e.ctxError(a.ctx)
		}
		return wokeByTimer, grantNote{}, nil
	case d > 0:
		if a.timer == nil {
			a.timer = time.NewTimer(d)
		} else {
			a.timer.Reset(d)
		}
		timerC = a.timer.C
	}
	select {
	case n := <-grant:
		return wokeByGrant, n, nil
	case <-poke:
		return wokeByPoke, grantNote{}, nil
	case <-timerC:
		return wokeByTimer, grantNote{}, nil
	case <-a.ctx.Done():
		return wokeByTimer, grantNote{}, a.e.ctxError(a.ctx)
	}
}

// roomLinger is how long an idle room keeps its subscription.
const roomLinger = 250 * time.Millisecond

// room is one lock's waiting room for one client in this process, a part
// of the client's session (session.go). Its fields are guarded by mu,
// except those set at creation and those guarded by the session's mu.
type room struct {
	s     *session
	store store
	keys  lease.Keys

	// Under s.mu: the Lock calls waiting in it, and since when nobody
	// has (the session's linger closes it roomLinger after that).
	refs      int
	idleSince time.Time

	mu      sync.Mutex
	waiters map[string]*waiter // by value

	// The subscription. up reports whether announcements arrive; noPubSub
	// that the server refused pub/sub, and the waiters poll.
	listening bool
	up        bool
	noPubSub  bool
	cancelSub context.CancelFunc
	subDone   chan struct{} // closed when the subscription goroutine exits
}

// waiter is one Lock call standing in line.
type waiter struct {
	value string
	// grant receives the grants made to value. The room sends without
	// blocking: one buffered grant is all a waiter acts on.
	grant chan grantNote
	// poke asks the waiter to call Redis now (the subscription came back or
	// broke, so grants may have gone unheard). Sent without blocking.
	poke chan struct{}
}

// grantNote tells a waiter that the lease was passed to it.
type grantNote struct {
	token int64
	// sent is the send time of the release that passed the lease, when this
	// process made it (then the note comes from its reply), and zero for an
	// announcement.
	sent time.Time
}

// enterRoom returns e's room and counts the caller in; the caller must
// join it and leave it when done. When there is no room, it creates one if
// create is set (fresh reports that it did), in the session of e's client
// (made if need be), and returns nil otherwise.
func (p *process) enterRoom(e *engine, create bool) (r *room, fresh bool) {
	s := p.sessions.lock(e, create)
	if s == nil {
		return nil, false
	}
	defer s.mu.Unlock()
	r = s.rooms[e.keys.Lease]
	if r == nil {
		if !create {
			return nil, false
		}
		r = &room{s: s, store: e.store, keys: e.keys, waiters: make(map[string]*waiter)}
		s.rooms[e.keys.Lease] = r
		fresh = true
	}
	r.refs++
	return r, fresh
}

// lookupRoom returns e's room, if there is one.
func (p *process) lookupRoom(e *engine) *room {
	s := p.sessions.lock(e, false)
	if s == nil {
		return nil
	}
	defer s.mu.Unlock()
	return s.rooms[e.keys.Lease]
}

// leave removes w and counts its caller out of the room, in one step. The
// last one out leaves the room idle: it goes at once if it has no
// subscription, and lingers for roomLinger with it otherwise (see
// session.go). It never waits.
func (r *room) leave(w *waiter) {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	r.mu.Lock()
	if r.waiters[w.value] == w {
		delete(r.waiters, w.value)
	}
	listening := r.listening
	r.mu.Unlock()
	if r.refs--; r.refs > 0 {
		return
	}
	r.idleSince = time.Now()
	if listening {
		s.idle()
		return
	}
	s.dropRoom(r)
	s.leftIdle()
}

// endSubscription ends the subscription of a room that has left its
// session, if it has one, and waits for its goroutine to end (it
// unsubscribes, bounded by lease's unsubscribe timeout).
func (r *room) endSubscription() {
	r.mu.Lock()
	cancel, done := r.cancelSub, r.subDone
	r.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// join adds a waiter for value.
func (r *room) join(value string) *waiter {
	w := &waiter{value: value, grant: make(chan grantNote, 1), poke: make(chan struct{}, 1)}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waiters[value] = w
	return w
}

// listen starts the room's subscription, unless it runs already or the
// server refused pub/sub. It reports whether announcements arrive now. The
// caller is in the room.
func (r *room) listen() bool {
	r.mu.Lock()
	start, up := !r.listening && !r.noPubSub, r.up
	r.mu.Unlock()
	if start {
		r.startSubscription()
	}
	return up
}

// startSubscription starts the room's subscription as a goroutine of its
// session, unless it runs already or the server refused pub/sub.
func (r *room) startSubscription() {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.listening || r.noPubSub {
		return
	}
	r.listening = true
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	r.cancelSub, r.subDone = cancel, done
	s.spawn(func() { r.subscribe(ctx, done) })
}

// granted wakes the waiter for value, if it is in the room, and reports
// whether it did.
func (r *room) granted(value string, n grantNote) bool {
	r.mu.Lock()
	w := r.waiters[value]
	r.mu.Unlock()
	if w == nil {
		return false
	}
	select {
	case w.grant <- n:
		return true
	default:
		return false
	}
}

// pokeAll asks every waiter to call Redis now.
func (r *room) pokeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.waiters {
		select {
		case w.poke <- struct{}{}:
		default:
		}
	}
}

// setUp records whether announcements arrive, and pokes the waiters when
// that changes: on the way up, a grant may have been announced before the
// subscription took; on the way down, they must poll.
func (r *room) setUp(up bool) {
	r.mu.Lock()
	changed := r.up != up
	r.up = up
	r.mu.Unlock()
	if changed {
		r.pokeAll()
	}
}

// subscribe keeps the room subscribed to its wake channel, and closes done
// when it stops: when ctx is cancelled (the room has left its session),
// when the server refuses pub/sub, or when the subscription ends while no
// Lock call waits in the room. A room nobody waits in only keeps a
// subscription that is up (its linger); it never sets one up again, so it
// sends nothing on a client that its owner may have closed meanwhile, and
// it leaves its session then, without waiting out its linger: a closed
// client ends its subscriptions, and its session goes with them. A Lock
// call that enters the room later starts a new one (see listen).
func (r *room) subscribe(ctx context.Context, done chan struct{}) {
	defer close(done)
	resubscribe(ctx, &backoff{first: minResubscribe, most: maxResubscribe}, func() error {
		return r.store.Subscribe(ctx, r.keys, proc.roomID, func() { r.setUp(true) }, func(value string, token int64) {
			r.granted(value, grantNote{token: token})
		})
	}, r.down)
}

// down is the room's subscription's answer to its end (see resubscribe):
// the waiters are told to poll, and it subscribes again while a Lock call
// waits in the room and the server allows pub/sub.
func (r *room) down(noPubSub bool) (again bool) {
	r.setUp(false)
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	idle := r.refs == 0
	r.mu.Lock()
	if noPubSub || idle {
		r.listening = false
	}
	if noPubSub {
		r.noPubSub = true // the waiters poll
	}
	r.mu.Unlock()
	if !noPubSub && !idle {
		return true
	}
	if idle && s.rooms[r.keys.Lease] == r {
		s.dropRoom(r)
		s.leftIdle()
	}
	return false
}

// resubscribe runs subscribe until ctx ends. Each time it returns for
// another reason, resubscribe calls down, with whether the server refused
// pub/sub, and stops unless down says to go on; then it subscribes again
// after the next of pause's pauses (the rooms' and an election's grow from
// minResubscribe up to maxResubscribe; see backoff).
func resubscribe(ctx context.Context, pause *backoff, subscribe func() error, down func(noPubSub bool) (again bool)) {
	for {
		err := subscribe()
		if ctx.Err() != nil {
			return
		}
		if !down(errors.Is(err, lease.ErrNoPubSub)) || !sleepCtx(ctx, pause.next()) {
			return
		}
	}
}

// sleepCtx waits for d to pass, and reports false if ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// deliverPasses tells the waiters of this process that a release sent at
// sent passed the lease (or a semaphore's permits) to, if there are any:
// they wake at once instead of waiting for the announcement.
//
// Having woken one, it yields the processor (runtime.Gosched), as
// sync.Mutex's Unlock does when it hands the mutex to a starving waiter:
// the woken waiter runs next on this processor, rather than after the
// caller has finished its release and parked, or after another processor
// has stolen it (which the runtime does only after a pause), and the
// caller goes on as soon as a processor is free.
func deliverPasses(e *engine, r lease.Release, sent time.Time) {
	ours := r.Passed.Room == proc.roomID
	for _, p := range r.More {
		ours = ours || p.Room == proc.roomID
	}
	if r.Passed.Value == "" || !ours {
		return // (a pass to another process's waiter: nothing to look up)
	}
	room := proc.lookupRoom(e)
	if room == nil {
		return
	}
	woke := false
	if r.Passed.Room == proc.roomID {
		woke = room.granted(r.Passed.Value, grantNote{token: r.Passed.Token, sent: sent})
	}
	for _, p := range r.More {
		if p.Room == proc.roomID {
			woke = room.granted(p.Value, grantNote{token: p.Token, sent: sent}) || woke
		}
	}
	if woke {
		runtime.Gosched()
	}
}
