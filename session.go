package distlock

import (
	"sync"
	"time"
)

// Sessions: what the locks of one client share in this process.
//
// A client's locks share three things, each of which needs Redis only once
// per client rather than once per lock:
//
//   - the waiting rooms (wait.go): one per lock that a Lock call of this
//     process waits for on the client, each with one subscription to its
//     wake channel;
//   - the restart watch (keeper.go): one keeper per node the client's live
//     guards are on, whose subscription breaks when the node's connection
//     does, so that every guard on it renews as soon as the node answers
//     again;
//   - the renewal batcher (batcher.go), through which the actors of the
//     client's guards send their renewals in batches.
//
// They hang off one session per client: one entry in the process's
// registry (proc.sessions), one count of what keeps it (its rooms and its
// keepers, which count the Lock calls waiting in them and the live guards
// they watch), one owner (the session's mu guards all of it) and one stop.
//
// # Lifetime
//
// A session is made with its first part (a room or a keeper) and lives
// while it has one. A part whose last user left lingers for roomLinger
// with its subscription (a lock taken over and over, or waited for over
// and over, subscribes once rather than at every turn), on the session's
// one linger timer; it goes at once when it has no subscription (a
// keeper on rueidis that has not subscribed yet lingers all the same: see
// keeper.go, "When it subscribes"), or when its subscription ends while
// it lingers (a closed client ends every
// subscription on it, so a session of a closed client goes as soon as the
// client has told its subscribers, not after a linger). When its last part
// goes, the session leaves the registry and stops: its batcher is told to
// stop, and the stop is acknowledged once every goroutine of the session
// (the subscriptions, the batcher) has returned, as background work that
// Settle waits for. Nothing a Lock, a Release or a guard's actor does
// waits for a session to stop: only the linger timer's goroutine does.
//
// # The hot path
//
// A Lock+Release pair of a client that has a session finds it through its
// engine (engine.sess), with one atomic load and the session's mutex,
// without the registry's lock; the registry is asked only when the engine
// has no session yet or the one it knew has stopped.

// sessionSet is the process's sessions, by client identity.
type sessionSet struct {
	mu sync.Mutex
	m  map[any]*session
}

// session is what one client's locks share in this process; see above.
// Its fields are guarded by mu, except those set at creation.
type session struct {
	set    *sessionSet
	client any

	mu      sync.Mutex
	stopped bool               // it has left the registry
	rooms   map[string]*room   // by lease key
	keepers map[string]*keeper // by watch group (see keeper.go)
	batcher *batcher           // made at the first renewal that can be batched
	// The linger: lingering says that the timer linger (made the first
	// time a part is left idle, then reused) will run lingered, which
	// closes the parts that have been idle for roomLinger. Leaving a part
	// idle does not arm the timer again while it runs, so a lock taken and
	// released over and over costs no timer operation per pair.
	linger    *time.Timer
	lingering bool
	// running counts the session's goroutines; done is closed when the
	// session has stopped and none is left.
	running int
	done    chan struct{}
}

// lock returns e's client's session, locked, making one when there is
// none and create is set, and nil otherwise. A session it returns has not
// stopped, and stays so until the caller unlocks it.
func (ss *sessionSet) lock(e *engine, create bool) *session {
	if s := e.sess.Load(); s != nil {
		s.mu.Lock()
		if !s.stopped {
			return s
		}
		s.mu.Unlock()
	}
	ss.mu.Lock()
	s := ss.m[e.client]
	if s == nil {
		if !create {
			ss.mu.Unlock()
			return nil
		}
		if ss.m == nil {
			ss.m = make(map[any]*session)
		}
		s = &session{set: ss, client: e.client, rooms: make(map[string]*room),
			keepers: make(map[string]*keeper), done: make(chan struct{})}
		ss.m[e.client] = s
	}
	s.mu.Lock()
	ss.mu.Unlock()
	e.sess.Store(s)
	return s
}

// spawn runs f in a goroutine of the session, which its stop waits for.
// The caller holds s.mu.
func (s *session) spawn(f func()) {
	s.running++
	go func() {
		defer s.exited()
		f()
	}()
}

// exited counts a goroutine of the session out; the last one of a
// session that has stopped acknowledges the stop.
func (s *session) exited() {
	s.mu.Lock()
	s.running--
	last := s.stopped && s.running == 0
	if last {
		close(s.done)
	}
	s.mu.Unlock()
	if last {
		proc.work.done() // taken by stopIfEmpty
	}
}

