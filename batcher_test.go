package distlock

import (
	"context"
	"errors"
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

// The batcher's tests run in synctest bubbles (under the race detector
// too: it crashed now and then tearing them down while every renewal had
// a goroutine of its own, and has not since) against batchStore, a fake
// lease store of many keys that renews in batches, so that when each
// batch is sent, and with what, can be checked to the nanosecond.

// batchCall is one RenewBatch call of batchStore.
type batchCall struct {
	sent     time.Time
	deadline time.Time
	values   []string
	ctxErr   error // the call's context's error when it returned
}

// batchStore is a lease store of many keys (by lease key), which renews
// them in batches as lease.Client.RenewBatch does.
type batchStore struct {
	mu      sync.Mutex
	holders map[string]string // lease key → value
	token   int64
	refuse  map[string]bool // lease keys whose renewals are refused (held by "other#1")
	fail    error           // when set, RenewBatch fails with it
	gate    chan struct{}   // when set, RenewBatch waits for it to close, or for its context
	stuck   chan struct{}   // when set, RenewBatch waits for it to close, whatever its context says
	batches []batchCall
	lone    int // Renew calls
}

func newBatchStore() *batchStore {
	return &batchStore{holders: map[string]string{}, refuse: map[string]bool{}}
}

func (s *batchStore) Acquire(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Grant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.holders[k.Lease]; h != "" && h != value {
		return lease.Grant{Holder: h, HolderTTL: ttl}, nil
	}
	s.holders[k.Lease] = value
	s.token++
	return lease.Grant{Acquired: true, Token: s.token}, nil
}

func (s *batchStore) AcquireOrQueue(ctx context.Context, k lease.Keys, value string, ttl time.Duration, p lease.Place) (lease.Grant, error) {
	return s.Acquire(ctx, k, value, ttl)
}

func (s *batchStore) Renew(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Renewal, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lone++
	return s.outcome(k, value), nil
}

// outcome is a renewal's answer; the caller holds s.mu.
func (s *batchStore) outcome(k lease.Keys, value string) lease.Renewal {
	if s.refuse[k.Lease] {
		return lease.Renewal{Holder: "other#1"}
	}
	h := s.holders[k.Lease]
	return lease.Renewal{OK: h == value, Holder: h}
}

func (s *batchStore) RenewBatch(ctx context.Context, items []lease.RenewItem, out []lease.Renewal) error {
	s.mu.Lock()
	dl, _ := ctx.Deadline()
	c := batchCall{sent: time.Now(), deadline: dl}
	for _, it := range items {
		c.values = append(c.values, it.Value)
	}
	i := len(s.batches)
	s.batches = append(s.batches, c)
	gate, fail, stuck := s.gate, s.fail, s.stuck
	s.mu.Unlock()
	if stuck != nil {
		<-stuck
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches[i].ctxErr = ctx.Err()
	if err := ctx.Err(); err != nil {
		return err
	}
	if fail != nil {
		return fail
	}
	for j, it := range items {
		out[j] = s.outcome(it.Keys, it.Value)
	}
	return nil
}

func (s *batchStore) BatchGroup(lease.Keys) string { return "" }

func (s *batchStore) Release(ctx context.Context, k lease.Keys, value string) (lease.Release, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holders[k.Lease] == value {
		delete(s.holders, k.Lease)
		return lease.Release{Deleted: true}, nil
	}
	return lease.Release{}, nil
}

func (s *batchStore) Cancel(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Release, error) {
	return s.Release(ctx, k, value)
}

func (s *batchStore) CancelDedicated(ctx context.Context, k lease.Keys, value string, ttl time.Duration) (lease.Release, error) {
	return s.Release(ctx, k, value)
}

func (s *batchStore) Subscribe(ctx context.Context, k lease.Keys, room string, ready func(), granted func(string, int64)) error {
	ready()
	<-ctx.Done()
	return ctx.Err()
}

func (s *batchStore) calls() []batchCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]batchCall(nil), s.batches...)
}

