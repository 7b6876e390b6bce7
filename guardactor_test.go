package distlock

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

func TestRenewsEveryThirdOfTTL(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		g, err := fakeMutex(t, f).Lock(t.Context())
		require.NoError(t, err)
		start := time.Now()

		time.Sleep(10*fakeTTL/3 + time.Millisecond)
		calls := f.renewCalls()
		require.Len(t, calls, 10)
		for i, c := range calls {
			assert.Equal(t, time.Duration(i+1)*fakeTTL/3, c.sent.Sub(start), "renewal %d", i)
			// L1: no call for a held lock outlives the deadline, which is
			// counted from the previous confirmed send.
			wantD := c.sent.Add(-fakeTTL / 3).Add(fakeTTL - margin(fakeTTL))
			assert.Equal(t, wantD, c.deadline, "deadline of renewal %d", i)
		}
		assert.Equal(t, Acquired, g.State())
		st, err := g.Release(t.Context())
		require.NoError(t, err)
		assert.Equal(t, Released, st)
	})
}

// heldAndWatched locks a Mutex of f with opts and subscribes to the guard:
// it returns the guard, the time of the acquisition, and the events after
// the first (Acquired), which it has read.
func heldAndWatched(t *testing.T, f *fakeStore, opts ...Option) (*Guard, time.Time, <-chan Event) {
	t.Helper()
	g, err := fakeMutex(t, f, opts...).Lock(t.Context())
	require.NoError(t, err)
	start := time.Now()
	events := g.Subscribe(t.Context())
	require.Equal(t, Acquired, (<-events).State)
	return g, start, events
}

func TestLostExactlyAtDeadlineWhileRenewalHangs(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{mode: renewHang}
		g, start, events := heldAndWatched(t, f)

		d := start.Add(fakeTTL - margin(fakeTTL))
		time.Sleep(time.Until(d) - time.Nanosecond)
		assert.Equal(t, Acquired, g.State(), "just before D")
		time.Sleep(time.Nanosecond)
		// State checks the clock itself, whatever the timers did.
		assert.Equal(t, Lost, g.State(), "at D")
		ev := <-events
		assert.Equal(t, Lost, ev.State)
		assert.Equal(t, d, ev.Time, "Lost published at D")
		var le *LostError
		require.ErrorAs(t, ev.Err, &le)
		assert.Equal(t, LostDeadline, le.Reason)
		assert.True(t, ev.Time.Before(start.Add(fakeTTL)), "Lost must come before Redis can expire the key")
		assert.ErrorIs(t, context.Cause(g.Context()), ErrLost)

		st, err := g.Release(t.Context())
		require.NoError(t, err)
		assert.Equal(t, Lost, st)
	})
}

// L1 with a client that does not end a call at its deadline: the guard is
// Lost at D all the same, its event and context with it, and not when the
// renewal finally returns.
func TestLostAtDeadlineWhileRenewalIgnoresItsDeadline(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{mode: renewDeaf}
		g, start, events := heldAndWatched(t, f)

		d := start.Add(fakeTTL - margin(fakeTTL))
		ev := <-events
		assert.Equal(t, Lost, ev.State)
		assert.Equal(t, d, ev.Time, "Lost published at D, with the renewal still in flight")
		assert.Equal(t, d, time.Now(), "the event came at D")
		var le *LostError
		require.ErrorAs(t, ev.Err, &le)
		assert.Equal(t, LostDeadline, le.Reason)
		assert.ErrorIs(t, context.Cause(g.Context()), ErrLost)

		// The end waits for the renewal that the client still holds:
		// Release gives up after its bound, the end follows when the call
		// returns.
		_, err := g.Release(t.Context())
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		<-g.Done()
		assert.Equal(t, Released, g.State())
	})
}

