package distlock

import (
	"bytes"
	"context"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// goid returns the id of the calling goroutine, as runtime.Stack prints it.
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseInt(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// hasActor reports whether g's actor owns it now.
func (g *Guard) hasActor() bool {
	a := g.owner.Load()
	return a != nil && a != ending && a != retired
}

// goroutineStore is a fakeStore that records which goroutine sends each
// acquire and release.
type goroutineStore struct {
	*fakeStore
	mu       sync.Mutex
	acquires []int64
	releases []int64
}

func (s *goroutineStore) note(to *[]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	*to = append(*to, goid())
}

func (s *goroutineStore) Acquire(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Grant, error) {
	s.note(&s.acquires)
	return s.fakeStore.Acquire(ctx, k, value, ttl)
}

func (s *goroutineStore) AcquireOrQueue(ctx context.Context, k lease.Keys, value string, ttl time.Duration, p lease.Place) (lease.Grant, error) {
	s.note(&s.acquires)
	return s.fakeStore.AcquireOrQueue(ctx, k, value, ttl, p)
}

func (s *goroutineStore) Release(ctx context.Context, k lease.Keys, value string) (lease.Release, error) {
	s.note(&s.releases)
	return s.fakeStore.Release(ctx, k, value)
}

// The uncontended path: with a context that nothing can cancel, Lock and
// Release send their calls from the caller's goroutine and start no
// goroutine; with a cancellable one, only the acquire call runs in a
// goroutine of its own (rueidis does not watch ctx while it dials).
func TestUncontendedPathRunsOnTheCallersGoroutine(t *testing.T) {
	for _, cancellable := range []bool{false, true} {
		t.Run("cancellable="+strconv.FormatBool(cancellable), func(t *testing.T) {
			s := &goroutineStore{fakeStore: &fakeStore{}}
			m := fakeMutex(t, s.fakeStore)
			m.e.store = s
			ctx := context.Background()
			if cancellable {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
			}
			me := goid()
			for _, lock := range []func(context.Context) (*Guard, error){m.Lock, m.TryLock} {
				g, err := lock(ctx)
				require.NoError(t, err)
				assert.False(t, g.hasActor(), "a guard released before its first renewal has no actor")
				st, err := g.Release(context.WithoutCancel(ctx))
				require.NoError(t, err)
				require.Equal(t, Released, st)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			require.Len(t, s.acquires, 2)
			require.Len(t, s.releases, 2)
			for i := range 2 {
				if cancellable {
					assert.NotEqual(t, me, s.acquires[i], "acquire %d with a cancellable ctx", i)
				} else {
					assert.Equal(t, me, s.acquires[i], "acquire %d with a ctx that cannot end", i)
				}
				assert.Equal(t, me, s.releases[i], "release %d", i)
			}
		})
	}
}

// A Release with a context that can be cancelled sends the delete from
// another goroutine, so that the context bounds the wait (rueidis does not
// watch the cancellation of a command that has a deadline while nothing
// else uses its connection).
func TestReleaseWithCancellableContextWaitsOnAnotherGoroutine(t *testing.T) {
	s := &goroutineStore{fakeStore: &fakeStore{}}
	m := fakeMutex(t, s.fakeStore)
	m.e.store = s
	g, err := m.Lock(context.Background())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := g.Release(ctx)
	require.NoError(t, err)
	require.Equal(t, Released, st)
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Len(t, s.releases, 1)
	assert.NotEqual(t, goid(), s.releases[0])
}

// The actor starts when the first renewal is due, not before, and stays:
// a guard that lives on renews every TTL/3 from the same actor, which
// exits when the guard ends.
func TestActorStartsAtTheFirstRenewal(t *testing.T) {
	quietProcess(t)
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		g, err := fakeMutex(t, f).Lock(t.Context())
		require.NoError(t, err)
		time.Sleep(fakeTTL/3 - time.Nanosecond)
		synctest.Wait()
		assert.Zero(t, actorsRunning(), "just before the first renewal")
		assert.False(t, g.hasActor(), "just before the first renewal")
		assert.Empty(t, f.renewCalls())
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		first := g.owner.Load()
		for n := 1; n <= 3; n++ {
			assert.Len(t, f.renewCalls(), n, "renewals at %v", time.Duration(n)*fakeTTL/3)
			assert.True(t, g.hasActor(), "after renewal %d was confirmed", n)
			assert.Same(t, first, g.owner.Load(), "the same actor after renewal %d", n)
			assert.Equal(t, int64(1), actorsRunning(), "after renewal %d was confirmed", n)
			assert.Equal(t, Acquired, g.State())
			time.Sleep(fakeTTL/3 - time.Nanosecond)
			synctest.Wait()
			assert.Len(t, f.renewCalls(), n, "before renewal %d", n+1)
			time.Sleep(time.Nanosecond)
			synctest.Wait()
		}
		_, err = g.Release(t.Context())
		require.NoError(t, err)
		synctest.Wait()
		assert.Zero(t, actorsRunning(), "after Release")
	})
}

// A guard past its first renewal turns Lost at its deadline when a
// renewal gets no answer: its actor's deadline timer says so at D, not
// later.
func TestActorGuardIsLostAtItsDeadline(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		g, err := fakeMutex(t, f).Lock(t.Context())
		require.NoError(t, err)
		events := g.Subscribe(t.Context())
		time.Sleep(fakeTTL / 3)
		synctest.Wait()
		require.Len(t, f.renewCalls(), 1)
		require.True(t, g.hasActor(), "an actor from the first renewal on")
		f.set(renewHang)
		sent := f.renewCalls()[0].sent
		deadline := leaseDeadline(sent, fakeTTL)
		time.Sleep(time.Until(deadline) - time.Nanosecond)
		synctest.Wait()
		assert.Equal(t, []State{Acquired}, drain(events), "before D")
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		assert.Equal(t, []State{Lost}, drain(events), "at D")
		_, err = g.Release(context.WithoutCancel(t.Context()))
		require.NoError(t, err)
		synctest.Wait()
	})
}

