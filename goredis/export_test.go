package goredis

import (
	"github.com/redis/go-redis/v9"

	"github.com/distkit-go/distlock/lease"
)

// Bridges to the adapter for the tests of package goredis_test, which run
// the lease protocol's own calls (lease.NewOn) on it.
var (
	NewRedis        = fromGoRedis
	ReplyOf         = reply
	ErrNoReplicaAck = errNoReplicaAck
)

// PipelinedEvals returns how many scripts went through a client's
// automatic pipeliner so far.
func PipelinedEvals() int64 { return pipelinedEvals.Load() }

// ShardingOf returns how the adapter of rdb says it spreads keys.
func ShardingOf(rdb redis.UniversalClient) lease.Sharding {
	return fromGoRedis(rdb).(lease.Topology).Sharding()
}