func (s *batchStore) set(f func(s *batchStore)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// batchMutexes returns n mutexes of s ("job0", "job1", ...), with opts.
func batchMutexes(t *testing.T, s *batchStore, n int, opts ...Option) []*Mutex {
	t.Helper()
	ms := make([]*Mutex, n)
	for i := range ms {
		m, err := newMutex("job"+strconv.Itoa(i), append([]Option{WithTTL(fakeTTL)}, opts...))
		require.NoError(t, err)
		m.e.client, m.e.store = s, s
		ms[i] = m
	}
	return ms
}

// releaseAll releases every guard, so that the bubble's goroutines end.
func releaseAll(t *testing.T, gs []*Guard) {
	t.Helper()
	for _, g := range gs {
		_, err := g.Release(t.Context())
		require.NoError(t, err)
	}
}

// TestActorExitDoesNotWaitForTheBatcher checks that a guard whose batched
// renewal is stuck in a call that ignores its context (as go-redis's does
// until its ReadTimeout) is released at once, its actor exits at once,
// and only the batcher's wind-down, which Settle waits for, waits for the
// call: the batcher stops with its client's session, once the session's
// restart watch has lingered after the guard's end.
func TestActorExitDoesNotWaitForTheBatcher(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := newBatchStore()
		stuck := make(chan struct{})
		s.set(func(s *batchStore) { s.stuck = stuck })
		g, err := batchMutexes(t, s, 1)[0].Lock(t.Context())
		require.NoError(t, err)
		time.Sleep(fakeTTL / 3)
		synctest.Wait()
		require.Len(t, s.calls(), 1, "the first renewal, stuck")
		require.True(t, g.hasActor())
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		st, err := g.Release(ctx)
		require.NoError(t, err)
		assert.Equal(t, Released, st)
		assert.Zero(t, time.Since(start), "Release waited")
		synctest.Wait()
		assert.Zero(t, actorsRunning(), "the actor waits for the batcher's call")
		time.Sleep(keeperLinger)
		synctest.Wait()
		assert.Zero(t, proc.sessions.len(), "the session after its linger")
		sctx, scancel := context.WithTimeout(t.Context(), time.Second)
		defer scancel()
		assert.ErrorIs(t, Settle(sctx), context.DeadlineExceeded, "Settle while the batcher's call is stuck")
		close(stuck)
		require.NoError(t, Settle(t.Context()))
	})
}

// TestBatcherLoneRenewalOnTime checks that a guard alone on its client
// renews through the batcher exactly when due, every third of the TTL, as
// without it: the slack lets a renewal wait for company, never longer than
// it is due. Each call's deadline is the guard's lease deadline (L1).
func TestBatcherLoneRenewalOnTime(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := newBatchStore()
		g, err := batchMutexes(t, s, 1)[0].Lock(t.Context())
		require.NoError(t, err)
		start := time.Now()
		time.Sleep(10*fakeTTL/3 + time.Millisecond)
		calls := s.calls()
		require.Len(t, calls, 10)
		for i, c := range calls {
			assert.Equal(t, time.Duration(i+1)*fakeTTL/3, c.sent.Sub(start), "renewal %d: sent late or early", i)
			assert.Equal(t, []string{g.value}, c.values, "renewal %d", i)
			wantD := c.sent.Add(-fakeTTL / 3).Add(fakeTTL - margin(fakeTTL))
			assert.Equal(t, wantD, c.deadline, "deadline of renewal %d", i)
		}
		assert.Equal(t, 0, s.lone, "renewals sent alone")
		assert.Equal(t, Acquired, g.State())
		assert.Equal(t, calls[9].sent.Add(fakeTTL-margin(fakeTTL)), g.Deadline(), "the deadline counts from the batch's send time")
		releaseAll(t, []*Guard{g})
	})
}