// L1b: a renewal that fails without telling anything about the lease is
// reported and retried; the guard stays Acquired, and its context alive,
// while its deadline holds.
func TestFailedRenewalIsRetriedWhileTheLeaseHolds(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		obs := &recorder{}
		g, start, events := heldAndWatched(t, f, WithObserver(obs))

		f.set(renewFail)
		time.Sleep(fakeTTL/3 + 100*time.Millisecond)
		synctest.Wait()
		assert.Equal(t, Acquired, g.State(), "a failed renewal proves nothing: the lease still holds")
		assert.NoError(t, g.Context().Err())
		ev := <-events
		assert.Equal(t, Acquired, ev.State)
		var re *RenewError
		require.ErrorAs(t, ev.Err, &re)
		assert.ErrorIs(t, ev.Err, ErrRenewFailed)
		assert.EqualError(t, errors.Unwrap(re), "connection refused")
		assert.Equal(t, start.Add(fakeTTL-margin(fakeTTL)), re.Deadline)
		assert.Positive(t, re.Retry)
		calls := f.renewCalls()
		require.Greater(t, len(calls), 2, "retried promptly")
		for i, c := range calls {
			assert.Equal(t, start.Add(fakeTTL-margin(fakeTTL)), c.deadline, "L1: retry %d is bounded by D", i)
		}
		for i := 2; i < len(calls); i++ {
			assert.GreaterOrEqual(t, calls[i].sent.Sub(calls[i-1].sent), calls[i-1].sent.Sub(calls[i-2].sent)/2,
				"the pauses grow (with jitter)")
		}
		obs.mu.Lock()
		failed := 0
		for _, r := range obs.renews {
			if r.Err != nil {
				failed++
			}
		}
		obs.mu.Unlock()
		assert.Equal(t, len(calls), failed, "the Observer hears of every failed renewal")

		// The path heals: the next retry confirms, and the deadline moves on.
		f.set(renewOK)
		time.Sleep(fakeTTL / 9)
		synctest.Wait()
		assert.Equal(t, Acquired, g.State())
		assert.True(t, LeaseDeadline(g).After(start.Add(fakeTTL-margin(fakeTTL))), "the deadline moved on")
		assert.NoError(t, g.Context().Err(), "the context never went")
		for _, st := range drain(events) {
			assert.Equal(t, Acquired, st, "no Lost in between")
		}
		_, err := g.Release(t.Context())
		require.NoError(t, err)
	})
}

// L1b: renewals that keep failing lose the lease at the deadline, with the
// last failure as the reason; a renewal that later proves the key still
// holds this acquisition's value regains it.
func TestFailingRenewalsLoseAtTheDeadlineThenRegain(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		g, start, events := heldAndWatched(t, f)

		f.set(renewFail)
		d := start.Add(fakeTTL - margin(fakeTTL))
		time.Sleep(time.Until(d) - time.Nanosecond)
		synctest.Wait()
		assert.Equal(t, Acquired, g.State(), "just before D")
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		assert.Equal(t, Lost, g.State(), "at D")
		var lost Event
		for ev := range events {
			if ev.State == Lost {
				lost = ev
				break
			}
			assert.ErrorIs(t, ev.Err, ErrRenewFailed, "before D, only reports of failed renewals")
		}
		assert.Equal(t, d, lost.Time, "Lost published at D")
		var le *LostError
		require.ErrorAs(t, lost.Err, &le)
		assert.Equal(t, LostRenewFailed, le.Reason)
		assert.EqualError(t, errors.Unwrap(le), "connection refused")
		assert.ErrorIs(t, context.Cause(g.Context()), ErrLost)
		for _, c := range f.renewCalls() {
			assert.False(t, c.sent.After(d), "no retry is sent for the held lease after D")
		}

		// A Lost guard keeps trying every TTL/9; the next try succeeds.
		f.set(renewOK)
		time.Sleep(fakeTTL / 9)
		synctest.Wait()
		assert.Equal(t, Acquired, g.State())
		ev := <-events
		assert.Equal(t, Acquired, ev.State)
		assert.NoError(t, ev.Err)
		assert.ErrorIs(t, context.Cause(g.Context()), ErrLost, "the context stays cancelled")
		_, err := g.Release(t.Context())
		require.NoError(t, err)
	})
}

