// Package suite holds the contract-level tests of distlock that do not
// depend on the Redis client library: each takes a [Library], which makes
// distlock's primitives on one client library, and runs the same test on
// it. The distlock module runs them on rueidis (suite_test.go); the goredis
// module runs them on go-redis (goredis/suite_test.go). A test of behaviour
// that any client must show belongs here, not copied into each module.
//
// Each group ([Mutex], [Waiting], [Faults], [Semaphore], [Election],
// [RWMutex], [ReplicaAck], [Cluster], [Sentinel]) is one exported function
// that runs its tests as named subtests, against private redis-server
// processes (internal/redistest) that it starts itself. A module calls each
// group from a top-level test named TestSuite<Group>, so a subtest is named
// TestSuiteWaiting/InOrderAcrossProcesses, say, on both clients; SAFETY.md
// names them so, and TestSafetyTableNamesRealTests resolves such names
// against the t.Run calls of the group's function.
//
// A client of a Library stands for a process: waiters of two clients can
// learn of each other only through Redis, as waiters of two processes do.
// The groups do not call t.Parallel at the top (some measure the process's
// CPU time); the caller may run groups that measure nothing of the process
// in parallel.
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
	// names, which is closed when tb's test ends (tb.Cleanup). It fails tb
	// if the client cannot be made.
	Connect func(tb testing.TB, to Target) Client
	// RetriesOnItsOwn says that the library sends a command again on a
	// new connection when the connection it was sent on breaks (go-redis's
	// MaxRetries), so that a failure distlock would report shows as a slow
	// call instead.
	RetriesOnItsOwn bool
	// Rooms, if set, returns how many waiting rooms the process has for
	// the lock whose lease key is leaseKey, on any client. It is a hook of
	// the distlock package's own tests (export_test.go), so only the
	// distlock module can set it; the checks of W5 ("nothing left") then
	// count the rooms as well as the line, the waiters' keys and the
	// subscriptions in Redis. The rooms are the same code for every
	// client, so checking them on one is enough.
	Rooms func(leaseKey string) int
}

// Target says which Redis a client talks to: one node at Addr, a cluster
// of which Cluster lists some nodes, or the primary that Sentinels at
// Sentinels know as Master. Username and Password, if set, authenticate
// (to the Redis nodes; the sentinels need none).
//
// A client of a Target is built the way an application would build it,
// with the library's defaults, but for client-side caching, which is off
// (distlock needs none, and rueidis's cache would hold a connection per
// client for its invalidations).
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
