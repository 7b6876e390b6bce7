package distlock_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/distlocktest"
)

// The Election's tests against redis-server are client-independent and live
// in internal/suite (TestSuiteElection); here are the checks of its input.

func TestElectionRefusesBadInput(t *testing.T) {
	srv := distlocktest.New(t)
	_, err := distlock.NewElection(srv.Client(), "lead", distlock.WithOwner("me"))
	var oe *distlock.OptionError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "owner", oe.Field)
	e, err := distlock.NewElection(srv.Client(), "lead")
	require.NoError(t, err)
	for _, v := range []string{"", "a\nb", string(make([]byte, 300))} {
		_, err := e.Campaign(t.Context(), v)
		var ae *distlock.ArgumentError
		require.ErrorAs(t, err, &ae, "value %q", v)
		assert.Equal(t, "value", ae.Arg)
		assert.ErrorIs(t, err, distlock.ErrInvalidArgument)
		assert.True(t, strings.HasPrefix(err.Error(), "distlock: value "), "the error names what the API calls it: %q", err)
		assert.NotContains(t, err.Error(), "owner", "value %q", v)
	}
	_, err = e.Campaign(t.Context(), "")
	assert.EqualError(t, err, "distlock: value is empty")
	//lint:ignore SA1012 testing the nil check
	_, err = e.Campaign(nil, "v")
	assert.ErrorIs(t, err, distlock.ErrInvalidArgument)
	//lint:ignore SA1012 testing the nil check
	_, ok := <-e.Observe(nil)
	assert.False(t, ok, "Observe(nil) returns a closed channel")

	// A semaphore of the same name is not an election.
	s, err := distlock.NewSemaphore(srv.Client(), "lead", 2)
	require.NoError(t, err)
	g, err := s.TryAcquire(t.Context())
	require.NoError(t, err)
	_, err = e.Leader(t.Context())
	assert.ErrorIs(t, err, distlock.ErrNotElection)
	_, err = g.Release(t.Context())
	require.NoError(t, err)
}
