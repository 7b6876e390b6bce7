package distlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// Tests of WithReplicaAck against a primary with one replica. A replica
// stopped with SIGSTOP stays connected but acknowledges nothing, which is
// what a lagging or partitioned replica looks like to the primary.

// ackTimeout is the replica acknowledgement timeout of these tests: long
// enough for a replica on a loaded machine, short against the TTLs.
const ackTimeout = 300 * time.Millisecond

// replicated is a primary with one replica.
type replicated struct {
	primary, replica *redistest.Server
}

func startReplicated(t *testing.T) replicated {
	t.Helper()
	p := redistest.Start(t, "--repl-diskless-sync-delay", "0")
	return replicated{primary: p, replica: redistest.StartReplica(t, p, p.Addr())}
}

// ackObserver records the outcome of every renewal.
type ackObserver struct {
	mu        sync.Mutex
	renewErrs []error
}

func (o *ackObserver) ObserveAcquire(distlock.AcquireInfo) {}

func (o *ackObserver) ObserveRenew(i distlock.RenewInfo) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.renewErrs = append(o.renewErrs, i.Err)
}

func (o *ackObserver) ObserveTransition(distlock.TransitionInfo) {}

// renewals returns how many renewals ended, and how many of them with an
// error matching target.
func (o *ackObserver) renewals(target error) (all, matching int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, err := range o.renewErrs {
		if errors.Is(err, target) {
			matching++
		}
	}
	return len(o.renewErrs), matching
}

func TestReplicaAckInvalid(t *testing.T) {
	c := redistest.Start(t).Client()
	cases := []struct {
		name     string
		replicas int
		timeout  time.Duration
		ttl      time.Duration
	}{
		{"negative replicas", -1, time.Second, 30 * time.Second},
		{"zero timeout", 1, 0, 30 * time.Second},
		{"negative timeout", 1, -time.Second, 30 * time.Second},
		{"timeout under a millisecond", 1, 999 * time.Microsecond, 30 * time.Second},
		{"zero replicas still need a timeout", 0, 0, 30 * time.Second},
		{"timeout longer than the renewal period", 1, 10*time.Second + time.Millisecond, 30 * time.Second},
		{"timeout longer than a third of a short TTL", 1, 100 * time.Millisecond, 299 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := distlock.NewMutex(c, "k", distlock.WithTTL(tc.ttl), distlock.WithReplicaAck(tc.replicas, tc.timeout))
			require.ErrorIs(t, err, distlock.ErrInvalidOption)
			assert.Nil(t, m)
			var oe *distlock.OptionError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, "replica ack", oe.Field)
		})
	}
	for _, ok := range []struct {
		replicas int
		timeout  time.Duration
	}{{1, time.Millisecond}, {1, 10 * time.Second}, {0, time.Second}, {5, time.Second}} {
		_, err := distlock.NewMutex(c, "k", distlock.WithReplicaAck(ok.replicas, ok.timeout))
		assert.NoError(t, err, "WithReplicaAck(%d, %v) with the default TTL", ok.replicas, ok.timeout)
	}
}

func TestReplicaAckAcquire(t *testing.T) {
	rs := startReplicated(t)
	c := rs.primary.Client()
	m := newMutex(t, c, "acked", distlock.WithReplicaAck(1, ackTimeout))

	// Once Lock returns, the replica has the lease and its fencing key: the
	// read below goes to the replica itself, right away.
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	value, ok := get(t, rs.primary, m.Key())
	require.True(t, ok, "lease missing on the primary")
	onReplica, ok := get(t, rs.replica, m.Key())
	require.True(t, ok, "lease missing on the replica after an acknowledged Lock")
	assert.Equal(t, value, onReplica, "lease on the replica")
	_, ok = get(t, rs.replica, m.Key()+":fence")
	assert.True(t, ok, "fencing key missing on the replica")
	assert.Equal(t, distlock.Released, release(t, g))

	// More replicas than there are: the write happens, is not acknowledged,
	// and is undone.
	m2 := newMutex(t, c, "two", distlock.WithReplicaAck(2, ackTimeout))
	start := time.Now()
	_, err = m2.TryLock(t.Context())
	took := time.Since(start)
	require.ErrorIs(t, err, distlock.ErrNotReplicated)
	var ae *distlock.ReplicaAckError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, "acquire", ae.Op)
	assert.Equal(t, m2.Key(), ae.Key)
	assert.Equal(t, 2, ae.Want)
	assert.Equal(t, 1, ae.Got)
	assert.NoError(t, ae.Err)
	assert.GreaterOrEqual(t, took, ackTimeout, "Redis should have waited for the second replica")
	_, ok = get(t, rs.primary, m2.Key())
	assert.False(t, ok, "an unacknowledged acquisition left its lease behind")
	assert.NotErrorIs(t, err, distlock.ErrNotAcquired)
}

