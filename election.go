package distlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/actor"
	"github.com/distkit-go/distlock/lease"
)

// An Election picks one leader among candidates that may run in many
// processes. Leading is holding a lock: [Election.Campaign] waits in line
// for it like [Mutex.Lock] and returns the same [Guard], whose lease is
// renewed in the background and whose state, context and events say the
// moment the term is in doubt. Resigning is [Guard.Release], which hands
// the lead to the next candidate in line within the same script.
//
// A term ends under the same contract as a Mutex guard: a leader's guard
// says Acquired only while Redis cannot have let the lease expire, so two
// candidates never both believe they lead at one instant by their own
// clocks; and each term has a fencing token, greater than every earlier
// term's, that orders the writes of successive leaders.
//
// Anyone, candidate or not, can follow the leader: [Election.Leader] asks
// Redis once, [Election.Observe] delivers every change. Every grant and
// release of an election announces the new leader on a channel of its own,
// so observers learn of a change within a round trip and a push, not at a
// poll.
//
// An Election and a [Mutex] of one name and namespace are the same lease
// (an election is a lock whose grants are announced): whoever holds one
// holds the other, and they wait in one line. Observers see a Mutex's holder
// as the leader, but a Mutex does not announce its grants and releases, so
// they learn of those only when they next read the lease. Give them
// different names. An [RWMutex] of the same name is that lock too (its
// writer holds it as a Mutex does, its readers share it with each other),
// and its releases do not announce either. A [Semaphore] of the same name
// is refused with [ErrWrongKind].
//
// An Election holds configuration and, while someone observes it, one
// watcher goroutine shared by its observers. It is safe for concurrent use.
// Make one with [NewElection]: Campaign and Leader of the zero Election
// return an error matching [ErrInvalidOption], and its Observe panics.
type Election struct {
	e    engine
	read leaderReader

	mu sync.Mutex
	w  *watcher // while someone observes
}

// leaderReader is what an Election reads Redis with; *lease.Client in
// production.
type leaderReader interface {
	Read(ctx context.Context, k lease.Keys) (lease.Snapshot, error)
	SubscribeLeader(ctx context.Context, k lease.Keys, ready func(), changed func(value string, token int64)) error
}

// Leader is an election's leader, as [Election.Leader] and
// [Election.Observe] report it. The zero Leader means that nobody leads.
type Leader struct {
	// Value is what the leader proclaimed in [Election.Campaign].
	Value string
	// Token is its term's fencing token, the one its Guard's Token
	// returns.
	Token int64
	// Since is when the term began, on the Redis server's clock: a token is
	// the server's clock in microseconds when it was issued (see
	// [Guard.Token]).
	Since time.Time
}

// IsZero reports whether l says that nobody leads.
func (l Leader) IsZero() bool { return l == Leader{} }

func (l Leader) String() string {
	if l.IsZero() {
		return "no leader"
	}
	return fmt.Sprintf("%q (token %d, since %s)", l.Value, l.Token, l.Since.Format(time.RFC3339Nano))
}

// NewElection returns the election named name, reached through client. The
// name, namespace and options follow the rules of [NewMutex], except
// [WithOwner], which is refused: each candidate proclaims its own value in
// Campaign. [WithTTL] sets the length of a term's lease: a leader that
// dies without resigning is replaced once it has run out.
func NewElection(client rueidis.Client, name string, opts ...Option) (*Election, error) {
	return NewElectionOn(lease.FromRueidis(client), name, opts...)
}

// NewElectionOn is [NewElection] on any client that implements the seam
// [lease.Redis], as [NewMutexOn] is for a Mutex.
func NewElectionOn(client lease.Redis, name string, opts ...Option) (*Election, error) {
	e := new(Election)
	if err := e.e.init(client, name, kindElection, 0, opts); err != nil {
		return nil, err
	}
	var err error
	if e.read, err = lease.NewOn(client, lease.Ack{}); err != nil {
		return nil, invalid("client", "%v", err) // no ack: cannot fail
	}
	return e, nil
}

// Key returns the Redis key that holds the leader's lease.
func (e *Election) Key() string { return e.e.keys.Lease }

// Campaign waits until this candidate leads, then returns the Guard of its
// term. value is what it proclaims to observers, such as its address: 1 to
// 256 bytes of printable UTF-8 (an error matching [ErrInvalidArgument]
// otherwise). Candidates wait first come, first served, as [Mutex.Lock]
// callers do, and ctx bounds both the wait and the term, with the errors of
// [Mutex.Lock]: pass a context that lives as long as the candidate should
// lead, and bound the wait with [WithMaxWait] if needed. The term ends when
// the guard is released (resigning), when ctx ends, or when the lease is
// lost; the guard's Context, State and Subscribe say so at once.
func (e *Election) Campaign(ctx context.Context, value string) (*Guard, error) {
	if e.e.store == nil {
		return nil, zeroValue("Election")
	}
	if err := lease.CheckOwner(value); err != nil {
		// The check names what it checks an owner id; here it is the value.
		return nil, badArgument("value", "value %s", strings.TrimPrefix(unwrapName(err), "owner "))
	}
	return e.e.acquire(ctx, value, e.e.lockMode(), e.e.maxWait, e.e.retryInterval)
}