// The client's keeper has every guard it watches renew at once: a young
// guard (its first renewal comes forward, from its new actor), and an
// actor that waits for its next renewal or retries a failed one.
func TestKeeperPokeRenewsAtOnce(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		g, err := fakeMutex(t, f).Lock(t.Context())
		require.NoError(t, err)
		require.NotNil(t, g.keeper, "watched from the acquisition on")
		time.Sleep(fakeTTL / 9)
		require.False(t, g.hasActor(), "young")
		g.keeper.renewAll()
		synctest.Wait()
		require.Len(t, f.renewCalls(), 1, "a poked young guard renews at once")
		assert.True(t, g.hasActor(), "from its actor")
		time.Sleep(fakeTTL/3 - time.Nanosecond)
		synctest.Wait()
		require.Len(t, f.renewCalls(), 1, "the next renewal a third of a TTL after the first")
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		require.Len(t, f.renewCalls(), 2)
		time.Sleep(fakeTTL / 9)
		g.keeper.renewAll()
		synctest.Wait()
		assert.Len(t, f.renewCalls(), 3, "a poked guard renews at once")

		// A poke while a renewal that failed waits for its retry.
		f.set(renewFail)
		time.Sleep(fakeTTL / 3)
		synctest.Wait()
		require.Len(t, f.renewCalls(), 4)
		f.set(renewOK)
		g.keeper.renewAll()
		synctest.Wait()
		assert.Len(t, f.renewCalls(), 5, "a poked guard renews at once while it retries")
		assert.True(t, g.hasActor(), "the actor stays")

		_, err = g.Release(t.Context())
		require.NoError(t, err)
		synctest.Wait()
	})
}

// The Lock context's end releases a guard that has no actor yet, from the
// watch's own goroutine.
func TestLockContextEndReleasesAnIdleGuard(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		ctx, cancel := context.WithCancelCause(t.Context())
		g, err := fakeMutex(t, f).Lock(ctx)
		require.NoError(t, err)
		events := g.Subscribe(t.Context())
		require.Equal(t, Acquired, (<-events).State)
		cancel(errTestDone)
		<-g.Done()
		assert.Equal(t, Released, g.State())
		assert.Equal(t, []State{Released}, drain(events))
		assert.ErrorIs(t, context.Cause(g.Context()), errTestDone)
		f.mu.Lock()
		defer f.mu.Unlock()
		assert.Len(t, f.releases, 1)
		assert.Empty(t, f.holder)
	})
}

var errTestDone = testError("the job is done")

type testError string

func (e testError) Error() string { return string(e) }