// A refused renewal is a final loss (L4: the key holds another value or
// none, so the lease can never come back): the guard is Lost, its actor
// exits and sends nothing more, and Release then returns Lost at once
// without sending anything.
func TestRefusedRenewal(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{mode: renewRefuse}
		g, err := fakeMutex(t, f).Lock(t.Context())
		require.NoError(t, err)
		time.Sleep(fakeTTL/3 + time.Millisecond)
		synctest.Wait()
		assert.Equal(t, Lost, g.State())
		var le *LostError
		require.ErrorAs(t, context.Cause(g.Context()), &le)
		assert.Equal(t, LostRefused, le.Reason)
		assert.Equal(t, "other#1", le.Holder, "not a distlock value, so shown whole")
		assert.False(t, g.hasActor(), "the actor exits after a final loss")
		time.Sleep(10 * fakeTTL)
		synctest.Wait()
		assert.Len(t, f.renewCalls(), 1, "a guard whose renewal was refused renews no more")
		assert.Equal(t, Lost, g.State())
		st, err := g.Release(t.Context())
		require.NoError(t, err)
		assert.Equal(t, Lost, st)
		f.mu.Lock()
		defer f.mu.Unlock()
		assert.Empty(t, f.releases, "nothing is left in Redis to delete")
	})
}

func TestReleaseWaitsForRenewalAndThenGoesQuiet(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{mode: renewHang}
		g, err := fakeMutex(t, f).Lock(t.Context())
		require.NoError(t, err)
		f.mu.Lock()
		f.done = g.Done()
		f.mu.Unlock()
		time.Sleep(fakeTTL/3 + time.Millisecond) // a renewal is now hanging
		synctest.Wait()
		require.Len(t, f.renewCalls(), 1)

		st, err := g.Release(t.Context())
		require.NoError(t, err)
		assert.Equal(t, Released, st)
		assert.Len(t, f.releases, 1)
		time.Sleep(10 * fakeTTL)
		assert.Zero(t, f.afterDone, "a command reached the store after Release returned")
		assert.Len(t, f.renewCalls(), 1)
	})
}

func TestLockContextCancelReleases(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		ctx, cancel := context.WithCancel(t.Context())
		g, err := fakeMutex(t, f).Lock(ctx)
		require.NoError(t, err)
		cancel()
		<-g.Done()
		assert.Equal(t, Released, g.State())
		assert.Empty(t, f.holder)
		assert.ErrorIs(t, g.Context().Err(), context.Canceled)
	})
}

func TestSlowSubscriberSeesNewestState(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		g, err := fakeMutex(t, f).Lock(t.Context())
		require.NoError(t, err)
		slow := g.Subscribe(t.Context()) // read only at the end
		// Flap five times: renewals fail until the deadline (each failure
		// reported as an Acquired event with a RenewError), the guard is
		// Lost, then a renewal finds the key still ours and regains it.
		// That is far more events than the buffer holds.
		for range 5 {
			f.set(renewFail)
			time.Sleep(fakeTTL)
			synctest.Wait()
			require.Equal(t, Lost, g.State())
			f.set(renewOK)
			time.Sleep(fakeTTL / 9)
			synctest.Wait()
			require.Equal(t, Acquired, g.State())
		}
		_, err = g.Release(t.Context())
		require.NoError(t, err)
		got := drain(slow)
		require.Len(t, got, subscriberBuffer)
		assert.Equal(t, Released, got[len(got)-1], "Released is always delivered")
		// The newest four: the last failure's report, the loss, the regain
		// and the end.
		assert.Equal(t, []State{Acquired, Lost, Acquired, Released}, got)
	})
}

