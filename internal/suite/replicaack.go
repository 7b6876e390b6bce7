package suite

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// ReplicaAck runs the tests of WithReplicaAck against a primary with one
// replica. A replica stopped with SIGSTOP stays connected but acknowledges
// nothing, which is what a lagging or partitioned replica looks like to
// the primary. WAIT counts the writes of its own connection, so these
// tests check above all that the library runs a script and its WAIT on one
// connection.
func ReplicaAck(t *testing.T, lib Library) {
	t.Run("Acquire", func(t *testing.T) { ackAcquire(t, lib) })
	t.Run("UsesTheWritingConnection", func(t *testing.T) { ackUsesTheWritingConnection(t, lib) })
	t.Run("Renewal", func(t *testing.T) { ackRenewal(t, lib) })
	t.Run("Semaphore", func(t *testing.T) { ackSemaphore(t, lib) })
	t.Run("PassedLeaseNeedsAnAcknowledgedClaim", func(t *testing.T) { ackPassedLease(t, lib) })
}

// replicated is a primary with one replica.
type replicated struct {
	primary, replica *redistest.Server
}

func startReplicated(t *testing.T) replicated {
	t.Helper()
	p := redistest.Start(t, "--repl-diskless-sync-delay", "0")
	return replicated{primary: p, replica: redistest.StartReplica(t, p, p.Addr())}
}

func ackAcquire(t *testing.T, lib Library) {
	rs := startReplicated(t)
	c := connect(t, lib, rs.primary)
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

// WAIT counts the writes of its own connection. Sent on any other
// connection (one that never wrote, or whose writes replicated long ago),
// it would return at once with the replica counted, although the replica
// never received the lease. A stopped replica tells the two apart.
func ackUsesTheWritingConnection(t *testing.T, lib Library) {
	rs := startReplicated(t)
	m := newMutex(t, connect(t, lib, rs.primary), "stalled", distlock.WithReplicaAck(1, ackTimeout))

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

// A renewal the replica did not acknowledge is applied on the primary but
// does not count: it is reported and retried (L1b), and the guard stays
// Acquired until the deadline of its last acknowledged renewal; then it is
// Lost, for the renewals that kept failing. Once the replica is back, the
// next acknowledged renewal regains the lock.
func ackRenewal(t *testing.T, lib Library) {
	rs := startReplicated(t)
	p := startSchedProbe(t)
	c := connect(t, lib, rs.primary)
	const ttl = 1500 * time.Millisecond
	obs := &renewWatch{}
	m := newMutex(t, c, "renewed", distlock.WithTTL(ttl), distlock.WithReplicaAck(1, ackTimeout),
		distlock.WithObserver(obs), distlock.WithLogger(testLogger(t)))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	events := g.Subscribe(t.Context())
	require.Equal(t, distlock.Acquired, nextEvent(t, events).State)
	require.Eventually(t, func() bool { renewed, _, _ := obs.counts(); return renewed >= 1 },
		eventually, pollEvery, "no acknowledged renewal")
	_, failed, _ := obs.counts()
	require.Zero(t, failed, "a renewal went unacknowledged with a healthy replica")

	w := watch(g)
	rs.replica.Pause()
	ev := nextEvent(t, events)
	require.Equal(t, distlock.Acquired, ev.State, "a renewal that replicas did not acknowledge proves nothing")
	require.ErrorIs(t, ev.Err, distlock.ErrRenewFailed)
	assert.ErrorIs(t, ev.Err, distlock.ErrNotReplicated)
	var ae *distlock.ReplicaAckError
	require.ErrorAs(t, ev.Err, &ae)
	assert.Equal(t, "renew", ae.Op)
	assert.NoError(t, g.Context().Err(), "the guard's context lives while the lease holds")
	ev = untilState(t, events, distlock.Lost, eventually, "with the replica stopped")
	w.end()
	assert.Equal(t, distlock.LostRenewFailed, lostReason(t, ev))
	assert.ErrorIs(t, ev.Err, distlock.ErrNotReplicated)
	// The deadline of the last acknowledged renewal passed: not before it,
	// and soon after (the event comes from the guard's goroutine).
	deadline := w.lastDeadline
	assert.False(t, ev.Time.Before(deadline), "Lost %v before the deadline of the last acknowledged renewal", deadline.Sub(ev.Time))
	assertSoon(t, p, deadline, ev.Time.Sub(deadline), slack, "the Lost event after the deadline of the last acknowledged renewal")
	assert.True(t, w.lastAcquired.Before(deadline), "Acquired %v after the deadline", w.lastAcquired.Sub(deadline))
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
func ackSemaphore(t *testing.T, lib Library) {
	rs := startReplicated(t)
	c := connect(t, lib, rs.primary)
	s := newSemaphore(t, c, "acked", 2, distlock.WithReplicaAck(1, ackTimeout))
	g, err := s.Acquire(t.Context())
	require.NoError(t, err)
	n, err := rs.replica.MustDo("ZCARD", s.Key()).AsInt64()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "the permit is on the replica after an acknowledged Acquire")
	assert.Equal(t, distlock.Released, release(t, g))

	s2 := newSemaphore(t, c, "two", 2, distlock.WithReplicaAck(2, ackTimeout))
	_, err = s2.TryAcquire(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotReplicated)
	n, err = rs.primary.MustDo("ZCARD", s2.Key()).AsInt64()
	require.NoError(t, err)
	assert.Zero(t, n, "an unacknowledged permit was left behind")
}

// A waiter passed the lock reports Acquired only after a write of its own
// that the replicas acknowledged. With the replica stopped, the claim is
// not acknowledged, Lock fails, and the lock goes on to the next waiter at
// once.
func ackPassedLease(t *testing.T, lib Library) {
	rs := startReplicated(t)
	c := connect(t, lib, rs.primary)
	g, err := newMutex(t, c, "acked", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	key := g.Key()
	acked := lockAsync(t, t.Context(), newMutex(t, connect(t, lib, rs.primary), "acked", distlock.WithReplicaAck(1, ackTimeout)))
	waitInLine(t, rs.primary, key, 1)
	next := lockAsync(t, t.Context(), newMutex(t, connect(t, lib, rs.primary), "acked", distlock.WithTTL(longTTL)))
	waitInLine(t, rs.primary, key, 2)

	rs.replica.Pause()
	released := time.Now()
	release(t, g)
	o := await(t, acked, promptly+ackTimeout, "the waiter that needs an acknowledgement")
	rs.replica.Resume()
	require.ErrorIs(t, o.err, distlock.ErrNotReplicated, "with the replica stopped")
	o = await(t, next, promptly+ackTimeout, "the next waiter")
	require.NoError(t, o.err)
	t.Logf("the next waiter acquired %v after the release", o.at.Sub(released))
	release(t, o.g)

	// With the replica running, the waiter's Lock returns only once the
	// replica has its lease.
	g, err = newMutex(t, c, "acked", distlock.WithTTL(longTTL)).Lock(t.Context())
	require.NoError(t, err)
	acked = lockAsync(t, t.Context(), newMutex(t, connect(t, lib, rs.primary), "acked", distlock.WithReplicaAck(1, ackTimeout)))
	waitInLine(t, rs.primary, key, 1)
	release(t, g)
	o = await(t, acked, promptly, "the acknowledged waiter")
	require.NoError(t, o.err)
	value, ok := get(t, rs.replica, key)
	require.True(t, ok, "the lease is not on the replica although Lock returned")
	primaryValue, _ := get(t, rs.primary, key)
	assert.Equal(t, primaryValue, value)
	release(t, o.g)
	requireNothingLeft(t, lib, rs.primary, key)
}
