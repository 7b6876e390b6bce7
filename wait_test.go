package distlock

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// Tests of the local wait queue against the fake store, in a synctest bubble.

func (f *fakeStore) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.acquireCalls
}

// holdBy makes someone outside this process hold the lock until expires
// (zero: forever).
func (f *fakeStore) holdBy(value string, expires time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holder, f.expires = value, expires
}

// releaseBy releases the lock as its outside holder would, announcing it.
func (f *fakeStore) releaseBy(t *testing.T, value string) {
	ok, err := f.Release(context.Background(), fakeKeys(t), value)
	require.NoError(t, err)
	require.True(t, ok)
}

func fakeKeys(t *testing.T) lease.Keys {
	m, err := newMutex("job", nil)
	require.NoError(t, err)
	return m.keys
}

// lockAsync runs Lock in a goroutine and returns where its result arrives.
func lockAsync(ctx context.Context, m *Mutex, wg *sync.WaitGroup) <-chan *Guard {
	ch := make(chan *Guard, 1)
	wg.Go(func() {
		g, err := m.Lock(ctx)
		if err != nil {
			g = nil
		}
		ch <- g
	})
	return ch
}

// settle lets idle queues close and unsubscribe, so that the bubble ends
// with no goroutine left.
func settle() {
	time.Sleep(queueLinger + time.Millisecond)
	synctest.Wait()
}

func TestQueueHandsOverInOrderWithoutPolling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		defer settle()
		f := &fakeStore{}
		f.holdBy("remote#1", time.Time{})
		var wg sync.WaitGroup
		var got []<-chan *Guard
		for range 3 {
			got = append(got, lockAsync(t.Context(), fakeMutex(t, f), &wg))
			synctest.Wait() // queue in a known order
		}
		// Only the first waiter asked Redis: once on arrival, once as head.
		assert.Equal(t, 2, f.calls(), "attempts while the lock is held")
		// While the holder keeps renewing, the head only re-checks when the
		// lease it saw would have run out (the fake reports a full TTL).
		time.Sleep(10 * time.Second)
		synctest.Wait()
		assert.Equal(t, 2+3, f.calls(), "re-checks at 3s, 6s and 9s")

		f.releaseBy(t, "remote#1")
		synctest.Wait()
		g1 := <-got[0]
		require.NotNil(t, g1, "the head acquires at the release")
		assert.Equal(t, 6, f.calls())
		// The next waiter knows a local guard holds the lock and does not ask.
		select {
		case <-got[1]:
			t.Fatal("second waiter acquired while the first holds the lock")
		default:
		}

		synctest.Wait() // the next head has posted its offer
		_, err := g1.Release(t.Context())
		require.NoError(t, err)
		g2 := <-got[1]
		require.NotNil(t, g2)
		assert.Equal(t, 0, g2.Attempt(), "handed over: the hand-off is its first attempt")
		assert.Greater(t, g2.Token(), g1.Token())
		synctest.Wait()
		_, err = g2.Release(t.Context())
		require.NoError(t, err)
		g3 := <-got[2]
		require.NotNil(t, g3)
		_, err = g3.Release(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 6, f.calls(), "the releases handed the lock over: no attempt of their own")
		assert.Equal(t, 2, f.handoffs)
		wg.Wait()

		// The idle queue unsubscribes after it lingers.
		time.Sleep(queueLinger + time.Millisecond)
		synctest.Wait()
		f.mu.Lock()
		assert.Empty(t, f.subs, "subscription left behind")
		assert.Equal(t, 1, f.subCalls)
		f.mu.Unlock()
		k := queueKey{client: f, lease: "distlock:{job}"}
		assert.Nil(t, queuesFor(k).lookup(k))
	})
}

func TestQueueWakesWhenCrashedHolderExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		defer settle()
		f := &fakeStore{}
		start := time.Now()
		f.holdBy("crashed#1", start.Add(2500*time.Millisecond)) // never released
		g, err := fakeMutex(t, f).Lock(t.Context())
		require.NoError(t, err)
		waited := time.Since(start)
		assert.GreaterOrEqual(t, waited, 2500*time.Millisecond)
		assert.LessOrEqual(t, waited, 2500*time.Millisecond+expiryGrace, "woke at the expiry, not a poll later")
		// Arrival, head, then the attempt just after the expiry.
		assert.Equal(t, 3, f.calls())
		_, err = g.Release(t.Context())
		require.NoError(t, err)
	})
}

func TestQueueIgnoresStaleAnnouncements(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		defer settle()
		f := &fakeStore{}
		f.holdBy("remote#2", time.Time{})
		var wg sync.WaitGroup
		got := lockAsync(t.Context(), fakeMutex(t, f), &wg)
		synctest.Wait()
		calls := f.calls()
		// An old holder's release, announced late, does not wake the head.
		f.mu.Lock()
		for ch := range f.subs {
			ch <- "remote#1"
		}
		f.mu.Unlock()
		synctest.Wait()
		assert.Equal(t, calls, f.calls())
		f.releaseBy(t, "remote#2")
		g := <-got
		require.NotNil(t, g)
		_, err := g.Release(t.Context())
		require.NoError(t, err)
		wg.Wait()
	})
}

func TestQueueCancelledWaiterLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		defer settle()
		f := &fakeStore{}
		f.holdBy("remote#1", time.Time{})
		var wg sync.WaitGroup
		first := lockAsync(t.Context(), fakeMutex(t, f), &wg)
		synctest.Wait()
		ctx, cancel := context.WithCancel(t.Context())
		middle := lockAsync(ctx, fakeMutex(t, f), &wg)
		synctest.Wait()
		last := lockAsync(t.Context(), fakeMutex(t, f), &wg)
		synctest.Wait()
		cancel()
		assert.Nil(t, <-middle, "a cancelled waiter gets an error")

		f.releaseBy(t, "remote#1")
		g1 := <-first
		require.NotNil(t, g1)
		_, err := g1.Release(t.Context())
		require.NoError(t, err)
		g3 := <-last
		require.NotNil(t, g3)
		_, err = g3.Release(t.Context())
		require.NoError(t, err)
		wg.Wait()
	})
}

func TestQueueMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		defer settle()
		f := &fakeStore{}
		f.holdBy("remote#1", time.Time{})
		start := time.Now()
		_, err := fakeMutex(t, f, WithMaxWait(1500*time.Millisecond)).Lock(t.Context())
		var te *TimeoutError
		require.ErrorAs(t, err, &te)
		assert.Equal(t, 1500*time.Millisecond, time.Since(start))
		assert.Equal(t, 1500*time.Millisecond, te.Waited)
	})
}

func TestQueueHandoffToACancelledWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		defer settle()
		f := &fakeStore{}
		g1, err := fakeMutex(t, f).Lock(t.Context())
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		got := make(chan error, 1)
		wg.Go(func() {
			_, err := fakeMutex(t, f).Lock(ctx)
			got <- err
		})
		synctest.Wait() // the waiter is the head and has posted its offer
		// The waiter gives up while the lock is being handed to it: it must
		// not come back with a guard, and must not leave the lease behind.
		f.onHandoff = cancel
		_, err = g1.Release(t.Context())
		require.NoError(t, err)
		require.ErrorIs(t, <-got, context.Canceled)
		wg.Wait()
		assert.Equal(t, 1, f.handoffs)
		assert.Empty(t, f.holder, "the handed-over lease was left behind")
	})
}

func TestGrantedAfterTheCallerGaveUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{}
		m := fakeMutex(t, f)
		ctx, cancel := context.WithCancel(t.Context())
		a := &acquirer{m: m, ctx: ctx, value: "me#1", start: time.Now()}
		f.holdBy(a.value, time.Time{}) // granted, by an attempt or a hand-off
		cancel()
		g, err := a.granted(1, time.Now())
		assert.Nil(t, g)
		require.ErrorIs(t, err, context.Canceled)
		assert.Empty(t, f.holder, "the granted lease was left behind")
		assert.True(t, f.voided[a.value])

		// A grant that arrives after its lease deadline is not trusted.
		a = &acquirer{m: m, ctx: t.Context(), value: "me#2", start: time.Now()}
		sent := time.Now()
		time.Sleep(fakeTTL)
		g, err = a.granted(2, sent)
		assert.Nil(t, g)
		assert.NoError(t, err)
	})
}

func TestQueueAfterAHandoffIsGivenBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		defer settle()
		f := &fakeStore{}
		g0, err := fakeMutex(t, f).Lock(t.Context())
		require.NoError(t, err)
		var wg sync.WaitGroup
		first := lockAsync(t.Context(), fakeMutex(t, f), &wg)
		synctest.Wait()
		ctx, cancel := context.WithCancel(t.Context())
		gaveUp := make(chan error, 1)
		wg.Go(func() {
			_, err := fakeMutex(t, f).Lock(ctx)
			gaveUp <- err
		})
		synctest.Wait()
		// Bounded, so that a wait for a release that never comes fails
		// the test instead of hanging it.
		third := lockAsync(t.Context(), fakeMutex(t, f, WithMaxWait(time.Second)), &wg)
		synctest.Wait()

		// g0 hands the lock to the first waiter, which the queue then
		// knows as the local holder.
		_, err = g0.Release(t.Context())
		require.NoError(t, err)
		g1 := <-first
		require.NotNil(t, g1)
		synctest.Wait()

		// g1 hands it to the second, which has given up by then: it
		// deletes the lease again. The third must not wait for g1's release,
		// which a hand-off never announces, but take the lock at once.
		f.onHandoff = cancel
		start := time.Now()
		_, err = g1.Release(t.Context())
		require.NoError(t, err)
		require.ErrorIs(t, <-gaveUp, context.Canceled)
		g3 := <-third
		require.NotNil(t, g3)
		assert.Zero(t, time.Since(start), "the third waiter waited out a lease")
		_, err = g3.Release(t.Context())
		require.NoError(t, err)
		wg.Wait()
	})
}