// TestBatcherManyGuardsOneCommand holds MaxRenewBatch+100 locks on one
// client, acquired over less than a renewal's slack: their renewals go out
// together, two scripts a round (MaxRenewBatch in the first), at the time
// the first of them is due, and stay together round after round.
func TestBatcherManyGuardsOneCommand(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := newBatchStore()
		n := lease.MaxRenewBatch + 100
		start := time.Now()
		gs := make([]*Guard, n)
		for i, m := range batchMutexes(t, s, n) {
			g, err := m.Lock(t.Context())
			require.NoError(t, err)
			gs[i] = g
			time.Sleep(renewSlack(renewAfter(fakeTTL)) / time.Duration(n))
		}
		const rounds = 3
		time.Sleep(rounds*renewAfter(fakeTTL) + renewSlack(renewAfter(fakeTTL)))
		calls := s.calls()
		require.Len(t, calls, 2*rounds, "scripts for %d rounds of %d renewals", rounds, n)
		for r := range rounds {
			a, b := calls[2*r], calls[2*r+1]
			assert.ElementsMatch(t, []int{lease.MaxRenewBatch, n - lease.MaxRenewBatch}, []int{len(a.values), len(b.values)},
				"round %d: the renewals per script", r)
			assert.Equal(t, a.sent, b.sent, "round %d: both scripts at once", r)
			assert.Equal(t, time.Duration(r+1)*renewAfter(fakeTTL), a.sent.Sub(start), "round %d: sent when the first was due", r)
		}
		assert.Equal(t, 0, s.lone)
		for i, g := range gs {
			assert.Equal(t, Acquired, g.State(), "guard %d", i)
		}
		releaseAll(t, gs)
	})
}

// TestBatcherEarliestDeadlineFirst checks that when more renewals of a
// group are due than one script takes, the script of MaxRenewBatch
// carries those whose deadlines come first, whatever the order in which
// they were asked for.
func TestBatcherEarliestDeadlineFirst(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := newBatchStore()
		b := batcherOf(t, s)
		n := lease.MaxRenewBatch + 50
		start := time.Now()
		due := start.Add(time.Millisecond)
		asks := make([]renewAsk, n)
		for i := range n {
			// Asked latest deadline first: ask i lapses at n-i seconds.
			asks[i] = b.newAsk(&lease.Keys{Lease: strconv.Itoa(i)}, strconv.Itoa(i), fakeTTL, make(chan struct{}, 1))
			b.ask(&asks[i], start.Add(time.Duration(n-i)*time.Second), due, start, false)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		calls := s.calls()
		require.Len(t, calls, 2)
		first, second := calls[0], calls[1]
		if len(first.values) != lease.MaxRenewBatch {
			first, second = second, first
		}
		require.Len(t, first.values, lease.MaxRenewBatch)
		var want []string
		for i := n - lease.MaxRenewBatch; i < n; i++ { // the earliest deadlines
			want = append(want, strconv.Itoa(i))
		}
		assert.ElementsMatch(t, want, first.values, "the full script carries the earliest deadlines")
		assert.Len(t, second.values, n-lease.MaxRenewBatch)
		for i := range asks {
			<-asks[i].wake
			require.True(t, asks[i].ready.Load(), "woken with an answer")
			require.NoError(t, asks[i].ans.err)
		}
	})
}

// TestBatcherRefusedMemberAlone checks L4 in a batch: the member whose
// renewal Redis refused turns Lost for good (its actor retires and renews
// no more), and the others of its batch are confirmed.
func TestBatcherRefusedMemberAlone(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := newBatchStore()
		ms := batchMutexes(t, s, 3)
		gs := make([]*Guard, len(ms))
		for i, m := range ms {
			g, err := m.Lock(t.Context())
			require.NoError(t, err)
			gs[i] = g
		}
		s.set(func(s *batchStore) { s.refuse[ms[1].Key()] = true })
		time.Sleep(2*renewAfter(fakeTTL) + time.Millisecond)
		calls := s.calls()
		require.Len(t, calls, 2)
		assert.Len(t, calls[0].values, 3, "the first batch has all three")
		assert.ElementsMatch(t, []string{gs[0].value, gs[2].value}, calls[1].values, "the refused guard renews no more")
		assert.Equal(t, Acquired, gs[0].State())
		assert.Equal(t, Acquired, gs[2].State())
		assert.Equal(t, Lost, gs[1].State())
		var lost *LostError
		require.ErrorAs(t, context.Cause(gs[1].Context()), &lost)
		assert.Equal(t, LostRefused, lost.Reason)
		assert.Equal(t, calls[1].sent.Add(fakeTTL-margin(fakeTTL)), gs[0].Deadline(), "the others are confirmed")
		releaseAll(t, gs)
	})
}

