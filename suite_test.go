package distlock_test

import (
	"sync"
	"testing"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/suite"
)

// The contract-level tests that do not depend on the client library live
// in internal/suite; these run them on rueidis. The goredis module runs
// the same groups on go-redis (goredis/suite_test.go).

// rueidisLib is rueidis as the suite uses it: clients built with
// distlock.NewMutex and its siblings, and the rooms counted by this
// package's own hook.
var rueidisLib = suite.Library{
	Name:    "rueidis",
	Connect: connectRueidis,
	Rooms:   distlock.RoomsOf,
}

// connectRueidis returns a rueidis client of the Redis that to names,
// built as an application would (client-side caching off, as in every
// test here), closed when tb's test ends.
func connectRueidis(tb testing.TB, to suite.Target) suite.Client {
	tb.Helper()
	opt := rueidis.ClientOption{DisableCache: true, Username: to.Username, Password: to.Password}
	switch {
	case to.Addr != "":
		opt.InitAddress = []string{to.Addr}
	case len(to.Cluster) > 0:
		opt.InitAddress = to.Cluster
	case to.Master != "":
		opt.InitAddress = to.Sentinels
		opt.Sentinel = rueidis.SentinelOption{MasterSet: to.Master}
	default:
		tb.Fatalf("suite target names no Redis: %+v", to)
	}
	rc, err := rueidis.NewClient(opt)
	if err != nil {
		tb.Fatalf("rueidis client for %+v: %v", to, err)
	}
	c := &rueidisClient{rc: rc}
	tb.Cleanup(c.Close)
	return c
}

// rueidisClient is a suite.Client on one rueidis client.
type rueidisClient struct {
	rc    rueidis.Client
	close sync.Once
}

func (c *rueidisClient) NewMutex(name string, opts ...distlock.Option) (*distlock.Mutex, error) {
	return distlock.NewMutex(c.rc, name, opts...)
}

func (c *rueidisClient) NewSemaphore(name string, permits int, opts ...distlock.Option) (*distlock.Semaphore, error) {
	return distlock.NewSemaphore(c.rc, name, permits, opts...)
}

func (c *rueidisClient) NewElection(name string, opts ...distlock.Option) (*distlock.Election, error) {
	return distlock.NewElection(c.rc, name, opts...)
}

func (c *rueidisClient) NewRWMutex(name string, opts ...distlock.Option) (*distlock.RWMutex, error) {
	return distlock.NewRWMutex(c.rc, name, opts...)
}

func (c *rueidisClient) Close() { c.close.Do(c.rc.Close) }

func TestSuiteMutex(t *testing.T)      { suite.Mutex(t, rueidisLib) }
func TestSuiteWaiting(t *testing.T)    { suite.Waiting(t, rueidisLib) }
func TestSuiteFaults(t *testing.T)     { suite.Faults(t, rueidisLib) }
func TestSuiteSemaphore(t *testing.T)  { suite.Semaphore(t, rueidisLib) }
func TestSuiteElection(t *testing.T)   { suite.Election(t, rueidisLib) }
func TestSuiteRWMutex(t *testing.T)    { suite.RWMutex(t, rueidisLib) }
func TestSuiteReplicaAck(t *testing.T) { suite.ReplicaAck(t, rueidisLib) }

// The Cluster and Sentinel groups spend most of their time waiting for
// servers of their own (a cluster's creation, a failover, the sentinels'
// vote), measure nothing of this process and count no rooms (the rooms of
// a lock are counted by name, whatever the client), so they run beside the
// other parallel tests, after the groups above, as in the goredis module.

func TestSuiteCluster(t *testing.T)  { t.Parallel(); suite.Cluster(t, rueidisLib) }
func TestSuiteSentinel(t *testing.T) { t.Parallel(); suite.Sentinel(t, rueidisLib) }
