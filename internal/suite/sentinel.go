package suite

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// Sentinel kills the primary of a primary + replica pair watched by three
// sentinels, while a lock is held, and looks at what the holder and a
// competitor see once the sentinels have promoted the replica. Holder and
// competitor reach Redis through the library's Sentinel client, as an
// application would. Its two subtests run in parallel: each waits seconds
// for the sentinels, on servers of its own.
//
// The replica replicates through a proxy, so a test can stop replication
// (blackhole the primary's stream) at a moment of its choosing: that makes
// the asynchronous-replication race of a real failover, where the last
// writes never reach the replica, happen every time.
func Sentinel(t *testing.T, lib Library) {
	t.Run("WithoutReplicaAckDoubleGrant", func(t *testing.T) { t.Parallel(); sentinelDoubleGrant(t, lib) })
	t.Run("WithReplicaAckLockSurvives", func(t *testing.T) { t.Parallel(); sentinelAckedLockSurvives(t, lib) })
}

// failoverWait bounds how long the sentinels may take to promote the
// replica: they deem the primary down after a second of silence, agree,
// elect a leader and promote, which takes two to three seconds on an idle
// machine.
const failoverWait = 20 * time.Second

// sentinelName is the name under which the sentinels know the primary.
const sentinelName = "distlock"

// sentinelled is a primary, its replica behind a proxy, and three sentinels.
type sentinelled struct {
	primary, replica *redistest.Server
	link             *faultproxy.Proxy // the replica's connection to the primary
	sentinels        *redistest.Sentinels
}

func startSentinelled(t *testing.T) *sentinelled {
	t.Helper()
	p := redistest.Start(t, "--repl-diskless-sync-delay", "0")
	link := faultproxy.New(t, p.Addr())
	r := redistest.StartReplica(t, p, link.Addr())
	g := redistest.StartSentinels(t, redistest.SentinelConfig{
		Name: sentinelName, Primary: p.Addr(), Count: 3, Quorum: 2, DownAfter: time.Second,
	}, 1)
	return &sentinelled{primary: p, replica: r, link: link, sentinels: g}
}

// target is the Target of a client of whatever primary the sentinels name.
func (s *sentinelled) target() Target {
	return Target{Master: sentinelName, Sentinels: s.sentinels.Addrs()}
}

// stopReplication makes the replica miss every write from now on, while
// its connection stays up.
func (s *sentinelled) stopReplication() { s.link.Set(faultproxy.Down, faultproxy.Blackhole) }

// failOver kills the primary and waits until the sentinels have promoted
// the replica.
func (s *sentinelled) failOver(t *testing.T) {
	t.Helper()
	s.primary.Kill()
	s.sentinels.WaitPrimary(s.replica)
}

// waitReaches waits until c, a Sentinel client, reaches a primary again
// after the failover (the only server left is the new primary): a TryLock
// of a lock of its own gets an answer.
func waitReaches(t *testing.T, c Client) {
	t.Helper()
	probe := newMutex(t, c, "reach-probe", distlock.WithTTL(time.Second))
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		g, err := probe.TryLock(ctx)
		if err != nil {
			return errors.Is(err, distlock.ErrNotAcquired)
		}
		_, _ = g.Release(ctx)
		return true
	}, failoverWait, 20*time.Millisecond, "the Sentinel client never reached the new primary")
}

func sentinelDoubleGrant(t *testing.T, lib Library) {
	s := startSentinelled(t)
	ca, cb := lib.Connect(t, s.target()), lib.Connect(t, s.target())
	// A long lease: the holder's next renewal comes well after the
	// failover, so nothing tells it that anything happened.
	a := newMutex(t, ca, "job", distlock.WithOwner("a"), distlock.WithTTL(30*time.Second))
	b := newMutex(t, cb, "job", distlock.WithOwner("b"))

	// The primary confirms the lease; the replica never receives it.
	s.stopReplication()
	ga, err := a.Lock(t.Context())
	require.NoError(t, err)
	assert.Empty(t, keysOn(t, s.replica, a.Key()+"*"), "the replica got the lease although replication was stopped")

	s.failOver(t)

	// The new primary has never heard of the lease: B gets the lock while
	// A still holds it, as far as A can tell. This is the double grant of
	// asynchronous replication.
	var gb *distlock.Guard
	require.Eventually(t, func() bool {
		gb, err = b.TryLock(t.Context())
		return err == nil
	}, failoverWait, 20*time.Millisecond, "B never got the lock after the failover: %v", err)
	// A's client watches for restarts from A's first moment: when that
	// watch sees the failover first (its subscription moves to the new
	// primary, and it has A renew at once), A is Lost by now, and there
	// was no double grant; otherwise both say Acquired, as asynchronous
	// replication allows. Either way B holds, with a higher token.
	if st := ga.State(); st == distlock.Acquired {
		t.Logf("double grant: A and B both Acquired after the failover")
	} else {
		assert.Equal(t, distlock.Lost, st, "A, the first holder: Acquired (a double grant) or Lost (its client saw the failover first)")
		t.Logf("A was Lost before B held: its client's restart watch saw the failover first")
	}
	assert.Equal(t, distlock.Acquired, gb.State(), "B, the second holder")
	// Fencing still orders them: B's token is higher, so a resource that
	// checks tokens refuses A's writes from now on.
	assert.Greater(t, gb.Token(), ga.Token(), "the second grant's token")

	// A learns of it the next time it reaches Redis: its renewal would be
	// refused, and so is its release, which leaves B's lease alone.
	waitReaches(t, ca)
	st, err := ga.Release(t.Context())
	require.NoError(t, err)
	assert.Equal(t, distlock.Lost, st, "A's release finds B's lease")
	value, ok := get(t, s.replica, b.Key())
	require.True(t, ok, "B's lease is gone")
	assert.Equal(t, "b", lease.Owner(value), "holder of the lease")
	assert.Equal(t, distlock.Released, release(t, gb))
}

