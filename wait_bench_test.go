package distlock

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// lineStore is a lease store with a line, in memory: a release passes the
// lease to the first in line and names it in its reply, as Redis's release
// script does. It lets BenchmarkHandoffClient time the client's side of a
// hand-off with no network in it.
//
// Like Redis's scripts, it refuses a value that Cancel gave up: a call that
// a waiter left behind when its grant came, arriving after the waiter's
// release, must not take the free lock for a value nobody holds.
type lineStore struct {
	mu     sync.Mutex
	inLine sync.Cond // signalled when a value stands in line
	holder string
	token  int64
	line   []string
	void   map[string]bool
	passes int
}

func newLineStore() *lineStore {
	s := &lineStore{void: make(map[string]bool)}
	s.inLine.L = &s.mu
	return s
}

// waitInLine waits until a value stands in line.
func (s *lineStore) waitInLine() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.line) == 0 {
		s.inLine.Wait()
	}
}

func (s *lineStore) grant(value string) lease.Grant {
	s.holder = value
	s.token++
	return lease.Grant{Acquired: true, Token: s.token}
}

func (s *lineStore) Acquire(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Grant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.void[value]:
		return lease.Grant{Holder: s.holder, Rank: -1}, nil
	case s.holder == "":
		return s.grant(value), nil
	case s.holder == value:
		return lease.Grant{Acquired: true, Token: s.token}, nil
	}
	return lease.Grant{Holder: s.holder, HolderTTL: ttl, Rank: -1}, nil
}

func (s *lineStore) AcquireOrQueue(ctx context.Context, k lease.Keys, value string, ttl time.Duration, p lease.Place) (lease.Grant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.void[value]:
		return lease.Grant{Holder: s.holder, Rank: -1}, nil
	case s.holder == value:
		return lease.Grant{Acquired: true, Token: s.token}, nil
	case s.holder == "" && len(s.line) == 0:
		return s.grant(value), nil
	}
	rank := -1
	for i, v := range s.line {
		if v == value {
			rank = i
		}
	}
	if rank < 0 {
		rank = len(s.line)
		s.line = append(s.line, value)
	}
	s.inLine.Signal()
	return lease.Grant{Holder: s.holder, HolderTTL: ttl, Rank: rank, Ticket: int64(rank + 1), Fence: s.token}, nil
}

func (s *lineStore) Renew(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Renewal, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return lease.Renewal{OK: s.holder == value, Holder: s.holder}, nil
}

func (s *lineStore) Release(ctx context.Context, k lease.Keys, value string) (lease.Release, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holder != value {
		return lease.Release{}, nil
	}
	s.holder = ""
	if len(s.line) == 0 {
		return lease.Release{Deleted: true}, nil
	}
	next := s.line[0]
	s.line = s.line[1:]
	s.passes++
	g := s.grant(next)
	return lease.Release{Deleted: true, Passed: lease.Pass{Value: next, Token: g.Token, Room: proc.roomID}}, nil
}

func (s *lineStore) Cancel(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Release, error) {
	s.mu.Lock()
	s.void[value] = true
	for i, v := range s.line {
		if v == value {
			s.line = append(s.line[:i], s.line[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	return s.Release(ctx, k, value)
}

func (s *lineStore) CancelDedicated(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Release, error) {
	return s.Cancel(ctx, k, value, ttl)
}

// KeepsDeadlines implements lease.DeadlineKeeper: the store ends a call at
// its context's deadline, as the rueidis client does (a call of a memory
// store never waits anyway), so the cycle takes the paths it takes on
// rueidis.
func (s *lineStore) KeepsDeadlines() bool { return true }

// Subscribe confirms at once: grants reach the waiters from the releases'
// replies.
func (s *lineStore) Subscribe(ctx context.Context, k lease.Keys, room string, ready func(), granted func(string, int64)) error {
	ready()
	<-ctx.Done()
	return ctx.Err()
}

// BenchmarkHandoffClient is the client's side of a contended cycle within
// one process, with the lease store in memory: the holder takes the free
// lock, the waiter stands in line, the holder's release passes the lock to
// it (its reply wakes the waiter), the waiter's Lock returns and it
// releases. ns/op and allocs/op are the client's whole work for a cycle, its
// goroutine hops included; BenchmarkHandoff measures the hand-off itself
// against a real Redis.
func BenchmarkHandoffClient(b *testing.B) {
	s := newLineStore()
	mutex := func() *Mutex {
		m, err := newMutex("handoff", nil)
		if err != nil {
			b.Fatal(err)
		}
		m.e.client, m.e.store = s, s
		return m
	}
	holder, waiter := mutex(), mutex()
	start, held := make(chan struct{}), make(chan error, 1)
	go func() {
		for range start {
			g, err := waiter.Lock(context.Background())
			if err == nil {
				_, err = g.Release(context.Background())
			}
			held <- err
		}
	}()
	defer close(start)
	cycle := func() {
		g, err := holder.Lock(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		start <- struct{}{}
		s.waitInLine()
		if _, err := g.Release(context.Background()); err != nil {
			b.Fatal(err)
		}
		if err := <-held; err != nil {
			b.Fatal(err)
		}
	}
	cycle() // the room and its subscription are up
	b.ReportAllocs()
	passes := s.passes
	for b.Loop() {
		cycle()
	}
	if got := s.passes - passes; got != b.N {
		b.Fatalf("%d releases passed the lock in %d cycles, want every one", got, b.N)
	}
}