// idle arms the linger timer for a part that has just been left idle,
// unless it runs already. The caller holds s.mu.
func (s *session) idle() {
	if s.lingering {
		return
	}
	s.lingering = true
	if s.linger == nil {
		s.linger = time.AfterFunc(roomLinger, s.lingered)
	} else {
		s.linger.Reset(roomLinger)
	}
}

// lingered is the linger timer's function: it closes every part that has
// been idle for roomLinger, and runs again when the next idle part will
// have been; when no part is left, the session stops, and lingered waits
// for the stop to be acknowledged. It runs as background work, which
// Settle waits for.
func (s *session) lingered() {
	proc.work.add(1)
	defer proc.work.done()
	var (
		rooms   []*room
		keepers []*keeper
	)
	now := time.Now()
	s.set.mu.Lock()
	s.mu.Lock()
	s.lingering = false
	var next time.Duration
	// lingeredOut reports whether a part idle since then has lingered
	// for roomLinger (keeperLinger is the same), and otherwise keeps in
	// next when the first such part will have.
	lingeredOut := func(since time.Time) bool {
		left := roomLinger - now.Sub(since)
		if left > 0 && (next == 0 || left < next) {
			next = left
		}
		return left <= 0
	}
	for _, r := range s.rooms {
		if r.refs == 0 && lingeredOut(r.idleSince) {
			s.dropRoom(r)
			rooms = append(rooms, r)
		}
	}
	for _, k := range s.keepers {
		if len(k.guards) == 0 && lingeredOut(k.idleSince) {
			s.dropKeeper(k)
			keepers = append(keepers, k)
		}
	}
	stopped := s.stopIfEmpty()
	if next > 0 && !stopped {
		s.lingering = true
		s.linger.Reset(next)
	}
	s.mu.Unlock()
	s.set.mu.Unlock()
	for _, r := range rooms {
		r.endSubscription()
	}
	for _, k := range keepers {
		k.stop()
	}
	if stopped {
		<-s.done
	}
}

// dropRoom takes r out of the session. The caller holds s.mu, and ends r's
// subscription (if it has one) once it has let go of it.
func (s *session) dropRoom(r *room) {
	delete(s.rooms, r.keys.Lease)
}

// dropKeeper takes k out of the session. The caller holds s.mu, and stops
// k (if its subscription runs) once it has let go of it.
func (s *session) dropKeeper(k *keeper) {
	delete(s.keepers, k.group)
}

// stopIfEmpty stops the session when no part is left, and reports whether
// it did. The caller holds s.set.mu and s.mu.
//
// The stop takes the session out of the registry, so that the next Lock
// of its client makes a new one, and tells the batcher to stop. It is
// acknowledged (done is closed) once every goroutine of the session has
// returned; until then it counts as background work, which Settle waits
// for.
func (s *session) stopIfEmpty() bool {
	if s.stopped || len(s.rooms) > 0 || len(s.keepers) > 0 {
		return false
	}
	s.stopped = true
	if s.set.m[s.client] == s {
		delete(s.set.m, s.client)
		if len(s.set.m) == 0 {
			// A Go map never shrinks: drop an empty one, so that a process
			// that has used many clients over time keeps nothing of them.
			s.set.m = nil
		}
	}
	if s.lingering {
		s.linger.Stop()
		s.lingering = false
	}
	if s.batcher != nil {
		s.batcher.stop() // its run is one of the session's goroutines
	}
	if s.running == 0 {
		close(s.done)
	} else {
		proc.work.add(1) // given back by the last goroutine's exit
	}
	return true
}

// leftIdle is called, with s.mu held, by a part that went at once (it had
// no subscription, or its subscription ended while it lingered): the
// session stops when that was its last part. It takes the registry's lock,
// which comes before s.mu, by letting go of s.mu for a moment: the
// session is checked again under both.
func (s *session) leftIdle() {
	if s.stopped || len(s.rooms) > 0 || len(s.keepers) > 0 {
		return
	}
	s.mu.Unlock()
	s.set.mu.Lock()
	s.mu.Lock()
	s.stopIfEmpty()
	s.set.mu.Unlock()
}

// batcherFor returns the batcher of the session, starting it if there is
// none, or nil when e's renewals cannot be batched (see batcher.go, "What
// is batched"). The batcher lives as long as the session.
func (s *session) batcherFor(e *engine) *batcher {
	br, ok := batcherFor(e)
	if !ok {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil // (its renewals go alone; a live guard keeps its session)
	}
	if s.batcher == nil {
		s.batcher = newBatcher(br)
		s.spawn(s.batcher.run)
	}
	return s.batcher
}