func TestLockRetriesAndTimesOut(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{holder: "someone#1"}
		m := fakeMutex(t, f, WithRetryInterval(100*time.Millisecond), WithMaxWait(time.Second))
		start := time.Now()
		_, err := m.Lock(t.Context())
		var te *TimeoutError
		require.ErrorAs(t, err, &te)
		assert.Equal(t, time.Second, te.Waited)
		assert.Equal(t, time.Second, time.Since(start))
		assert.Equal(t, 11, te.Attempts, "at 0, 100ms, ..., 1s")

		// Freed half-way: acquired on the attempt after.
		time.AfterFunc(450*time.Millisecond, func() {
			f.mu.Lock()
			f.holder = ""
			f.mu.Unlock()
		})
		g, err := m.Lock(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 5, g.Attempt())
		_, err = g.Release(t.Context())
		require.NoError(t, err)
	})
}

func TestLostReplyIsCleanedUp(t *testing.T) {
	bubble(t, func(t *testing.T) {
		// The script runs but its reply never arrives: Acquire writes the
		// lease, then reports the connection dropped.
		f := &fakeStore{}
		m := fakeMutex(t, f)
		lostReply := errors.New("read: connection reset by peer")
		var value string
		m.e.store = &replyLosingStore{fakeStore: f, err: lostReply, written: &value}
		_, err := m.Lock(t.Context())
		require.ErrorIs(t, err, lostReply)
		require.NotEmpty(t, value)
		synctest.Wait() // the clean-up runs in the background
		assert.Equal(t, []string{value}, f.releases, "Lock must delete what the lost attempt wrote")
		assert.Empty(t, f.holder)
	})
}

// replyLosingStore applies Acquire but reports an error instead of its reply.
type replyLosingStore struct {
	*fakeStore
	err     error
	written *string
}

func (s *replyLosingStore) Acquire(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Grant, error) {
	if _, err := s.fakeStore.Acquire(ctx, k, value, ttl); err != nil {
		return lease.Grant{}, err
	}
	*s.written = value
	return lease.Grant{}, s.err
}

func (s *replyLosingStore) AcquireOrQueue(ctx context.Context, k lease.Keys, value string, ttl time.Duration, p lease.Place) (lease.Grant, error) {
	return s.Acquire(ctx, k, value, ttl)
}

func TestNewMutexDefaults(t *testing.T) {
	m, err := newMutex("k", nil)
	require.NoError(t, err)
	assert.Equal(t, DefaultTTL, m.e.ttl)
	assert.Equal(t, DefaultRetryInterval, m.e.retryInterval)
	assert.Zero(t, m.e.maxWait)
	host, _ := os.Hostname()
	assert.Equal(t, host+":"+strconv.Itoa(os.Getpid()), m.e.owner, "host:pid")
	m3, err := newMutex("k", []Option{WithTTL(1500*time.Millisecond + 700*time.Microsecond), WithLogger(slog.Default())})
	require.NoError(t, err)
	assert.Equal(t, 1500*time.Millisecond, m3.e.ttl, "TTL counts whole milliseconds")
}

// recorder is an Observer that keeps everything it is told.
type recorder struct {
	mu          sync.Mutex
	acquires    []AcquireInfo
	renews      []RenewInfo
	transitions []TransitionInfo
}

func (r *recorder) ObserveAcquire(i AcquireInfo) {
	r.mu.Lock()
	r.acquires = append(r.acquires, i)
	r.mu.Unlock()
}
func (r *recorder) ObserveRenew(i RenewInfo) {
	r.mu.Lock()
	r.renews = append(r.renews, i)
	r.mu.Unlock()
}
func (r *recorder) ObserveTransition(i TransitionInfo) {
	r.mu.Lock()
	r.transitions = append(r.transitions, i)
	r.mu.Unlock()
}

