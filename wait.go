package distlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// Waiting rooms.
//
// Waiters stand in one line per lock, in Redis (see the lease package for
// the protocol): a release passes the lock to the first live waiter and
// announces the grant on the channel of that waiter's room. A room is this
// process's side of one lock's line, for one client: the waiters of this
// process that stand in the line, and one subscription to the room's own
// channel, shared by all of them. A grant wakes exactly the waiter it names,
// whether it comes from the announcement or, when a guard of this process
// made the release, straight from the release's reply.
//
// What the room keeps in memory is only a directory: which waiter to wake
// for which value, and whether announcements currently arrive. It never
// decides who holds the lock or who is next; Redis does. A waiter that
// misses a wake-up (the subscription broke, or was not up yet) finds its
// grant at its next call to Redis, which it makes at least every half claim
// window and at once when the subscription comes back.
//
// A room lives while a Lock call waits in it or a clean-up runs for its
// lock, and lingers for roomLinger after that with its subscription, so
// that a lock taken over and over does not subscribe at every turn.

// roomLinger is how long an idle room keeps its subscription.
const roomLinger = 250 * time.Millisecond

// Subscription retry back-off.
const (
	minResubscribe = 20 * time.Millisecond
	maxResubscribe = time.Second
)

// queueKey identifies the room of one lock on one client.
type queueKey struct {
	client any // the rueidis client (or a test store)
	lease  string
}

// The process's rooms, spread over shards so that unrelated locks do not
// contend for one mutex.
var (
	roomShards [64]roomSet
	shardSeed  = maphash.MakeSeed()
)

// roomsFor returns the shard that holds k's room.
func roomsFor(k queueKey) *roomSet {
	return &roomShards[maphash.String(shardSeed, k.lease)%uint64(len(roomShards))]
}

type roomSet struct {
	mu sync.Mutex
	m  map[queueKey]*room
}

// room is one lock's waiting room for one client in this process. Its
// fields are guarded by mu, except those set at creation.
type room struct {
	key   queueKey
	set   *roomSet
	id    string // the suffix of the room's wake channel
	store store
	keys  lease.Keys

	mu      sync.Mutex
	refs    int                // waiting Lock calls and running clean-ups
	waiters map[string]*waiter // by value
	linger  *time.Timer

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

// enterRoom returns m's room, creating it if needed, and counts the caller
// in; the caller must call exit when done.
func enterRoom(m *Mutex) *room {
	k := m.queueKey()
	s := roomsFor(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[queueKey]*room)
	}
	r := s.m[k]
	if r == nil {
		r = &room{key: k, set: s, id: newRoomID(), store: m.store, keys: m.keys, waiters: make(map[string]*waiter)}
		s.m[k] = r
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refs++
	if r.linger != nil {
		r.linger.Stop()
		r.linger = nil
	}
	return r
}

// newRoomID returns a room id unique among the rooms of all processes: a
// random prefix drawn once per process (16 hex digits) and a counter.
func newRoomID() string {
	return roomPrefix + strconv.FormatUint(roomCounter.Add(1), 36)
}

// The parts of newRoomID's ids.
var (
	roomPrefix  = randomHex()
	roomCounter atomic.Uint64
)

func randomHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported systems
	return hex.EncodeToString(b[:]) + "-"
}

