package distlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// These tests drive a guard's timing against a fake lease store inside a
// synctest bubble, where time only moves when every goroutine is blocked, so
// deadlines can be checked to the nanosecond.

type renewMode int

const (
	renewOK     renewMode = iota
	renewRefuse           // the key holds another value
	renewFail             // Redis answers with an error
	renewHang             // no answer until the call's deadline
	renewDeaf             // no answer for ten TTLs, whatever the call's deadline (go-redis waits out its ReadTimeout)
)

type renewCall struct {
	sent     time.Time
	deadline time.Time
}

// fakeStore is a lease store with one key, whose renewals behave as told.
type fakeStore struct {
	mu        sync.Mutex
	holder    string
	token     int64
	mode      renewMode
	acquireFn func(ctx context.Context) error // optional failure for Acquire
	renews    []renewCall
	releases  []string        // Release and Cancel calls, by value
	voided    map[string]bool // values given up by Cancel
	cancelErr error           // when set, Cancel fails with it
	afterDone int             // calls made after the guard reported done
	done      <-chan struct{}

	acquireCalls int
	expires      time.Time // when holder's lease ends; zero: renewed forever

	// ignoresDeadlines makes the fake a client that does not end a call at
	// its context's deadline (go-redis), and the acquirer waits for the
	// deadline beside the call; by default it is one that does (rueidis).
	ignoresDeadlines bool
}

// KeepsDeadlines implements lease.DeadlineKeeper.
func (f *fakeStore) KeepsDeadlines() bool { return !f.ignoresDeadlines }

func (f *fakeStore) Acquire(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Grant, error) {
	f.mu.Lock()
	fn := f.acquireFn
	f.mu.Unlock()
	if fn != nil {
		if err := fn(ctx); err != nil {
			return lease.Grant{}, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acquireCalls++
	if f.holder != "" && !f.expires.IsZero() && !time.Now().Before(f.expires) {
		f.holder = "" // expired
	}
	if f.holder != "" && f.holder != value {
		left := ttl
		if !f.expires.IsZero() {
			left = time.Until(f.expires).Truncate(time.Millisecond)
		}
		return lease.Grant{Holder: f.holder, HolderTTL: left}, nil
	}
	if f.voided[value] {
		return lease.Grant{Holder: f.holder}, nil
	}
	f.holder, f.expires = value, time.Time{}
	f.token++
	return lease.Grant{Acquired: true, Token: f.token}, nil
}

func (f *fakeStore) Renew(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Renewal, error) {
	f.mu.Lock()
	dl, _ := ctx.Deadline()
	f.renews = append(f.renews, renewCall{sent: time.Now(), deadline: dl})
	f.noteAfterDone()
	mode := f.mode
	f.mu.Unlock()
	switch mode {
	case renewRefuse:
		return lease.Renewal{Holder: "other#1"}, nil
	case renewFail:
		return lease.Renewal{}, errors.New("connection refused")
	case renewHang:
		<-ctx.Done()
		return lease.Renewal{}, ctx.Err()
	case renewDeaf:
		time.Sleep(10 * ttl)
		return lease.Renewal{}, errors.New("i/o timeout")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return lease.Renewal{OK: f.holder == value, Holder: f.holder}, nil
}

// AcquireOrQueue is Acquire; the fake has no line: a waiter that is not
// granted is told it is first, and finds the lock free at a later call.
func (f *fakeStore) AcquireOrQueue(ctx context.Context, k lease.Keys, value string, ttl time.Duration, p lease.Place) (lease.Grant, error) {
	g, err := f.Acquire(ctx, k, value, ttl)
	if err != nil || g.Acquired {
		return g, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	g.Ticket, g.Fence = 1, f.token
	return g, nil
}

func (f *fakeStore) Release(ctx context.Context, k lease.Keys, value string) (lease.Release, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releases = append(f.releases, value)
	f.noteAfterDone()
	if f.holder == value {
		f.holder = ""
		return lease.Release{Deleted: true}, nil
	}
	return lease.Release{}, nil
}

// Cancel voids value, so that a later Acquire with it is refused, and
// releases it.
func (f *fakeStore) Cancel(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Release, error) {
	f.mu.Lock()
	if f.cancelErr != nil {
		err := f.cancelErr
		f.mu.Unlock()
		return lease.Release{}, err
	}
	if f.voided == nil {
		f.voided = make(map[string]bool)
	}
	f.voided[value] = true
	f.mu.Unlock()
	return f.Release(ctx, k, value)
}

// CancelDedicated is Cancel: the fake has no connections.
func (f *fakeStore) CancelDedicated(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Release, error) {
	return f.Cancel(ctx, k, value, ttl)
}

// Subscribe confirms at once and announces nothing.
func (f *fakeStore) Subscribe(ctx context.Context, k lease.Keys, room string, ready func(), granted func(string, int64)) error {
	ready()
	<-ctx.Done()
	return ctx.Err()
}

func (f *fakeStore) noteAfterDone() {
	if f.done == nil {
		return
	}
	select {
	case <-f.done:
		f.afterDone++
	default:
	}
}

func (f *fakeStore) set(mode renewMode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mode = mode
}

func (f *fakeStore) renewCalls() []renewCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]renewCall(nil), f.renews...)
}

const fakeTTL = 3 * time.Second

// bubble runs f in a synctest bubble whose last clean-up lets the
// keepers that its guards started go: time stops in a bubble once f has
// returned, so the keepers' linger must pass before.
func bubble(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		t.Cleanup(func() { time.Sleep(keeperLinger) })
		f(t)
	})
}

func fakeMutex(t *testing.T, f *fakeStore, opts ...Option) *Mutex {
	t.Helper()
	m, err := newMutex("job", append([]Option{WithTTL(fakeTTL)}, opts...))
	require.NoError(t, err)
	m.e.client, m.e.store = f, f
	return m
}

func drain(ch <-chan Event) []State {
	var got []State
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return got
			}
			got = append(got, ev.State)
		default:
			return got
		}
	}
}