// TestBatcherFailedBatchFailsEveryMember checks that a batch that fails
// as a whole (no reply, an error reply, a reply that cannot be read) is a
// failed attempt for every member (L1b): each reports it and stays
// Acquired with its deadline unmoved (never a false confirmation), and
// retries; the retries, due at about the same time, share a batch again.
func TestBatcherFailedBatchFailsEveryMember(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := newBatchStore()
		ms := batchMutexes(t, s, 3)
		gs := make([]*Guard, len(ms))
		events := make([]<-chan Event, len(ms))
		for i, m := range ms {
			g, err := m.Lock(t.Context())
			require.NoError(t, err)
			gs[i] = g
			events[i] = g.Subscribe(t.Context())
			require.Equal(t, Acquired, (<-events[i]).State)
		}
		deadline := gs[0].Deadline()
		reset := errors.New("connection reset by peer")
		s.set(func(s *batchStore) { s.fail = reset })
		time.Sleep(renewAfter(fakeTTL))
		synctest.Wait()
		require.Len(t, s.calls(), 1)
		for i, g := range gs {
			assert.Equal(t, Acquired, g.State(), "guard %d", i)
			assert.Equal(t, deadline, g.Deadline(), "guard %d: a failed batch confirmed nothing", i)
			select {
			case ev := <-events[i]:
				var rerr *RenewError
				require.ErrorAs(t, ev.Err, &rerr, "guard %d: the failure is reported", i)
				assert.ErrorIs(t, rerr, reset)
			default:
				t.Errorf("guard %d: no event for the failed renewal", i)
			}
		}
		s.set(func(s *batchStore) { s.fail = nil })
		time.Sleep(renewAfter(fakeTTL))
		calls := s.calls()
		require.Greater(t, len(calls), 1, "the renewals were retried")
		for i, g := range gs {
			assert.Equal(t, Acquired, g.State(), "guard %d", i)
			assert.True(t, g.Deadline().After(deadline), "guard %d: the retry confirmed", i)
		}
		releaseAll(t, gs)
	})
}

// renew asks b for one renewal as a guard's actor does, and waits for its
// answer, as the actor's loop would, or for ended's end: then it drops the
// ask, as an ending actor does, and returns ended's error with asked as
// the send time, unless the answer had come.
func (b *batcher) renew(ended context.Context, dl time.Time, k lease.Keys, value string, ttl time.Duration, latest, asked time.Time) (time.Time, lease.Renewal, error) {
	a := b.newAsk(&k, value, ttl, make(chan struct{}, 1))
	b.ask(&a, dl, latest, asked, false)
	select {
	case <-a.wake:
		return a.ans.sent, a.ans.r, a.ans.err
	case <-ended.Done():
	}
	b.drop(&a)
	if a.ready.Load() {
		return a.ans.sent, a.ans.r, a.ans.err
	}
	return asked, lease.Renewal{}, ended.Err()
}

// batcherOf returns a batcher of s, stopped when the test's bubble ends.
func batcherOf(t *testing.T, s *batchStore) *batcher {
	t.Helper()
	b := newBatcher(s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.run()
	}()
	t.Cleanup(func() {
		b.stop()
		<-done
	})
	return b
}

// TestBatcherMemberDeadline checks L1 for a member of a batch in flight:
// its wait ends at its own deadline, with its context's error, while the
// member whose deadline is later gets the batch's answer; the batch's call
// is bounded by the latest of its members' deadlines.
func TestBatcherMemberDeadline(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := newBatchStore()
		gate := make(chan struct{})
		s.set(func(s *batchStore) { s.gate = gate; s.holders["a"], s.holders["b"] = "va", "vb" })
		b := batcherOf(t, s)
		start := time.Now()
		ka, kb := lease.Keys{Lease: "a"}, lease.Keys{Lease: "b"}
		type result struct {
			at   time.Time
			sent time.Time
			r    lease.Renewal
			err  error
		}
		var ra, rb result
		var wg sync.WaitGroup
		ask := func(k lease.Keys, value string, d time.Duration, res *result) {
			wg.Go(func() {
				res.sent, res.r, res.err = b.renew(t.Context(), start.Add(d), k, value, fakeTTL, start.Add(10*time.Millisecond), time.Now())
				res.at = time.Now()
			})
		}
		ask(ka, "va", 100*time.Millisecond, &ra)
		ask(kb, "vb", time.Second, &rb)
		time.Sleep(500 * time.Millisecond)
		close(gate)
		wg.Wait()
		calls := s.calls()
		require.Len(t, calls, 1)
		assert.Len(t, calls[0].values, 2)
		assert.Equal(t, start.Add(10*time.Millisecond), calls[0].sent)
		assert.Equal(t, start.Add(time.Second), calls[0].deadline, "the batch's bound: the latest member deadline")
		assert.ErrorIs(t, ra.err, context.DeadlineExceeded, "a: its own deadline")
		assert.Equal(t, start.Add(100*time.Millisecond), ra.at, "a returned at its deadline, not the batch's reply")
		assert.Equal(t, start, ra.sent, "a: no batch answered it; the time it asked")
		require.NoError(t, rb.err)
		assert.True(t, rb.r.OK, "b: the batch's answer")
		assert.Equal(t, start.Add(500*time.Millisecond), rb.at)
		assert.Equal(t, calls[0].sent, rb.sent, "b: the batch's send time")
	})
}