// The worker's pair costs few allocations on distlock's side (the fake
// store allocates next to nothing): a new Mutex, Lock and Release with a
// context that cannot be cancelled. The figure with real Redis (rueidis's
// command and reply included) is in BenchmarkUncontended.
func TestUncontendedPairAllocations(t *testing.T) {
	f := &fakeStore{}
	pair := func(ctx context.Context) func() {
		return func() {
			m, err := newMutex("job", nil)
			if err != nil {
				t.Fatal(err)
			}
			m.e.client, m.e.store = f, f
			g, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := g.Release(context.WithoutCancel(ctx)); err != nil {
				t.Fatal(err)
			}
		}
	}
	allocs := testing.AllocsPerRun(200, pair(context.Background()))
	t.Logf("%.1f allocations per pair", allocs)
	// A Mutex (with its options and keys), a value, the acquire's and the
	// release's deadlines (a context and a timer each), a guard with its
	// first-renewal timer (its Done channel is made only when someone
	// waits for it, and a Release that ends a young guard itself does
	// not): 17.
	assert.LessOrEqual(t, allocs, 17.0)

	// With a cancellable context, the acquire call runs in a goroutine of
	// the process's background work (its closure, its result channel, the
	// wait's select) and the guard watches the Lock context: 6 more, as
	// before the guard became an actor.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	allocs = testing.AllocsPerRun(200, pair(ctx))
	t.Logf("%.1f allocations per pair with a cancellable context", allocs)
	assert.LessOrEqual(t, allocs, 24.0)
}

// records is a slog handler that keeps the records it is given.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// at returns the records of level and message.
func (r *records) at(level slog.Level, message string) []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []slog.Record
	for _, rec := range r.recs {
		if rec.Level == level && strings.Contains(rec.Message, message) {
			out = append(out, rec)
		}
	}
	return out
}

// A Lock context whose deadline ends the hold (a timeout meant for the wait,
// as other libraries take it) releases the lock, and says so at Warn, with
// how long the lock was held; a cancellation does not.
func TestLockContextDeadlineIsLoggedAtWarn(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		log := &records{}
		m := fakeMutex(t, f, WithLogger(slog.New(log)))
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		g, err := m.Lock(ctx)
		require.NoError(t, err)
		<-g.Done()
		assert.Equal(t, Released, g.State())
		warns := log.at(slog.LevelWarn, "deadline of the context given to Lock")
		require.Len(t, warns, 1)
		var held time.Duration
		warns[0].Attrs(func(a slog.Attr) bool {
			if a.Key == "held" {
				held = a.Value.Duration()
			}
			return true
		})
		assert.Equal(t, 2*time.Second, held)

		ctx, cancel = context.WithCancel(t.Context())
		g, err = m.Lock(ctx)
		require.NoError(t, err)
		cancel()
		<-g.Done()
		assert.Len(t, log.at(slog.LevelWarn, "deadline of the context given to Lock"), 1, "a cancellation is not a deadline")
	})
}

// The calls that end a guard race its first-renewal timer, which would make
// it an actor: whichever claims the guard first owns it, the other finds it
// taken, and every guard ends exactly once, with one delete, leaving no
// goroutine. Run under -race, this also checks that no two goroutines ever
// touch the guard's state at once.
func TestEndRacesTheFirstRenewal(t *testing.T) {
	const ttl = 150 * time.Millisecond // first renewal at 50 ms
	const guards = 200
	type held struct {
		g *Guard
		f *fakeStore
	}
	hs := make([]held, guards)
	for i := range hs {
		f := &fakeStore{}
		m, err := newMutex("job", []Option{WithTTL(ttl)})
		require.NoError(t, err)
		m.e.client, m.e.store = f, f
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		g, err := m.Lock(ctx)
		require.NoError(t, err)
		hs[i] = held{g, f}
		if i%4 == 3 {
			// Some end by their Lock context, from the watch's goroutine.
			time.AfterFunc(renewAfter(ttl)-time.Duration(i%7)*time.Millisecond, cancel)
		}
	}
	// The others end by Release and Leave, from around the first renewal
	// on, while their timers fire.
	var wg sync.WaitGroup
	for i, h := range hs {
		wg.Go(func() {
			time.Sleep(renewAfter(ttl) - 3*time.Millisecond + time.Duration(i%7)*time.Millisecond)
			end := h.g.Release
			if i%4 == 1 {
				end = h.g.Leave
			}
			ctx := context.Background()
			if i%2 == 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Minute) // a context that can end
				defer cancel()
			}
			_, err := end(ctx)
			assert.NoError(t, err)
			_, err = h.g.Release(context.Background()) // a second end waits for the first
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	for i, h := range hs {
		<-h.g.Done()
		assert.Equal(t, Released, h.g.State(), "guard %d", i)
		h.f.mu.Lock()
		deletes := len(h.f.releases)
		h.f.mu.Unlock()
		if i%4 == 1 {
			assert.LessOrEqual(t, deletes, 1, "guard %d: left, or released by its context first", i)
		} else {
			assert.Equal(t, 1, deletes, "guard %d: deletes", i)
		}
	}
	assert.Eventually(t, func() bool { return actorsRunning() == 0 }, 5*time.Second, 10*time.Millisecond,
		"actors left after every guard ended")
}