// lookupRoom returns k's room, if there is one.
func lookupRoom(k queueKey) *room {
	s := roomsFor(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[k]
}

// exit counts a caller of enterRoom out. The last one out closes the room:
// at once if it has no subscription, after roomLinger otherwise.
func (r *room) exit() {
	r.mu.Lock()
	r.refs--
	idle, listening := r.refs == 0, r.listening
	if idle && listening && r.linger == nil {
		r.linger = time.AfterFunc(roomLinger, r.closeAndWait)
	}
	r.mu.Unlock()
	if idle && !listening {
		r.close()
	}
}

// close removes an idle room and ends its subscription, unless a caller
// entered it again meanwhile. It returns the channel that is closed when
// the subscription goroutine has ended, or nil when it did not close the
// room or the room never subscribed.
func (r *room) close() <-chan struct{} {
	r.set.mu.Lock()
	defer r.set.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refs > 0 || r.set.m[r.key] != r {
		return nil
	}
	delete(r.set.m, r.key)
	if r.cancelSub != nil {
		r.cancelSub()
	}
	return r.subDone
}

// closeAndWait is the linger timer's function: it closes the room and waits
// for the subscription goroutine to end (it unsubscribes, bounded by
// lease's unsubscribe timeout).
func (r *room) closeAndWait() {
	if done := r.close(); done != nil {
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

// leave removes w.
func (r *room) leave(w *waiter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiters[w.value] == w {
		delete(r.waiters, w.value)
	}
}

// listen starts the room's subscription, unless it runs already or the
// server refused pub/sub. It reports whether announcements arrive now.
func (r *room) listen() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.listening && !r.noPubSub {
		r.listening = true
		ctx, cancel := context.WithCancel(context.Background())
		r.cancelSub, r.subDone = cancel, make(chan struct{})
		go r.subscribe(ctx)
	}
	return r.up
}

// granted wakes the waiter for value, if it is in the room.
func (r *room) granted(value string, n grantNote) {
	r.mu.Lock()
	w := r.waiters[value]
	r.mu.Unlock()
	if w == nil {
		return
	}
	select {
	case w.grant <- n:
	default:
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

// subscribe keeps the room subscribed to its wake channel until ctx is
// cancelled by close, or until the server refuses pub/sub.
func (r *room) subscribe(ctx context.Context) {
	defer close(r.subDone)
	resubscribe(ctx, func() error {
		return r.store.Subscribe(ctx, r.keys, r.id, func() { r.setUp(true) }, func(value string, token int64) {
			r.granted(value, grantNote{token: token})
		})
	}, func(noPubSub bool) {
		r.setUp(false)
		if noPubSub {
			r.mu.Lock()
			r.noPubSub, r.listening = true, false
			r.mu.Unlock()
		}
	})
}

// resubscribe runs subscribe until ctx ends. Each time it returns for
// another reason, resubscribe calls down, with whether the server refused
// pub/sub; then it stops if it did, and otherwise subscribes again after a
// pause that doubles from minResubscribe up to maxResubscribe.
func resubscribe(ctx context.Context, subscribe func() error, down func(noPubSub bool)) {
	backoff := minResubscribe
	for {
		err := subscribe()
		if ctx.Err() != nil {
			return
		}
		noPubSub := errors.Is(err, lease.ErrNoPubSub)
		down(noPubSub)
		if noPubSub {
			return // the caller polls
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

// goClean runs f in the background, counted in the room so that the room
// (and with it the owner of the goroutine) stays until f returns, and in
// background for Settle. f must be bounded in time.
func (r *room) goClean(f func()) {
	r.mu.Lock()
	r.refs++
	r.mu.Unlock()
	background.Add(1)
	go func() {
		defer background.Add(-1)
		defer r.exit()
		f()
	}()
}

// background counts the goroutines that goClean runs.
var background atomic.Int64

// settlePoll is how often Settle looks whether the background work is done.
const settlePoll = 5 * time.Millisecond

// Settle waits until the work that acquire calls left to the background in
// this process is done, or until ctx ends, and returns ctx's error then.
//
// A Lock, TryLock or TryLockFor call that gives up (its context ended, its
// wait ran out, or a call's outcome was unknown) returns at once and leaves
// its clean-up to a goroutine of its own: it takes the caller's place out of
// the lock's line and passes on a lock that was passed to it meanwhile. A
// program that exits right after such a call would cut that clean-up short;
// Redis then forgets the place, and the lock passed to it, on its own within
// the claim window (see [WithClaimWindow]). Calling Settle before exiting,
// with a short timeout, lets the next waiter have the lock at once instead.
// Settle is safe for concurrent use and needs no call to have given up: with
// nothing in the background it returns nil at once.
func Settle(ctx context.Context) error {
	t := time.NewTicker(settlePoll)
	defer t.Stop()
	for background.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// deliverPasses tells the waiters of this process that a release sent at
// sent passed the lease (or a semaphore's permits) to, if there are any:
// they wake at once instead of waiting for the announcement.
func deliverPasses(k queueKey, r lease.Release, sent time.Time) {
	if r.Passed.Value == "" {
		return
	}
	room := lookupRoom(k)
	if room == nil {
		return
	}
	for _, p := range r.Passes() {
		if room.id == p.Room {
			room.granted(p.Value, grantNote{token: p.Token, sent: sent})
		}
	}
}