// TestBatcherMemberDeadlineBesideNone: a batch with a member that has no
// deadline (so the call has none) still answers a member that has one at
// its own deadline.
func TestBatcherMemberDeadlineBesideNone(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := newBatchStore()
		gate := make(chan struct{})
		s.set(func(s *batchStore) { s.gate = gate; s.holders["a"], s.holders["b"] = "va", "vb" })
		b := batcherOf(t, s)
		start := time.Now()
		var errA, errB error
		var atA time.Time
		var wg sync.WaitGroup
		latest := start.Add(10 * time.Millisecond)
		wg.Go(func() {
			_, _, errA = b.renew(t.Context(), start.Add(100*time.Millisecond), lease.Keys{Lease: "a"}, "va", fakeTTL, latest, start)
			atA = time.Now()
		})
		wg.Go(func() {
			_, _, errB = b.renew(t.Context(), time.Time{}, lease.Keys{Lease: "b"}, "vb", fakeTTL, latest, start)
		})
		time.Sleep(500 * time.Millisecond)
		close(gate)
		wg.Wait()
		require.Len(t, s.calls(), 1)
		assert.ErrorIs(t, errA, context.DeadlineExceeded, "a: its own deadline")
		assert.Equal(t, start.Add(100*time.Millisecond), atA, "a returned at its deadline, not the batch's reply")
		assert.NoError(t, errB, "b: the batch's answer")
	})
}

// TestBatcherPendingPastDeadline checks L1 for a member still pending: one
// whose deadline comes before its latest is answered at its deadline and
// not sent; the other renewal pending then goes out at that moment, as
// with any group that falls due.
func TestBatcherPendingPastDeadline(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := newBatchStore()
		b := batcherOf(t, s)
		start := time.Now()
		var at time.Time
		var err error
		var wg sync.WaitGroup
		wg.Go(func() {
			_, _, err = b.renew(t.Context(), start.Add(50*time.Millisecond), lease.Keys{Lease: "a"}, "va", fakeTTL, start.Add(time.Second), start)
			at = time.Now()
		})
		wg.Go(func() {
			_, _, _ = b.renew(t.Context(), start.Add(time.Minute), lease.Keys{Lease: "b"}, "vb", fakeTTL, start.Add(100*time.Millisecond), start)
		})
		wg.Wait()
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, start.Add(50*time.Millisecond), at, "answered at its deadline")
		calls := s.calls()
		require.Len(t, calls, 1)
		assert.Equal(t, []string{"vb"}, calls[0].values, "a is not sent past its deadline")
		assert.Equal(t, start.Add(50*time.Millisecond), calls[0].sent)
	})
}

