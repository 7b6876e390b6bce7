package distlock

import (
	"runtime"
	"time"
)

// Hooks for the fault-injection suite (safety_test.go), which measures how
// far ahead of the server-side expiry a guard gives up its lease.

// LeaseDeadline returns g's local lease deadline D: the send time of the last
// write Redis confirmed plus the TTL minus the margin. It keeps its value
// while the guard is Lost, and is zero once the guard is released.
func LeaseDeadline(g *Guard) time.Time { _, d := g.vouched(); return d }

// Margin returns how long before the earliest server-side expiry a guard
// with this TTL stops reporting Acquired.
func Margin(ttl time.Duration) time.Duration { return margin(ttl) }

// Rooms returns how many waiting rooms the process has.
func Rooms() int { return RoomsOf("") }

// RoomsOf returns how many waiting rooms the process has for the lease key
// leaseKey (every key when it is empty), on any client: a parallel test
// that owns the key checks that its own rooms are gone without counting
// other tests' rooms.
func RoomsOf(leaseKey string) int {
	n := 0
	proc.sessions.each(func(s *session) {
		for k := range s.rooms {
			if leaseKey == "" || k == leaseKey {
				n++
			}
		}
	})
	return n
}

// Sessions returns how many client sessions the process has.
func Sessions() int { return proc.sessions.len() }

// OnSessionCollected has f called once the session of client (as
// lease.Redis.Identity names it) has been collected, and reports whether
// the client has a session.
func OnSessionCollected(client any, f func()) bool {
	s := proc.sessions.get(client)
	if s == nil {
		return false
	}
	runtime.AddCleanup(s, func(f func()) { f() }, f)
	return true
}

// Waiting reports whether a Lock call on client (as lease.Redis.Identity
// names it) waits in one of its session's rooms.
func Waiting(client any) bool {
	s := proc.sessions.get(client)
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rooms {
		if r.refs > 0 {
			return true
		}
	}
	return false
}

// each calls f with every session, locked.
func (ss *sessionSet) each(f func(*session)) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, s := range ss.m {
		s.mu.Lock()
		f(s)
		s.mu.Unlock()
	}
}

// newMutex builds a Mutex without a client or store, for the tests that
// give it a fake store.
func newMutex(key string, opts []Option) (*Mutex, error) {
	m := new(Mutex)
	if err := m.e.configure(key, opts); err != nil {
		return nil, err
	}
	return m, nil
}

// RoomID returns the name of this process's waiting rooms in Redis: a
// waiter of this process hears of its grant on [lease.Keys.WakeChannel] of
// it.
func RoomID() string { return proc.roomID }

// get returns client's session, or nil; the session may stop as soon as
// get returns.
func (ss *sessionSet) get(client any) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.m[client]
}

// len returns how many sessions the process has.
func (ss *sessionSet) len() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.m)
}
