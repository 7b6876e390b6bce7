// Package goredis makes distlock's locks on a go-redis client
// (github.com/redis/go-redis/v9), for services that talk to Redis through
// go-redis already: they keep the one client they have configured (TLS,
// ACL user, Sentinel or Cluster addresses, pool sizes) instead of adding a
// rueidis client for distlock alone. It is a module of its own, so that
// distlock itself never depends on go-redis.
//
// # Quick start
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	defer rdb.Close()
//
//	m, err := goredis.NewMutex(rdb, "customer-42", distlock.WithTTL(10*time.Second))
//	if err != nil { ... } // bad input: errors.Is(err, distlock.ErrInvalidOption)
//
//	g, err := m.Lock(ctx)
//	if err != nil { ... }
//	defer g.Release(context.WithoutCancel(ctx))
//	return applyPayments(g.Context(), g.Token())
//
// [NewMutex], [NewSemaphore], [NewElection], [NewRWMutex] and
// [NewMultiMutex] take any redis.UniversalClient: redis.NewClient for one
// Redis, redis.NewFailoverClient behind Sentinel, redis.NewClusterClient
// for Redis Cluster (and redis.NewUniversalClient, which returns one of
// those). They
// return the usual distlock types, and everything after the constructor is
// the same distlock code as on rueidis: the guarantees, the renewal, the
// line that waiters stand in, the events, and distlock's documentation of
// them. A nil client is refused with the error distlock gives for one
// (errors.Is(err, distlock.ErrInvalidOption)), never a panic.
//
// # Mixed fleets
//
// Processes on rueidis and processes on go-redis share one lock: the keys,
// the Lua scripts, the values written and the pub/sub channels are the
// same, so they stand in one line, first come first served across both,
// a release on one wakes a waiter on the other, and the fencing tokens
// form one increasing sequence. A fleet can move from one client to the
// other a process at a time.
//
// # Versions
//
// The module's go.mod requires go-redis v9.23.0, which Go's module
// selection makes the least version a build gets. Two floors are behind
// that: v9.22 adds the automatic pipeliner that concurrent scripts are sent
// through (see the Eval method's notes in goredis.go; a plain call per
// script halved the rate of 64 goroutines on 64 keys), and v9.20 is the
// first that resubscribes sharded pub/sub at the right node. Waiters are woken through
// sharded pub/sub (SSUBSCRIBE), which on a Cluster must reach the node
// that owns the channel's slot. Before v9.20, a go-redis PubSub that
// reconnected after a connection error sent its SSUBSCRIBE to a random
// node, which answered MOVED unread, and the subscription looked healthy
// while it heard nothing (go-redis issue 3806, fixed in v9.20.0). This
// package never keeps a re-established subscription (see Pub/sub below):
// it closes a PubSub at its first connection error, and go-redis's own
// re-subscription, made before Receive reports the error, is closed with
// it. With v9.20 that brief re-subscription at least goes to the channel's
// node rather than opening a stray connection to a random one, and v9.20 is
// the floor the module is tested against.
//
// # The send time of a lease
//
// distlock counts a lease from the moment just before it hands the command
// that wrote it to the client, and gives it up a safety margin before Redis
// could expire it. Whatever the client does after that moment only sends the
// command later, and Redis counts the TTL from when the command runs, so a
// delay can only make the holder's deadline earlier than Redis's, never
// later. go-redis delays a command in several ways of its own: it re-dials
// a broken connection, follows cluster redirections (MOVED, ASK) and
// retries errors it deems transient (CLUSTERDOWN, LOADING, TRYAGAIN, a
// connection closed under it) up to MaxRetries times, with a back-off
// between MinRetryBackoff and MaxRetryBackoff. None of that is unsafe, but
// all of it is taken out of the usable lease: a command that is granted
// after a slow retry leaves the holder less of its TTL, and one granted
// after the lease deadline is not trusted (distlock asks again). Where a
// TTL is short, keep go-redis's retries shorter: MaxRetries times
// MaxRetryBackoff (3 times 1 s by default), plus DialTimeout for a re-dial,
// should stay well under a third of the TTL, which is when distlock renews.
// This package adds nothing of its own before the send: no goroutine and
// no round trip (with WithReplicaAck on a Cluster, it looks the slot's
// primary up in go-redis's cached layout first, and follows a redirection
// only after the first send). Any delay before the send would only shorten
// the lease as well, never lengthen it.
//
// go-redis may also send a script a second time after a connection broke
// before its reply arrived (MaxRetries). Every distlock script is written to
// be repeated with the same value: a repeated acquisition finds its own
// value and is granted again, a repeated renewal extends its own lease.
//
// # Contexts and timeouts
//
// go-redis does not watch a context's cancellation while a command waits
// for its reply; it honours a context's deadline only with
// Options.ContextTimeoutEnabled, and waits ReadTimeout (3 s by default)
// otherwise, and for a pipeline (WithReplicaAck's) up to MaxRetries more
// times that, since it sends a pipeline again after a read timeout. distlock
// does not depend on it: a Lock, TryLock or Release whose context ends
// returns at once, and the command goes on in the background until
// go-redis is done with it (distlock.Settle waits for such work).
// Meanwhile the command keeps its connection. Setting ContextTimeoutEnabled
// ends such commands at their context's deadline, which distlock sets no
// later than the end of the lease.
//
// # Pub/sub
//
// Each waiting room (one per lock, per process and per client; see
// distlock's "Waiting without polling") subscribes on a go-redis PubSub of
// its own, and so on a connection of its own from the client's pub/sub
// pool; on a Cluster, at the primary that owns the lock's slot (at a
// replica of it with ClusterOptions.ReadOnly, which receives the sharded
// messages as well). go-redis's PubSub re-dials and subscribes again on its
// own after a connection error; this package never uses such a
// re-established subscription, since messages sent in between were missed:
// it ends the subscription, and distlock subscribes again and has every
// waiter ask Redis once. A server that ends a subscription (a slot that
// moves away, CLIENT KILL) is handled the same way. Where pub/sub is
// refused (an ACL without the channels, a proxy that does not pass
// SSUBSCRIBE), waiters poll, as on rueidis.
//
// Two limits of go-redis show here. A PubSub read through Receive, as
// here, sends no pings: a subscription on a path that died without a word
// is noticed by TCP keep-alive only; meanwhile every waiter still refreshes
// its place every half claim window, and finds then a grant passed to it.
// And when a subscription's context ends while go-redis sets up its
// connection to a server that accepts connections but does not answer (a
// stopped process), or dials it with TLS (which go-redis does without the
// context), go-redis holds the PubSub until that times out (ReadTimeout,
// DialTimeout). A waiting room that closes then waits that long for its
// subscription to end; the waiters in it are not delayed.
//
// # WithReplicaAck
//
// distlock.WithReplicaAck sends WAIT after each acquisition and renewal, on
// the connection that made the write (WAIT counts the writes of its own
// connection). That needs a client that says which connection that is: a
// *redis.Client (NewClient, and NewFailoverClient behind Sentinel), where
// the script and WAIT go in one pipeline, or a *redis.ClusterClient, where
// they go in one pipeline to the primary that owns the lock's slot,
// following MOVED and ASK by hand (at most five). On a *redis.Ring, or a
// wrapper of a client, such calls fail with an error that says so
// ("goredis: WithReplicaAck needs a *redis.Client ..."). go-redis reads a pipeline's replies under the
// client's ReadTimeout, so when WAIT's timeout is half the ReadTimeout or
// more, the pipeline runs on a clone of the client (Client.WithTimeout,
// which shares its pools) that waits longer.
//
// # Goroutines
//
// This package starts no goroutine of its own but one: when a
// subscription's context ends, context.AfterFunc runs the close of its
// PubSub in a goroutine, which the subscription waits for before it
// returns. (Following a cluster redirection with WithReplicaAck, go-redis's
// ForEachMaster runs a goroutine per primary and waits for them.)
// distlock's goroutines (a guard's renewals, a waiting room's subscription,
// a call whose caller gave up) end as distlock documents; go-redis's (its
// pools' background work) end when the client is closed. Close a client
// after the last guard made with it has ended, and after distlock.Settle
// when the process exits.
package goredis