// Leader asks Redis who leads now, in one round trip. It returns the zero
// Leader when nobody does.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	if e.read == nil {
		return Leader{}, zeroValue("Election")
	}
	if ctx == nil {
		return Leader{}, badArgument("ctx", "is nil")
	}
	s, err := e.read.Read(ctx, e.e.keys)
	if err != nil {
		return Leader{}, fmt.Errorf("distlock: reading the leader of %s: %w", e.e.keys.Lease, err)
	}
	v, err := e.view(s)
	if err != nil {
		return Leader{}, err
	}
	return v.leader, nil
}

// Observe returns a channel that delivers the current leader as soon as it
// is known, then every change of leader (the zero Leader when nobody
// leads), until ctx ends; then the channel is closed. The channel holds
// one Leader: an observer that falls behind finds the latest when it
// reads, never a stale one, and it never holds up anyone else.
//
// Observers of one Election share one watcher, which listens for the
// announcements of the election's scripts and reads Redis when it starts,
// when its subscription comes back, and when the leader's lease would run
// out (a leader that died does not announce its end). Where Redis refuses
// pub/sub, the watcher reads every [DefaultRetryInterval] instead. When
// the last observer's ctx ends, the watcher unsubscribes before that
// observer's channel is closed, so a program that has drained the channel
// leaves nothing of it running. A nil ctx returns a closed channel.
// Observe panics on a zero Election (one that NewElection did not make).
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	if e.read == nil {
		// No error to return: fail here, in the caller's goroutine, rather
		// than in the watcher's.
		panic(zeroValue("Election"))
	}
	ch := make(chan Leader, 1)
	if ctx == nil {
		close(ch)
		return ch
	}
	for {
		e.mu.Lock()
		if e.w == nil {
			e.w = startWatcher(e)
		}
		w := e.w
		e.mu.Unlock()
		if w.act.Send(context.Background(), observeMsg{ctx: ctx, ch: ch}) == nil {
			return ch
		}
		// It stopped as its last observer left; start another.
		e.mu.Lock()
		if e.w == w {
			e.w = nil
		}
		e.mu.Unlock()
	}
}

// view is what one read or announcement says about the leader, with the
// order among them.
type view struct {
	leader Leader
	// after is the token that orders the view: the leader's, or for "no
	// leader" the token of the last term. none: nobody leads after it.
	after int64
	none  bool
	ttl   time.Duration // the leader's lease left, from a read; 0 unknown
}

// newer reports whether v comes after w.
func (v view) newer(w view) bool {
	if v.after != w.after {
		return v.after > w.after
	}
	return v.none && !w.none
}

// view turns a read into a view.
func (e *Election) view(s lease.Snapshot) (view, error) {
	switch {
	case s.Type == "string" && len(s.Holders) > 0:
		h := s.Holders[0]
		return view{leader: leaderOf(h.Value, s.Fence), after: s.Fence, ttl: h.TTL}, nil
	case s.Type == "none":
		return view{after: s.Fence, none: true}, nil
	}
	return view{}, fmt.Errorf("distlock: reading the leader of %s: %w: the key holds a %s", e.e.keys.Lease, ErrNotElection, s.Type)
}

// ErrNotElection is returned by [Election.Leader] when the election's key
// holds something else, such as a semaphore of the same name.
var ErrNotElection = errors.New("not an election")

// announced turns an announcement into a view.
func announced(value string, token int64) view {
	if value == "" {
		return view{after: token, none: true}
	}
	return view{leader: leaderOf(value, token), after: token}
}

// leaderOf is the Leader whose lease holds value, granted with token.
func leaderOf(value string, token int64) Leader {
	return Leader{Value: lease.Owner(value), Token: token, Since: time.UnixMicro(token)}
}

// The watcher: one actor per observed Election.

type watchMsg interface{ isWatchMsg() }

type observeMsg struct {
	ctx context.Context
	ch  chan Leader
}

type unobserveMsg struct{ ch chan Leader }

type announceMsg struct{ v view }

type readMsg struct {
	v   view
	err error
}

type subMsg struct{ up bool }

func (observeMsg) isWatchMsg()   {}
func (unobserveMsg) isWatchMsg() {}
func (announceMsg) isWatchMsg()  {}
func (readMsg) isWatchMsg()      {}
func (subMsg) isWatchMsg()       {}

type watcher struct {
	e   *Election
	act *actor.Actor[watchMsg]
}

func startWatcher(e *Election) *watcher {
	w := &watcher{e: e}
	w.act = actor.Start(w.run)
	return w
}

// watchState is the watcher loop's state, owned by the loop goroutine.
type watchState struct {
	cur       view
	known     bool                        // cur came from a read or an announcement
	observers map[chan Leader]func() bool // with the stop of each one's AfterFunc
	reading   bool                        // a read is in flight
	again     bool                        // read again when it returns
	heard     int                         // announcements so far
	heardAt   int                         // heard when the read in flight was sent
	up        bool                        // announcements arrive
	retry     backoff                     // the pause after a read that failed
	timer     *time.Timer                 // the next read
}