func sentinelAckedLockSurvives(t *testing.T, lib Library) {
	s := startSentinelled(t)
	ca, cb := lib.Connect(t, s.target()), lib.Connect(t, s.target())
	obs := &ackObserver{}
	// The lease outlives the failover on the new primary even if no
	// renewal reaches it.
	const ttl = 9 * time.Second
	a := newMutex(t, ca, "job", distlock.WithOwner("a"), distlock.WithTTL(ttl),
		distlock.WithReplicaAck(1, ackTimeout), distlock.WithObserver(obs), distlock.WithLogger(testLogger(t)))
	b := newMutex(t, cb, "job", distlock.WithOwner("b"))

	// With replication stopped, an acquisition cannot be acknowledged: it
	// is undone and reported.
	s.stopReplication()
	_, err := a.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotReplicated)
	assert.Empty(t, keysOn(t, s.primary, a.Key()), "an unacknowledged lease was left on the primary")

	// Replication back; the acquisition returns only once the replica has
	// the lease.
	s.link.Heal()
	s.replica.WaitInSync(s.primary)
	ga, err := a.Lock(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []string{a.Key()}, keysOn(t, s.replica, a.Key()), "lease on the replica")

	s.failOver(t)

	// The lock survived the failover: B is refused, and told who holds it.
	require.Eventually(t, func() bool {
		_, err = b.TryLock(t.Context()) // fails to connect until B's client has followed
		return err == nil || errors.Is(err, distlock.ErrNotAcquired)
	}, failoverWait, 20*time.Millisecond)
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "B after the failover")
	var na *distlock.NotAcquiredError
	require.ErrorAs(t, err, &na)
	assert.Equal(t, "a", na.Holder)

	// What A sees: its renewals reach the new primary, which extends the
	// lease, but no replica is left to acknowledge them, so they do not
	// count. Each is reported and retried (L1b); A stays Acquired until
	// the deadline of its last acknowledged renewal and reports Lost then.
	// The lease stays with A in Redis.
	require.Eventually(t, func() bool { _, n := obs.renewals(distlock.ErrNotReplicated); return n > 0 },
		failoverWait, pollEvery, "no renewal reached the new primary")
	require.Eventually(t, func() bool { return ga.Context().Err() != nil }, ttl+eventually, pollEvery,
		"A never reported Lost without acknowledged renewals")
	assert.Equal(t, distlock.Lost, ga.State())
	assert.ErrorIs(t, context.Cause(ga.Context()), distlock.ErrLost)
	assert.ErrorIs(t, context.Cause(ga.Context()), distlock.ErrNotReplicated)
	_, err = b.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "B while A's lease is kept alive")

	// A gives up; B gets the lock.
	st, err := ga.Release(t.Context())
	assert.Equal(t, distlock.Lost, st, "A was Lost when it released")
	var gb *distlock.Guard
	if err != nil && lapsedDeleteTimedOut(err) {
		// The delete of a Lost lease is best effort, given a short time
		// (its client may still be following the failover on a loaded
		// machine); the lease, no longer renewed, expires within the TTL.
		t.Logf("A's release got no answer in its short time (%v): B waits for the lease to expire", err)
		ctx, cancel := context.WithTimeout(t.Context(), ttl+eventually)
		defer cancel()
		gb, err = b.Lock(ctx)
		require.NoError(t, err, "B after A's lease expired")
	} else {
		require.NoError(t, err)
		gb, err = b.TryLock(t.Context())
		require.NoError(t, err, "B after A released")
	}
	assert.Greater(t, gb.Token(), ga.Token())
	assert.Equal(t, distlock.Released, release(t, gb))
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