func TestReplicaAckUsesTheWritingConnection(t *testing.T) {
	// WAIT counts the writes of its own connection. Sent on any other
	// connection (one that never wrote, or whose writes replicated long
	// ago), it would return at once with the replica counted, although the
	// replica never received the lease. A stopped replica tells the two
	// apart.
	rs := startReplicated(t)
	c := rs.primary.Client()
	m := newMutex(t, c, "stalled", distlock.WithReplicaAck(1, ackTimeout))

	// Warm every connection of the client, dedicated ones included.
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	release(t, g)

	rs.replica.Pause()
	defer rs.replica.Resume()
	_, err = m.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotReplicated)
	var ae *distlock.ReplicaAckError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, 0, ae.Got, "replicas that acknowledged")
	_, ok := get(t, rs.primary, m.Key())
	assert.False(t, ok, "an unacknowledged acquisition left its lease behind")

	// The same holds after the script cache was flushed: the fallback to
	// EVAL is followed by WAIT on the same connection.
	rs.primary.MustDo("SCRIPT", "FLUSH")
	_, err = m.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotReplicated, "after SCRIPT FLUSH")

	rs.replica.Resume()
	rs.primary.MustDo("SCRIPT", "FLUSH")
	g, err = m.TryLock(t.Context())
	require.NoError(t, err, "after SCRIPT FLUSH, with the replica back")
	assert.Equal(t, distlock.Released, release(t, g))
}

func TestReplicaAckRenewal(t *testing.T) {
	rs := startReplicated(t)
	c := rs.primary.Client()
	const ttl = 1500 * time.Millisecond
	obs := &ackObserver{}
	m := newMutex(t, c, "renewed", distlock.WithTTL(ttl), distlock.WithReplicaAck(1, ackTimeout),
		distlock.WithObserver(obs), distlock.WithLogger(testLogger(t)))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	events := g.Subscribe(t.Context())
	require.Equal(t, distlock.Acquired, nextEvent(t, events).State)
	require.Eventually(t, func() bool { all, _ := obs.renewals(distlock.ErrNotReplicated); return all >= 1 },
		eventually, pollEvery, "no renewal")
	_, bad := obs.renewals(distlock.ErrNotReplicated)
	require.Zero(t, bad, "a renewal went unacknowledged with a healthy replica")

	// The replica stops acknowledging: the next renewal is applied on the
	// primary but does not count. It is reported and retried (L1b), and the
	// guard stays Acquired until the deadline of its last acknowledged
	// renewal; then it is Lost, for the renewals that kept failing.
	probe := startProbe(t, nil)
	paused := time.Now()
	rs.replica.Pause()
	ev := nextEvent(t, events)
	require.Equal(t, distlock.Acquired, ev.State, "a renewal that replicas did not acknowledge proves nothing")
	require.ErrorIs(t, ev.Err, distlock.ErrRenewFailed)
	assert.ErrorIs(t, ev.Err, distlock.ErrNotReplicated)
	var ae *distlock.ReplicaAckError
	require.ErrorAs(t, ev.Err, &ae)
	assert.Equal(t, "renew", ae.Op)
	assert.NoError(t, g.Context().Err(), "the guard's context lives while the lease holds")
	for ev.State == distlock.Acquired {
		ev = nextEvent(t, events)
	}
	require.Equal(t, distlock.Lost, ev.State)
	var le *distlock.LostError
	require.ErrorAs(t, ev.Err, &le)
	assert.Equal(t, distlock.LostRenewFailed, le.Reason)
	assert.ErrorIs(t, ev.Err, distlock.ErrNotReplicated)
	deadline := distlock.LeaseDeadline(g) // kept while Lost: the one that passed
	late := stepHops * probe.delay(paused, ev.Time)
	assert.False(t, ev.Time.Before(deadline), "Lost before the deadline of the last acknowledged renewal")
	assert.Less(t, ev.Time.Sub(deadline), late+slack, "Lost came late (%v explained by scheduling)", late)
	assert.ErrorIs(t, context.Cause(g.Context()), distlock.ErrNotReplicated)
	// The primary still holds our lease: nobody else can take it.
	_, err = newMutex(t, c, "renewed").TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired)

	// The replica is back: the next acknowledged renewal regains the lock.
	rs.replica.Resume()
	ev = nextEvent(t, events)
	require.Equal(t, distlock.Acquired, ev.State, "the guard should regain its lease")
	assert.Equal(t, distlock.Released, release(t, g))
}

// WithReplicaAck on a Semaphore: a granted permit is on the replica once
// Acquire returns; one the replicas did not acknowledge is taken back, and
// the permit is free again.
func TestReplicaAckSemaphore(t *testing.T) {
	rs := startReplicated(t)
	c := rs.primary.Client()
	s, err := distlock.NewSemaphore(c, "acked", 2, distlock.WithReplicaAck(1, ackTimeout))
	require.NoError(t, err)
	g, err := s.Acquire(t.Context())
	require.NoError(t, err)
	n, err := rs.replica.MustDo("ZCARD", s.Key()).AsInt64()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "the permit is on the replica after an acknowledged Acquire")
	assert.Equal(t, distlock.Released, release(t, g))

	s2, err := distlock.NewSemaphore(c, "two", 2, distlock.WithReplicaAck(2, ackTimeout))
	require.NoError(t, err)
	_, err = s2.TryAcquire(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotReplicated)
	n, err = rs.primary.MustDo("ZCARD", s2.Key()).AsInt64()
	require.NoError(t, err)
	assert.Zero(t, n, "an unacknowledged permit was left behind")
}
