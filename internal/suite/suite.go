// Package suite holds the contract-level tests of distlock that do not
// depend on the Redis client library: each takes a [Library], which makes
// distlock's primitives on one client library, and runs the same test on
// it. The distlock module runs them on rueidis; the goredis module runs
// them on go-redis. A test of behaviour that any client must show belongs
// here, not copied into each module.
package suite

import (
	"testing"

	"github.com/distkit-go/distlock"
)

// Library is one Redis client library, as the tests use it.
type Library struct {
	// Name names the library in test names and messages ("rueidis",
	// "go-redis").
	Name string
	// Connect returns a client of the library for the Redis that to
	// names, which is closed when tb's test ends (tb.Cleanup).
	Connect func(tb testing.TB, to Target) Client
}

// Target says which Redis a client talks to: one node at Addr, a cluster
// of which Cluster lists some nodes, or the primary that Sentinels at
// Sentinels know as Master. Username and Password, if set, authenticate.
type Target struct {
	Addr      string
	Cluster   []string
	Master    string
	Sentinels []string
	Username  string
	Password  string
}

// Client makes distlock's primitives on one client of a Library, with the
// library's public constructors (distlock.NewMutex for rueidis,
// goredis.NewMutex for go-redis).
type Client interface {
	NewMutex(name string, opts ...distlock.Option) (*distlock.Mutex, error)
	NewSemaphore(name string, permits int, opts ...distlock.Option) (*distlock.Semaphore, error)
	NewElection(name string, opts ...distlock.Option) (*distlock.Election, error)
	NewRWMutex(name string, opts ...distlock.Option) (*distlock.RWMutex, error)
	// Close closes the client now (the test's clean-up then does nothing).
	Close()
}
