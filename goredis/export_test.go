package goredis

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