// TestBatcherDropsMembersThatLeft checks that a member that gives up before
// its batch is sent is left out of it, and that a batch in flight whose
// every member gave up is cancelled.
func TestBatcherDropsMembersThatLeft(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := newBatchStore()
		gate := make(chan struct{})
		s.set(func(s *batchStore) { s.gate = gate })
		b := batcherOf(t, s)
		start := time.Now()
		latest := start.Add(100 * time.Millisecond)
		ctxA, cancelA := context.WithCancel(t.Context())
		ctxB, cancelB := context.WithCancel(t.Context())
		var errA, errB error
		var wg sync.WaitGroup
		wg.Go(func() {
			_, _, errA = b.renew(ctxA, time.Time{}, lease.Keys{Lease: "a"}, "va", fakeTTL, latest, time.Now())
		})
		wg.Go(func() {
			_, _, errB = b.renew(ctxB, time.Time{}, lease.Keys{Lease: "b"}, "vb", fakeTTL, latest, time.Now())
		})
		time.Sleep(50 * time.Millisecond)
		cancelA()
		time.Sleep(100 * time.Millisecond)
		calls := s.calls()
		require.Len(t, calls, 1)
		assert.Equal(t, []string{"vb"}, calls[0].values, "a left before the batch was sent")
		assert.Equal(t, latest, calls[0].sent)
		cancelB()
		wg.Wait()
		synctest.Wait()
		assert.ErrorIs(t, errA, context.Canceled)
		assert.ErrorIs(t, errB, context.Canceled)
		assert.ErrorIs(t, s.calls()[0].ctxErr, context.Canceled, "nobody waits for the batch: its call is cancelled")
		close(gate)
	})
}

// TestBatcherLateReplyOfABatchLeft: an actor asks with one ask for every
// renewal. Its renewal's batch is stuck (a connection that holds the call
// and answers it late, whatever its deadline); at its deadline the member
// is answered DeadlineExceeded and asks again with the same ask, and the
// new batch is in flight when the stuck one's reply lands. That late
// reply answers nothing: the ask is the new batch's, whose own answer it
// gets.
func TestBatcherLateReplyOfABatchLeft(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := newBatchStore()
		stuck := make(chan struct{})
		s.set(func(s *batchStore) { s.stuck = stuck; s.holders["a"] = "va" })
		b := batcherOf(t, s)
		start := time.Now()
		k := lease.Keys{Lease: "a"}
		a := b.newAsk(&k, "va", fakeTTL, make(chan struct{}, 1))
		b.ask(&a, start.Add(100*time.Millisecond), start.Add(10*time.Millisecond), start, false)
		<-a.wake
		require.True(t, a.ready.Load())
		require.ErrorIs(t, a.ans.err, context.DeadlineExceeded, "the first ask, at its deadline")
		assert.Equal(t, start.Add(100*time.Millisecond), time.Now())

		gate := make(chan struct{})
		s.set(func(s *batchStore) { s.stuck, s.gate = nil, gate })
		again := time.Now()
		b.ask(&a, again.Add(time.Second), again.Add(10*time.Millisecond), again, false)
		time.Sleep(20 * time.Millisecond)
		require.Len(t, s.calls(), 2, "the second ask's batch is in flight")
		close(stuck) // the first batch's reply lands now
		synctest.Wait()
		assert.False(t, a.ready.Load(), "answered by the reply of a batch it had left")
		assert.Empty(t, a.wake, "woken by the reply of a batch it had left")

		close(gate)
		<-a.wake
		require.True(t, a.ready.Load())
		require.NoError(t, a.ans.err)
		assert.True(t, a.ans.r.OK, "the second batch's answer")
		assert.Equal(t, s.calls()[1].sent, a.ans.sent, "dated from the second batch")
	})
}

// TestBatcherDueAtOnceAndFlush checks that a renewal asked for with its
// latest already past is sent at once, with every renewal pending then,
// and that flushAll (the keeper's restart poke) sends every pending
// renewal at once.
func TestBatcherDueAtOnceAndFlush(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := newBatchStore()
		b := batcherOf(t, s)
		start := time.Now()
		var wg sync.WaitGroup
		ask := func(k string, latest time.Time) {
			wg.Go(func() {
				_, _, _ = b.renew(t.Context(), time.Time{}, lease.Keys{Lease: k}, "v", fakeTTL, latest, time.Now())
			})
		}
		ask("a", start.Add(time.Second))
		synctest.Wait()
		ask("b", start)
		synctest.Wait()
		calls := s.calls()
		require.Len(t, calls, 1)
		assert.Equal(t, start, calls[0].sent, "sent at once")
		assert.ElementsMatch(t, []string{"v", "v"}, calls[0].values, "with the one pending")
		wg.Wait()

		ask("c", start.Add(time.Second))
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		b.flushAll()
		wg.Wait()
		calls = s.calls()
		require.Len(t, calls, 2)
		assert.Equal(t, start.Add(10*time.Millisecond), calls[1].sent, "flushed at once")
	})
}

