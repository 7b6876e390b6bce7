package distlock_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// The tests of WithReplicaAck against a primary with one replica are
// client-independent and live in internal/suite (TestSuiteReplicaAck);
// here is the option's validation, the same code for every client.

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
