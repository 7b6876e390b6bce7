package distlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// TestYoungHolderNoticesARestart restarts Redis empty half a second after
// a Lock with the default TTL, while another client waits for the lock:
// the holder, ten seconds before its first renewal, is watched by its
// client's keeper all the same, so it is Lost within a round trip or two
// of the server answering again, and the waiter then holds the lock with
// a larger token.
func TestYoungHolderNoticesARestart(t *testing.T) {
	const (
		// The promise: every holder learns of the restart within this of
		// the server answering. Without the keeper's watch of young guards
		// it took 9.4 s (the first renewal, a third of the TTL in).
		within    = 500 * time.Millisecond
		restartIn = 500 * time.Millisecond // after the Lock
		waitBound = 10 * time.Second       // for the waiter, and for the loss on a stalled machine
	)
	srv := redistest.Start(t)
	holder, err := distlock.NewMutex(srv.Client(), "young")
	require.NoError(t, err)
	waiter, err := distlock.NewMutex(srv.Client(), "young")
	require.NoError(t, err)
	g, err := holder.Lock(t.Context())
	require.NoError(t, err)
	locked := time.Now()

	type result struct {
		g   *distlock.Guard
		err error
	}
	waited := make(chan result, 1)
	wctx, cancel := context.WithTimeout(t.Context(), waitBound+restartIn)
	defer cancel()
	go func() {
		wg, err := waiter.Lock(wctx)
		waited <- result{wg, err}
	}()

	time.Sleep(time.Until(locked.Add(restartIn))) // the scenario's timing, not a synchronisation
	srv.Restart()
	answering := time.Now() // Restart returns once the new server answers
	select {
	case <-g.Context().Done():
	case <-time.After(waitBound):
	}
	took := time.Since(answering)
	require.Equal(t, distlock.Lost, g.State(), "the holder after the restart (%v)", took)
	var lost *distlock.LostError
	require.ErrorAs(t, context.Cause(g.Context()), &lost)
	assert.Equal(t, distlock.LostRefused, lost.Reason, "the renewal found the lease gone")
	t.Logf("the young holder was Lost %v after the server answered again", took)
	assert.Less(t, took, within, "the holder learnt of the restart late")

	r := <-waited
	require.NoError(t, r.err, "the waiter after the restart")
	assert.Greater(t, r.g.Token(), g.Token(), "the waiter's token after the restart")
	assert.Equal(t, distlock.Acquired, r.g.State())
	_, err = r.g.Release(t.Context())
	require.NoError(t, err)
	st, err := g.Release(t.Context())
	require.NoError(t, err)
	assert.Equal(t, distlock.Lost, st)
}
