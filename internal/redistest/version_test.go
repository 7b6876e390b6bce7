package redistest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		info    map[string]string
		want    string
		sharded bool
	}{
		{map[string]string{"redis_version": "6.2.16"}, "redis 6.2.16", false},
		{map[string]string{"redis_version": "7.0.15"}, "redis 7.0.15", true},
		{map[string]string{"redis_version": "7.4.1"}, "redis 7.4.1", true},
		{map[string]string{"redis_version": "10.0.0"}, "redis 10.0.0", true},
		// Valkey gives its own name and version, and the Redis version it
		// is compatible with.
		{map[string]string{"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "8.0.1"}, "valkey 8.0.1", true},
	} {
		v, err := parseVersion(tc.info)
		require.NoError(t, err, "%v", tc.info)
		assert.Equal(t, tc.want, v.String())
		for _, f := range []Feature{ShardedPubSub, ExpireTime, ClusterPort} {
			assert.Equal(t, tc.sharded, v.Has(f), "%s has %v", v, f)
		}
	}
	_, err := parseVersion(map[string]string{"redis_version": "7.x"})
	assert.Error(t, err, "a version that is not numbers")
	_, err = parseVersion(map[string]string{})
	assert.Error(t, err, "no version")
}

func TestServerVersion(t *testing.T) {
	s := Start(t)
	v := s.Version()
	assert.NotEmpty(t, v.Number, "version of %s", v)
	// What the helpers assume of the server agrees with what it answers.
	_, err := s.Do(t.Context(), "PUBSUB", "SHARDCHANNELS")
	assert.Equal(t, v.Has(ShardedPubSub), err == nil, "%s: PUBSUB SHARDCHANNELS: %v", v, err)
	_, err = s.Do(t.Context(), "PEXPIRETIME", "k")
	assert.Equal(t, v.Has(ExpireTime), err == nil, "%s: PEXPIRETIME: %v", v, err)
	got, err := s.MustDo("CONFIG", "GET", "cluster-port").AsStrMap()
	require.NoError(t, err)
	_, known := got["cluster-port"]
	assert.Equal(t, v.Has(ClusterPort), known, "%s: CONFIG GET cluster-port: %v", v, got)
}