// TestBatcherNotForReplicaAck checks that a guard whose engine waits for
// replicas renews alone: each renewal needs its own WAIT.
func TestBatcherNotForReplicaAck(t *testing.T) {
	s := newBatchStore()
	e := &engine{client: s, store: s}
	e.ack.Replicas = 1
	_, ok := batcherFor(e)
	assert.False(t, ok, "an engine that waits for replicas")
	_, ok = batcherFor(&engine{client: s, store: &fakeStore{}})
	assert.False(t, ok, "a store that cannot batch")
}

// TestBatcherQuietConfirmation checks the order in which a guard learns
// of a renewal through the batcher that confirmed its lease: the deadline
// moves on at once (State and Deadline count it), the actor is not woken
// for it (the Observer hears of it only when the actor next wakes, to ask
// for the next renewal), and an end that comes first reads it before it
// decides anything.
func TestBatcherQuietConfirmation(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := newBatchStore()
		rec := &recorder{}
		g, err := batchMutexes(t, s, 1, WithObserver(rec))[0].Lock(t.Context())
		require.NoError(t, err)
		start, first := time.Now(), g.Deadline()
		renewed := func() int {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			return len(rec.renews)
		}

		time.Sleep(renewAfter(fakeTTL) + time.Millisecond)
		synctest.Wait()
		require.Len(t, s.calls(), 1)
		second := g.Deadline()
		assert.Equal(t, leaseDeadline(start.Add(renewAfter(fakeTTL)), fakeTTL), second, "the confirmed deadline, at once")
		assert.Zero(t, renewed(), "the actor was woken for a confirmation")
		assert.True(t, second.After(first))

		// The next renewal is asked for: the actor reads the first answer
		// then, and the second moves the deadline on again.
		time.Sleep(renewAfter(fakeTTL))
		synctest.Wait()
		require.Len(t, s.calls(), 2)
		assert.Equal(t, 1, renewed(), "the first renewal, read when the second was asked for")
		assert.True(t, g.Deadline().After(second))

		// An end reads the answer it finds before anything else.
		st, err := g.Release(t.Context())
		require.NoError(t, err)
		assert.Equal(t, Released, st)
		rec.mu.Lock()
		defer rec.mu.Unlock()
		require.Len(t, rec.renews, 2, "every renewal is observed, the last one at the end")
		for i, r := range rec.renews {
			assert.NoError(t, r.Err, "renewal %d", i)
		}
		require.Len(t, rec.transitions, 1)
		assert.Equal(t, Acquired, rec.transitions[0].From)
		assert.Equal(t, Released, rec.transitions[0].To)
	})
}

// A quiet ask's confirmation that comes after the member's own deadline
// (the batch's expiry timer not yet run) is not published quietly: the
// guard's State has said Lost since that deadline, and only its actor may
// make it Acquired again, as a regain it tells its subscribers of. The
// asker is woken for it, and the deadline it vouches for is not moved.
func TestBatcherQuietConfirmationAfterTheDeadlineWakes(t *testing.T) {
	var moved atomic.Int64
	wake := make(chan struct{}, 1)
	base := time.Now()
	a := &renewAsk{ttl: fakeTTL, wake: wake, moved: &moved, base: base, quiet: true}
	sent := base.Add(time.Second)
	a.deadline = sent.Add(10 * time.Millisecond)
	a.answer(renewAnswer{sent: sent, at: a.deadline, r: lease.Renewal{OK: true}})
	assert.Zero(t, moved.Load(), "a confirmation after the deadline moved it quietly")
	assert.Len(t, wake, 1, "the asker was not woken")

	// Before the deadline it is quiet.
	a = &renewAsk{ttl: fakeTTL, wake: wake, moved: &moved, base: base, quiet: true, deadline: a.deadline}
	select {
	case <-wake:
	default:
	}
	a.answer(renewAnswer{sent: sent, at: a.deadline.Add(-time.Millisecond), r: lease.Renewal{OK: true}})
	assert.Equal(t, int64(leaseDeadline(sent, fakeTTL).Sub(base)), moved.Load())
	assert.Empty(t, wake, "a confirmation in time woke the asker")
}
