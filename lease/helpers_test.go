package lease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// Set-up and checks shared by the tests of the line, the semaphore and the
// election.

// waitersIn returns a waiter for each of names, all in room with the claim
// window liveClaim.
func waitersIn(room string, names ...string) []*waiter {
	ws := make([]*waiter, len(names))
	for i, name := range names {
		ws[i] = newWaiter(name, room, liveClaim)
	}
	return ws
}

// lineUp has each of ws stand in line behind holder, in that order, and
// checks the rank each one gets.
func (e *env) lineUp(t *testing.T, k lease.Keys, holder string, ws ...*waiter) {
	t.Helper()
	for i, w := range ws {
		e.mustQueue(t, k, w, holder, i)
	}
}

// heldWithLine has a new value x acquire k, and then waiters of names (in
// room "room", claim window liveClaim) stand in line behind x in that
// order. It returns x and the waiters.
func (e *env) heldWithLine(t *testing.T, k lease.Keys, names ...string) (string, []*waiter) {
	t.Helper()
	x := lease.NewValue("x")
	e.mustAcquire(t, k, x)
	ws := waitersIn("room", names...)
	e.lineUp(t, k, x, ws...)
	return x, ws
}

// freeWithLine is heldWithLine after which x's lease runs out (it is
// deleted): the lock is free with waiters in line. It returns the waiters.
func (e *env) freeWithLine(t *testing.T, k lease.Keys, names ...string) []*waiter {
	t.Helper()
	_, ws := e.heldWithLine(t, k, names...)
	e.srv.MustDo("DEL", k.Lease)
	return ws
}

// cancel calls Cancel for value (voiding it for queueTTL) and fails the
// test on an error.
func (e *env) cancel(t *testing.T, k lease.Keys, value string) lease.Release {
	t.Helper()
	r, err := e.lc.Cancel(ctxFor(t), k, value, queueTTL)
	require.NoError(t, err, "Cancel(%q)", value)
	return r
}

// releaseAll calls Release for value and returns all it reports, whether or
// not it deleted anything; it fails the test on an error.
func (e *env) releaseAll(t *testing.T, k lease.Keys, value string) lease.Release {
	t.Helper()
	r, err := e.lc.Release(ctxFor(t), k, value)
	require.NoError(t, err, "Release(%q)", value)
	return r
}

// assertAnnounced checks that the next announcement heard on channel is
// want.
func assertAnnounced(t *testing.T, heard <-chan announcement, channel string, want announcement, msgAndArgs ...any) {
	t.Helper()
	assert.Equal(t, want, nextAnnouncement(t, heard, channel), msgAndArgs...)
}

// listen runs sub until the test ends, and returns what it hears. sub is
// Subscribe or SubscribeLeader with its ctx, its ready callback and its
// message callback; name says which subscription it is in failures. listen
// returns once the subscription is confirmed.
func listen(t *testing.T, name string, sub func(ctx context.Context, ready func(), heard func(value string, token int64)) error) <-chan announcement {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	// A test hears a handful of announcements; the buffer keeps the
	// subscriber from waiting on the test, and a full buffer fails the test.
	heard := make(chan announcement, 16)
	ready := make(chan struct{})
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		var once sync.Once
		err = sub(ctx, func() { once.Do(func() { close(ready) }) }, func(value string, token int64) {
			select {
			case heard <- announcement{value, token}:
			default:
				t.Errorf("%s: more announcements than the test reads; dropped (%q, %d)", name, value, token)
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		assert.ErrorIs(t, err, context.Canceled, "%s ended with another error", name)
	})
	select {
	case <-ready:
	case <-done:
		t.Fatalf("%s ended before it was ready: %v", name, err)
	case <-time.After(readyWait):
		t.Fatalf("%s not confirmed within %v", name, readyWait)
	}
	return heard
}