func TestObserver(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{holder: "other#1"}
		rec := &recorder{}
		m := fakeMutex(t, f, WithObserver(rec), WithRetryInterval(100*time.Millisecond))
		_, err := m.TryLock(t.Context())
		require.ErrorIs(t, err, ErrNotAcquired)

		time.AfterFunc(250*time.Millisecond, func() { f.mu.Lock(); f.holder = ""; f.mu.Unlock() })
		g, err := m.Lock(t.Context())
		require.NoError(t, err)
		time.Sleep(fakeTTL/3 + time.Millisecond) // one good renewal
		f.set(renewFail)
		time.Sleep(fakeTTL / 3) // one failed renewal: Lost
		synctest.Wait()
		time.Sleep(10 * time.Second)
		_, err = g.Release(t.Context())
		require.NoError(t, err)

		require.Len(t, rec.acquires, 2)
		assert.ErrorIs(t, rec.acquires[0].Err, ErrNotAcquired)
		assert.Equal(t, 1, rec.acquires[0].Attempts)
		assert.NoError(t, rec.acquires[1].Err)
		assert.Equal(t, 4, rec.acquires[1].Attempts, "at 0, 100, 200 and 300ms")
		assert.Equal(t, 300*time.Millisecond, rec.acquires[1].Wait)
		assert.Equal(t, g.Token(), rec.acquires[1].Token)

		require.GreaterOrEqual(t, len(rec.renews), 2)
		assert.NoError(t, rec.renews[0].Err)
		assert.Error(t, rec.renews[1].Err)

		var got []string
		for _, tr := range rec.transitions {
			got = append(got, tr.From.String()+">"+tr.To.String())
		}
		assert.Equal(t, []string{"acquired>lost", "lost>released"}, got)
		last := rec.transitions[len(rec.transitions)-1]
		assert.Equal(t, fakeTTL/3+time.Millisecond+fakeTTL/3+10*time.Second, last.Held)
		var le *LostError
		require.ErrorAs(t, rec.transitions[0].Err, &le)
		assert.Equal(t, LostRenewFailed, le.Reason)
	})
}

// stateAtRelease is an Observer that reads its guard's State when the
// guard's move to Released is reported, just before it is published.
type stateAtRelease struct {
	nopObserver
	g    atomic.Pointer[Guard]
	seen []State
}

func (o *stateAtRelease) ObserveTransition(i TransitionInfo) {
	if i.To == Released {
		o.seen = append(o.seen, o.g.Load().State())
	}
}

func TestStateStaysReleasedWhenReleaseFindsLeaseGone(t *testing.T) {
	bubble(t, func(t *testing.T) {
		// The lease was taken over while the guard still believed it held
		// it; the release finds that out. From the moment Release began,
		// State must say Released, never Lost in between.
		f := &fakeStore{}
		obs := &stateAtRelease{}
		g, err := fakeMutex(t, f, WithObserver(obs)).Lock(t.Context())
		require.NoError(t, err)
		obs.g.Store(g)
		f.mu.Lock()
		f.holder = "other#1"
		f.mu.Unlock()
		st, err := g.Release(t.Context())
		require.NoError(t, err)
		assert.Equal(t, Lost, st, "Release's outcome: the lease had slipped")
		assert.Equal(t, []State{Released}, obs.seen, "State while the release finished")
		assert.Equal(t, Released, g.State())
	})
}

func TestLockClearsItsOwnOrphan(t *testing.T) {
	bubble(t, func(t *testing.T) {
		// An attempt is applied but its reply is lost, and the clean-up
		// fails too: the lease is left holding the abandoned value.
		f := &fakeStore{cancelErr: errors.New("connection reset")}
		m := fakeMutex(t, f)
		var orphan string
		m.e.store = &replyLosingStore{fakeStore: f, err: errors.New("read: connection reset"), written: &orphan}
		_, err := m.Lock(t.Context())
		require.Error(t, err)
		synctest.Wait() // the clean-up runs, and fails, in the background
		require.Equal(t, orphan, f.holder, "the orphan holds the lock")

		// Connections are back. The next Lock of the same Mutex finds its
		// own orphan in the way, clears it and acquires at once, instead of
		// waiting out the orphan's lease.
		f.mu.Lock()
		f.cancelErr = nil
		f.mu.Unlock()
		m.e.store = f
		start := time.Now()
		g, err := m.Lock(t.Context())
		require.NoError(t, err)
		assert.Zero(t, time.Since(start))
		assert.Equal(t, 1, g.Attempt(), "the attempt that found the orphan, then the one that won")
		assert.True(t, f.voided[orphan])
		_, err = g.Release(t.Context())
		require.NoError(t, err)
	})
}