// run is the watcher's loop. It ends when its last observer has left.
func (w *watcher) run(a *actor.Actor[watchMsg], inbox <-chan watchMsg) {
	s := &watchState{observers: make(map[chan Leader]func() bool), timer: time.NewTimer(time.Hour),
		retry: backoff{first: minResubscribe, most: maxResubscribe}}
	defer func() {
		// The children (the subscription and a read) end soon once their
		// context is cancelled; the observers' channels close after them,
		// so that an observer who sees its channel closed knows the
		// watcher's work is over.
		s.timer.Stop()
		a.StopChildren()
		for ch, stopAfter := range s.observers {
			stopAfter()
			close(ch)
		}
	}()
	e := w.e
	a.Go(func(ctx context.Context) { w.subscribe(ctx, a) })
	w.read(a, s)
	for {
		select {
		case <-s.timer.C:
			w.read(a, s)
		case msg := <-inbox:
			switch msg := msg.(type) {
			case observeMsg:
				ch := msg.ch
				s.observers[ch] = context.AfterFunc(msg.ctx, func() {
					_ = a.Send(context.Background(), unobserveMsg{ch: ch})
				})
				if s.known {
					offerLatest(ch, s.cur.leader)
				}
			case unobserveMsg:
				stopAfter, ok := s.observers[msg.ch]
				if !ok {
					break
				}
				if len(s.observers) == 1 {
					return // the last one: closed on the way out
				}
				stopAfter()
				close(msg.ch)
				delete(s.observers, msg.ch)
			case announceMsg:
				s.heard++
				if !s.known || msg.v.newer(s.cur) {
					w.set(s, msg.v)
					if !msg.v.none {
						// Its lease is at least a claim window long; read
						// then, to learn how long, and to see it end if its
						// holder died.
						s.timer.Reset(e.e.claim + expiryGrace)
					}
				}
			case readMsg:
				s.reading = false
				w.readDone(a, s, msg)
			case subMsg:
				s.up = msg.up
				// Up: announcements may have been missed before it took.
				// Down: read now, and poll until it is back.
				w.read(a, s)
			}
		}
	}
}

// read sends a read in a child, unless one is in flight (then it reads
// again when that one returns).
func (w *watcher) read(a *actor.Actor[watchMsg], s *watchState) {
	if s.reading {
		s.again = true
		return
	}
	s.reading, s.again, s.heardAt = true, false, s.heard
	e := w.e
	a.Go(func(ctx context.Context) {
		rctx, cancel := context.WithTimeout(ctx, max(e.e.ttl/3, time.Second))
		defer cancel()
		var msg readMsg
		snap, err := e.read.Read(rctx, e.e.keys)
		if err == nil {
			msg.v, err = e.view(snap)
		}
		msg.err = err
		_ = a.Send(ctx, msg)
	})
}

// readDone applies a read's result and schedules the next read.
func (w *watcher) readDone(a *actor.Actor[watchMsg], s *watchState, msg readMsg) {
	e := w.e
	if msg.err != nil {
		e.e.logger().Debug("distlock: reading the leader failed", "err", msg.err)
		s.timer.Reset(s.retry.next())
		return
	}
	s.retry.reset()
	// A read sent after the last announcement is the newest word there is,
	// even against the token order (the fencing key may have been lost);
	// one that raced an announcement is ordered by token.
	if !s.known || s.heard == s.heardAt || msg.v.newer(s.cur) {
		w.set(s, msg.v)
	}
	if s.again {
		w.read(a, s)
		return
	}
	var next time.Duration
	switch {
	case !s.cur.none && s.cur.ttl > 0:
		next = s.cur.ttl + expiryGrace // when the lease would end
	case !s.cur.none:
		next = e.e.ttl // a lease without expiry, or an announced one
	default:
		next = time.Hour
	}
	if !s.up {
		next = min(next, DefaultRetryInterval)
	}
	s.timer.Reset(next)
}

// set makes v the current view and tells the observers if the leader
// changed.
func (w *watcher) set(s *watchState, v view) {
	changed := !s.known || v.leader != s.cur.leader
	s.cur, s.known = v, true
	if changed {
		for ch := range s.observers {
			offerLatest(ch, v.leader)
		}
	}
}

// subscribe keeps the watcher subscribed to the election's channel until
// ctx ends, and reports announcements and the subscription's state.
func (w *watcher) subscribe(ctx context.Context, a *actor.Actor[watchMsg]) {
	e := w.e
	resubscribe(ctx, &backoff{first: minResubscribe, most: maxResubscribe}, func() error {
		return e.read.SubscribeLeader(ctx, e.e.keys, func() {
			_ = a.Send(ctx, subMsg{up: true})
		}, func(value string, token int64) {
			_ = a.Send(ctx, announceMsg{v: announced(value, token)})
		})
	}, func(noPubSub bool) bool {
		_ = a.Send(ctx, subMsg{}) // down: the loop reads now, then polls
		return !noPubSub
	})
}
