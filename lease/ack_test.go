package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

func TestAckClient(t *testing.T) {
	// The lease client on its own: the ack outcome of each operation, and a
	// lease that was refused is not waited on as a failure.
	primary := redistest.Start(t, "--repl-diskless-sync-delay", "0")
	replica := redistest.StartReplica(t, primary, primary.Addr())
	c := primary.Client()
	lc, err := lease.NewWithAck(c, lease.Ack{Replicas: 1, Timeout: 300 * time.Millisecond})
	require.NoError(t, err)
	k, err := lease.NewKeys("ack", t.Name())
	require.NoError(t, err)
	ctx := t.Context()

	g, err := lc.Acquire(ctx, k, "a#1", 10*time.Second)
	require.NoError(t, err)
	require.True(t, g.Acquired)
	r, err := lc.Renew(ctx, k, "a#1", 10*time.Second)
	require.NoError(t, err)
	assert.True(t, r.OK)

	replica.Pause()
	defer replica.Resume()
	// Held by someone else: reported as held, whatever the replicas do.
	g, err = lc.Acquire(ctx, k, "b#1", 10*time.Second)
	require.NoError(t, err)
	assert.False(t, g.Acquired)
	assert.Equal(t, "a#1", g.Holder)
	// Refused renewals are refusals, not acknowledgement failures.
	r, err = lc.Renew(ctx, k, "b#1", 10*time.Second)
	require.NoError(t, err)
	assert.False(t, r.OK)
	// Our own renewal is applied but not acknowledged.
	_, err = lc.Renew(ctx, k, "a#1", 10*time.Second)
	require.ErrorIs(t, err, lease.ErrNotReplicated)

	// The caller's deadline cuts a long wait short, early enough for
	// Redis's answer to arrive in time: an acknowledgement failure, not a
	// call that ran out of time. WAIT gets three quarters of the budget; the
	// quarter left must cover a round trip on a loaded machine (100 ms of
	// a 400 ms budget did not, about once in twenty runs).
	patient, err := lease.NewWithAck(c, lease.Ack{Replicas: 1, Timeout: time.Minute})
	require.NoError(t, err)
	const budget = 2 * time.Second
	short, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	_, err = patient.Renew(short, k, "a#1", 10*time.Second)
	require.ErrorIs(t, err, lease.ErrNotReplicated, "rather than the context's deadline")

	// Release does not wait for replicas: through a client that would
	// wait a minute, it finishes well within a few seconds.
	quick, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rel, err := patient.Release(quick, k, "a#1")
	require.NoError(t, err)
	assert.True(t, rel.Deleted, "release")

	for _, bad := range []lease.Ack{{Replicas: -1, Timeout: time.Second}, {Replicas: 1}, {Replicas: 1, Timeout: time.Microsecond}} {
		_, err := lease.NewWithAck(c, bad)
		assert.ErrorIs(t, err, lease.ErrBadAck, "NewWithAck(%+v)", bad)
	}
}