// actorsRunning is how many guards' actors run, as the process counts
// them.
func actorsRunning() int64 { return proc.actors.Load() }

// keepersRunning is how many keepers the clients' sessions have.
func keepersRunning() int {
	n := 0
	proc.sessions.each(func(s *session) { n += len(s.keepers) })
	return n
}

// quietProcess waits until no guard's actor and no keeper of an earlier
// test runs any more, and until the background work is done (a guard that
// ended may still be sending its last delete when its test returns, and a
// keeper or batcher may be stopping), so that a test that counts
// goroutines counts its own.
func quietProcess(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool { return actorsRunning() == 0 && keepersRunning() == 0 }, 10*time.Second,
		5*time.Millisecond, "actors (%d) or keepers (%d) of earlier tests still run", actorsRunning(), keepersRunning())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, Settle(ctx), "background work of earlier tests")
}

// steadyGoroutines returns the number of goroutines once it has not
// changed for a tenth of a second (goroutines of earlier tests, such as a
// timer's run that is ending, leave first).
func steadyGoroutines(t *testing.T) int {
	t.Helper()
	n, since := runtime.NumGoroutine(), time.Now()
	for end := since.Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if m := runtime.NumGoroutine(); m != n {
			n, since = m, time.Now()
		} else if time.Since(since) >= 100*time.Millisecond {
			return n
		}
	}
	t.Fatalf("the number of goroutines never settled (%d)", n)
	return n
}

