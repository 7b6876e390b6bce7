package goredis_test

import (
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/goredis"
	"github.com/distkit-go/distlock/internal/suite"
)

// The contract-level tests that do not depend on the client library live
// in distlock's internal/suite; these run them on go-redis, as distlock's
// own suite_test.go runs them on rueidis, under the same names.

// goredisLib is go-redis as the suite uses it: clients built as an
// application builds them, with go-redis's defaults, and distlock's
// primitives made by this package's constructors. The rooms of the
// process cannot be counted from this module (that hook is distlock's
// own), so the checks of W5 look at Redis alone here; the rooms are the
// same code on both clients, and the rueidis run counts them.
var goredisLib = suite.Library{
	Name:            "go-redis",
	Connect:         connectGoRedis,
	RetriesOnItsOwn: true,
}

// connectGoRedis returns a go-redis client of the Redis that to names
// (redis.NewClient, NewClusterClient or NewFailoverClient), closed when
// tb's test ends.
func connectGoRedis(tb testing.TB, to suite.Target) suite.Client {
	tb.Helper()
	var rdb redis.UniversalClient
	switch {
	case to.Addr != "":
		rdb = redis.NewClient(&redis.Options{Addr: to.Addr, Username: to.Username, Password: to.Password})
	case len(to.Cluster) > 0:
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: to.Cluster, Username: to.Username, Password: to.Password})
	case to.Master != "":
		rdb = redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: to.Master, SentinelAddrs: to.Sentinels, Username: to.Username, Password: to.Password,
		})
	default:
		tb.Fatalf("suite target names no Redis: %+v", to)
	}
	c := &goredisClient{rdb: rdb}
	tb.Cleanup(c.Close)
	return c
}

// goredisClient is a suite.Client on one go-redis client.
type goredisClient struct {
	rdb   redis.UniversalClient
	close sync.Once
}

func (c *goredisClient) NewMutex(name string, opts ...distlock.Option) (*distlock.Mutex, error) {
	return goredis.NewMutex(c.rdb, name, opts...)
}

func (c *goredisClient) NewSemaphore(name string, permits int, opts ...distlock.Option) (*distlock.Semaphore, error) {
	return goredis.NewSemaphore(c.rdb, name, permits, opts...)
}

func (c *goredisClient) NewElection(name string, opts ...distlock.Option) (*distlock.Election, error) {
	return goredis.NewElection(c.rdb, name, opts...)
}

func (c *goredisClient) NewRWMutex(name string, opts ...distlock.Option) (*distlock.RWMutex, error) {
	return goredis.NewRWMutex(c.rdb, name, opts...)
}

func (c *goredisClient) Close() { c.close.Do(func() { _ = c.rdb.Close() }) }

func TestSuiteMutex(t *testing.T)      { suite.Mutex(t, goredisLib) }
func TestSuiteWaiting(t *testing.T)    { suite.Waiting(t, goredisLib) }
func TestSuiteFaults(t *testing.T)     { suite.Faults(t, goredisLib) }
func TestSuiteSemaphore(t *testing.T)  { suite.Semaphore(t, goredisLib) }
func TestSuiteElection(t *testing.T)   { suite.Election(t, goredisLib) }
func TestSuiteRWMutex(t *testing.T)    { suite.RWMutex(t, goredisLib) }
func TestSuiteReplicaAck(t *testing.T) { suite.ReplicaAck(t, goredisLib) }

// The Cluster and Sentinel groups spend most of their time waiting for
// servers of their own (a cluster's creation, a failover, the sentinels'
// vote) and measure nothing of this process, so they run beside each
// other, after the groups above: the suite stays within a minute.

func TestSuiteCluster(t *testing.T)  { t.Parallel(); suite.Cluster(t, goredisLib) }
func TestSuiteSentinel(t *testing.T) { t.Parallel(); suite.Sentinel(t, goredisLib) }
