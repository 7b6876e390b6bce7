package distlock

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNoHandoffToAWaiterThatWaitsForReplicas(t *testing.T) {
	// A hand-off writes the waiter's lease without waiting for replicas, so
	// a waiter with WithReplicaAck must acquire on its own, through the
	// store's Acquire (which waits for them), after the release.
	synctest.Test(t, func(t *testing.T) {
		defer settle()
		f := &fakeStore{}
		ack := WithReplicaAck(1, 100*time.Millisecond)
		g1, err := fakeMutex(t, f, ack).Lock(t.Context())
		require.NoError(t, err)
		var wg sync.WaitGroup
		got := lockAsync(t.Context(), fakeMutex(t, f, ack), &wg)
		synctest.Wait() // the waiter stands at the head, its offer posted
		before := f.calls()

		_, err = g1.Release(t.Context())
		require.NoError(t, err)
		g2 := <-got
		require.NotNil(t, g2)
		assert.Zero(t, f.handoffs, "the lock was handed to a waiter that waits for replicas")
		assert.Equal(t, before+1, f.calls(), "the waiter should have acquired on its own")
		assert.Greater(t, g2.Token(), g1.Token())
		_, err = g2.Release(t.Context())
		require.NoError(t, err)
		wg.Wait()
	})
}