// counted waits, up to within, until the process runs actors actors and
// extra() goroutines more than at the test's start, and fails with the
// last counts if it never does.
func counted(t *testing.T, within time.Duration, when string, actors int64, goroutines int, extra func() int) {
	t.Helper()
	end := time.Now().Add(within)
	for {
		a, n := actorsRunning(), extra()
		if a == actors && n == goroutines {
			return
		}
		if time.Now().After(end) {
			t.Errorf("%s: %d actors and %d goroutines more than at the start, want %d and %d", when, a, n, actors, goroutines)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// Goroutines: a held guard has none before its first renewal, one of its
// own from then on (its actor, which renews from its own timer), and none
// once it is released or its loss is final. The guards of one client
// share one keeper, from their acquisition on, which lingers briefly after
// the last one. The goroutines are
// counted by the runtime, the actors by the process.
func TestHeldGuardsHaveOneGoroutineEach(t *testing.T) {
	quietProcess(t)
	// Real time, not a synctest bubble: the race detector has crashed in
	// its stack depot tearing down a bubble of this many goroutines.
	const guards = 300
	const ttl = 900 * time.Millisecond // renewals every 300 ms
	const within = 5 * time.Second     // for timers on a loaded machine
	base := steadyGoroutines(t)
	// A fake store holds one lease: each guard has one of its own, all on
	// one client, as a process's locks usually are (so they share one
	// keeper: one goroutine more in all).
	stores := make([]*fakeStore, guards)
	client := &fakeStore{}
	lockAll := func(mode renewMode) []*Guard {
		gs := make([]*Guard, guards)
		for i := range gs {
			stores[i] = &fakeStore{mode: mode}
			m, err := newMutex("job", []Option{WithTTL(ttl)})
			require.NoError(t, err)
			m.e.client, m.e.store = client, stores[i]
			g, err := m.Lock(context.Background())
			require.NoError(t, err)
			gs[i] = g
		}
		return gs
	}
	renewals := func() (n int) {
		for _, f := range stores {
			n += len(f.renewCalls())
		}
		return n
	}
	renewedAll := func(times int) bool {
		for _, f := range stores {
			if len(f.renewCalls()) < times {
				return false
			}
		}
		return true
	}
	extra := func() int { return runtime.NumGoroutine() - base }
	start := time.Now()
	gs := lockAll(renewOK)
	if time.Since(start) < renewAfter(ttl)/2 {
		assert.Equal(t, 1, extra(), "goroutines of young guards (the client's keeper)")
		assert.Zero(t, actorsRunning(), "actors of young guards")
	}
	require.Eventually(t, func() bool { return renewedAll(1) }, within, time.Millisecond, "every guard renewed once")
	assert.Equal(t, 1, keepersRunning(), "one keeper for the client")
	counted(t, within, "past the first renewal", guards, guards+1, extra)
	require.Eventually(t, func() bool { return renewedAll(3) }, within, time.Millisecond, "the actors go on renewing")
	assert.Equal(t, int64(guards), actorsRunning(), "actors after three renewals")
	for _, g := range gs {
		require.Equal(t, Acquired, g.State())
		_, err := g.Release(context.Background())
		require.NoError(t, err)
	}
	counted(t, within, "after Release", 0, 0, extra)
	sent := renewals()
	time.Sleep(ttl)
	assert.Equal(t, sent, renewals(), "renewals sent by released guards")

	// A final loss ends the actor too, and the guards send nothing more.
	gs = lockAll(renewRefuse)
	require.Eventually(t, func() bool { return renewals() == guards }, within, time.Millisecond,
		"one refused renewal per guard (%d)", renewals())
	counted(t, within, "after a final loss", 0, 0, extra)
	for _, g := range gs {
		require.Equal(t, Lost, g.State())
	}
	time.Sleep(3 * ttl)
	assert.Equal(t, guards, renewals(), "renewals sent by guards whose loss is final")
	for _, g := range gs {
		st, err := g.Release(context.Background())
		require.NoError(t, err)
		assert.Equal(t, Lost, st)
	}
}

// A call that gets no reply before its own deadline is a failed attempt:
// a Lock whose context cannot end asks again (and gets the lock once Redis
// answers), while TryLock reports it as ErrNoReply, never as the caller's
// context.DeadlineExceeded.
func TestNoReplyIsAFailedAttempt(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		hangs := 2 // the first two calls hang until their deadline
		f.acquireFn = func(ctx context.Context) error {
			f.mu.Lock()
			hang := hangs > 0
			hangs--
			f.mu.Unlock()
			if hang {
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}
		start := time.Now()
		g, err := fakeMutex(t, f).Lock(context.Background())
		require.NoError(t, err, "Lock(context.Background()) returned an internal deadline")
		assert.GreaterOrEqual(t, time.Since(start), 2*(fakeTTL-margin(fakeTTL)), "the two calls without a reply")
		assert.Equal(t, 2, g.Attempt())
		_, err = g.Release(context.Background())
		require.NoError(t, err)

		f.mu.Lock()
		hangs = 1
		f.mu.Unlock()
		_, err = fakeMutex(t, f).TryLock(context.Background())
		require.ErrorIs(t, err, ErrNoReply)
		assert.NotErrorIs(t, err, context.DeadlineExceeded)
		var nr *NoReplyError
		require.ErrorAs(t, err, &nr)
		assert.Equal(t, fakeTTL-margin(fakeTTL), nr.After)
		Settle(context.Background())
	})
}

// L4 with a call left behind: an acquisition whose first call got no reply
// (it may still reach Redis, late, and grant the value anew after another
// holder) cannot prove a regain by finding its value. Its loss is final,
// and the value is cancelled (voided, and deleted if a late call granted
// it), so that no such call can grant it later.
func TestUncertainGuardDoesNotRegain(t *testing.T) {
	bubble(t, func(t *testing.T) {
		f := &fakeStore{}
		var failed atomic.Bool
		f.acquireFn = func(context.Context) error {
			if failed.CompareAndSwap(false, true) {
				return errors.New("read: connection reset") // no reply: the call's outcome is unknown
			}
			return nil
		}
		m := fakeMutex(t, f)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		g, err := m.Lock(ctx)
		require.NoError(t, err)
		require.True(t, g.void, "the guard of an acquisition with a call whose outcome it never saw")
		start := time.Now()

		f.set(renewFail)
		time.Sleep(time.Until(start.Add(fakeTTL - margin(fakeTTL))))
		synctest.Wait()
		require.Equal(t, Lost, g.State(), "at D")

		// The key holds the value again (a late call may have granted it):
		// the next try finds it, and the guard stays Lost.
		f.set(renewOK)
		time.Sleep(fakeTTL / 9)
		synctest.Wait()
		assert.Equal(t, Lost, g.State(), "a renewal that found the value of an uncertain acquisition")
		f.mu.Lock()
		voided, holder := f.voided[g.value], f.holder
		f.mu.Unlock()
		assert.True(t, voided, "the value was not cancelled after the final loss")
		assert.Empty(t, holder, "the value's lease was left")
		renews := len(f.renewCalls())
		time.Sleep(fakeTTL)
		synctest.Wait()
		assert.Equal(t, renews, len(f.renewCalls()), "renewals after the final loss")
		st, err := g.Release(t.Context())
		require.NoError(t, err)
		assert.Equal(t, Lost, st)
	})
}

// blockingRenewObserver is an Observer whose ObserveRenew blocks, holding
// the guard's actor up, until release is closed.
type blockingRenewObserver struct {
	nopObserver
	blocked chan struct{} // closed when the first ObserveRenew blocks
	release chan struct{}
	once    sync.Once
}

func (o *blockingRenewObserver) ObserveRenew(RenewInfo) {
	o.once.Do(func() { close(o.blocked) })
	<-o.release
}

// A Release or Leave is bounded by its context on every path, also when
// the guard's actor is held up (here by an Observer that blocks): it
// returns the context's error when the wait ends, and the end comes in
// the background once the actor can take it.
func TestEndBoundedWhileActorIsHeldUp(t *testing.T) {
	for _, tc := range []struct {
		name     string
		leave    bool
		timeout  time.Duration // 0: a context without a deadline (ReleaseTimeout)
		released int           // deletes sent
	}{
		{name: "Release with a deadline", timeout: 100 * time.Millisecond, released: 1},
		{name: "Release without a deadline", released: 1},
		{name: "Leave with a deadline", leave: true, timeout: 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				f := &fakeStore{}
				obs := &blockingRenewObserver{blocked: make(chan struct{}), release: make(chan struct{})}
				g, err := fakeMutex(t, f, WithObserver(obs)).Lock(t.Context())
				require.NoError(t, err)
				<-obs.blocked // the actor renewed and is held up
				synctest.Wait()
				require.Equal(t, int64(1), actorsRunning())

				ctx, want := t.Context(), ReleaseTimeout
				if tc.timeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.timeout)
					defer cancel()
					want = tc.timeout
				}
				start := time.Now()
				end := g.Release
				if tc.leave {
					end = g.Leave
				}
				st, err := end(ctx)
				assert.Equal(t, want, time.Since(start), "the wait is bounded by its context")
				assert.ErrorIs(t, err, context.DeadlineExceeded)
				assert.Equal(t, Released, st)
				select {
				case <-g.Done():
					t.Fatal("the guard ended while its actor was held up")
				default:
				}

				close(obs.release)
				<-g.Done() // the end still comes
				synctest.Wait()
				assert.Equal(t, Released, g.State())
				f.mu.Lock()
				assert.Len(t, f.releases, tc.released)
				f.mu.Unlock()
				require.NoError(t, Settle(t.Context()))
			})
		})
	}
}
