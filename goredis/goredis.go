package goredis

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/lease"
)

// NewMutex returns the lock named name, kept in the Redis that rdb talks
// to. It is [distlock.NewMutex] on a go-redis client: the name, the options
// and the Mutex it returns are the same. A nil rdb, or a nil pointer in it,
// is refused as distlock refuses a nil client: the error matches
// [distlock.ErrInvalidOption] and is a [*distlock.OptionError] for the
// field "client". The Mutex does not own rdb; close rdb after the last
// guard made with it has ended.
func NewMutex(rdb redis.UniversalClient, name string, opts ...distlock.Option) (*distlock.Mutex, error) {
	return distlock.NewMutexOn(fromGoRedis(rdb), name, opts...)
}

// NewSemaphore returns the semaphore of permits permits named name, kept in
// the Redis that rdb talks to. It is [distlock.NewSemaphore] on a go-redis
// client, and refuses a nil client as [NewMutex] does.
func NewSemaphore(rdb redis.UniversalClient, name string, permits int, opts ...distlock.Option) (*distlock.Semaphore, error) {
	return distlock.NewSemaphoreOn(fromGoRedis(rdb), name, permits, opts...)
}

// NewElection returns the election named name, kept in the Redis that rdb
// talks to. It is [distlock.NewElection] on a go-redis client, and refuses
// a nil client as [NewMutex] does.
func NewElection(rdb redis.UniversalClient, name string, opts ...distlock.Option) (*distlock.Election, error) {
	return distlock.NewElectionOn(fromGoRedis(rdb), name, opts...)
}

// NewRWMutex returns the read-write lock named name, kept in the Redis that
// rdb talks to. It is [distlock.NewRWMutex] on a go-redis client, and
// refuses a nil client as [NewMutex] does.
func NewRWMutex(rdb redis.UniversalClient, name string, opts ...distlock.Option) (*distlock.RWMutex, error) {
	return distlock.NewRWMutexOn(fromGoRedis(rdb), name, opts...)
}

// NewMultiMutex returns one lock over all of names, kept in the Redis that
// rdb talks to: its Lock holds every name or none. It is
// [distlock.NewMultiMutex] on a go-redis client: each name is the same lock
// as a Mutex of that name, whichever client the Mutex uses, and the names,
// the options and the MultiMutex it returns are distlock's. It refuses a
// nil client as [NewMutex] does.
func NewMultiMutex(rdb redis.UniversalClient, names []string, opts ...distlock.Option) (*distlock.MultiMutex, error) {
	return distlock.NewMultiMutexOn(fromGoRedis(rdb), names, opts...)
}

// fromGoRedis returns the lease.Redis of rdb, or nil for a nil client (an
// interface that is nil or holds a nil pointer), which distlock refuses.
func fromGoRedis(rdb redis.UniversalClient) lease.Redis {
	if isNil(rdb) {
		return nil
	}
	return &adapter{rdb: rdb}
}

// isNil reports whether rdb is nil or holds a nil pointer (or another nil
// value of a kind that can be nil), on which any call would panic.
func isNil(rdb redis.UniversalClient) bool {
	if rdb == nil {
		return true
	}
	switch v := reflect.ValueOf(rdb); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}

// adapter is distlock's seam (lease.Redis) on a go-redis client. Eval and
// Subscribe use rdb as any go-redis caller does, so that go-redis routes
// them (by the first key's slot, or the channel's, on a Cluster) and
// follows MOVED and ASK itself; EvalWait picks the connection itself (see
// wait.go). The adapter adds nothing before a command is sent: no
// goroutine and no round trip of its own.
//
// There is no EvalDedicated. rueidis needs one because a command on its
// shared connections may start a dial that its Close does not see; a
// go-redis pool's Close closes the connections it has handed out as well,
// and a dial that ends after Close finds the pool closed and closes its
// connection.
type adapter struct {
	rdb redis.UniversalClient
}

// Identity returns the go-redis client itself: locks made on one client
// share a waiting room per lock, and its subscription.
func (r *adapter) Identity() any { return r.rdb }

// Eval runs s with EVALSHA, and with EVAL and s's body when Redis answers
// NOSCRIPT (as redis.Script.Run does, without hashing the body again).
// go-redis follows MOVED and ASK on a Cluster, and retries the errors it
// deems transient (MaxRetries), TRYAGAIN among them; whatever is left is
// returned.
//
// A script sent while more than pipelineAbove others are in flight in
// this process goes through the client's automatic pipeliner
// (rdb.AutoPipeline, go-redis v9.22 and later), which writes the commands
// of concurrent callers to one connection in one batch, as rueidis does
// with every command. A plain go-redis call takes a connection of the pool
// for itself and makes a write of its own: with 64 goroutines locking 64
// keys, that cost Redis 21–23 µs of CPU per lock and release against
// 10–11 µs batched, and halved the rate (BENCHMARKS.md). With fewer in
// flight the scripts go the plain way: the pipeliner's hand-off to its
// own goroutines then only adds to each round trip, and sending through it
// from the second call in flight on cut the rate of 8 goroutines taking
// turns on one lock to a third. Both ways send the same command; they differ in what shares
// its write. The pipeliner runs a queued command on a context of its own,
// not the caller's, which costs distlock nothing: a call that its caller
// may give up on runs in a goroutine of distlock's, and the lease is dated
// from before the call either way (see the package documentation). If the
// client refuses to make a pipeliner (an invalid AutoPipelineOptions),
// every script goes the plain way.
func (r *adapter) Eval(ctx context.Context, s *lease.Script, keys, args []string) lease.Reply {
	argv := argValues(args)
	var c redis.Scripter = r.rdb
	if evalsInFlight.Add(1) > pipelineAbove {
		if ap, err := r.rdb.AutoPipeline(); err == nil {
			c = ap
			pipelinedEvals.Add(1)
		}
	}
	defer evalsInFlight.Add(-1)
	var cmd *redis.Cmd
	for redirects := 0; ; redirects++ {
		cmd = c.EvalSha(ctx, s.SHA1(), keys, argv...)
		if isNoScript(cmd.Err()) {
			cmd = c.Eval(ctx, s.Source(), keys, argv...)
		}
		// go-redis follows MOVED and ASK itself, but counts its retries of
		// TRYAGAIN against the same MaxRedirects: during a slot migration
		// those can use them up, and the MOVED that ends the migration
		// comes back here. The command did not run; go-redis has learnt
		// the slot's new owner from the reply, so sending it again goes
		// there.
		if redirects == maxRedirects || ctx.Err() != nil || !isRedirect(cmd.Err()) {
			return reply(cmd)
		}
	}
}

// isRedirect reports whether err is a cluster redirection, MOVED or ASK.
func isRedirect(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK"))
}

// evalsInFlight counts the scripts of this process that are being sent or
// awaited, on any client: a hint that batching pays, not a count that
// anything relies on. One counter per process rather than per client, so
// that it keeps nothing of a client that has been closed. pipelinedEvals
// counts the scripts sent through a pipeliner, for the tests.
var evalsInFlight, pipelinedEvals atomic.Int64

// argValues returns args as go-redis takes them. go-redis copies the values
// into the command it builds, so the slice is not kept.
func argValues(args []string) []any {
	argv := make([]any, len(args))
	for i, a := range args {
		argv[i] = a
	}
	return argv
}

// isNoScript reports whether err is Redis's NOSCRIPT: EVALSHA named a
// script that the node does not have. go-redis gives it as redis.ErrNoScript
// when it has read the reply itself, and as the server's error otherwise
// (inside a pipeline).
func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// reply converts the outcome of a script to a lease.Reply: redis.Nil (a Lua
// false or nil) is a nil reply, an error reply of Redis a *lease.ReplyError,
// any other error (no reply: a broken connection, a deadline, a closed
// client) stays as it is.
func reply(cmd *redis.Cmd) lease.Reply {
	v, err := cmd.Result()
	if err != nil {
		if errors.Is(err, redis.Nil) {
			return lease.NilReply()
		}
		return lease.ErrorReply(replyError(err))
	}
	return value(v)
}

// value converts one value of a go-redis reply: the RESP2 shapes that Lua
// scripts return (the scripts never switch to RESP3 replies). An integer, the
// reply of the common cases, costs no allocation.
func value(v any) lease.Reply {
	switch v := v.(type) {
	case int64:
		return lease.IntReply(v)
	case string:
		return lease.StringReply(v)
	case nil:
		return lease.NilReply()
	case []any:
		arr := make([]lease.Reply, len(v))
		for i, e := range v {
			arr[i] = value(e)
		}
		return lease.ArrayReply(arr)
	case error: // an error reply inside an array
		return lease.ErrorReply(replyError(v))
	}
	return lease.ErrorReply(fmt.Errorf("%w: a reply of a type the scripts do not return (%T)", lease.ErrProtocol, v))
}

// replyError returns a Redis error reply in err's chain as a
// *lease.ReplyError with Redis's own message (unwrapping to err), and any
// other error as it is.
func replyError(err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return lease.NewReplyError(rerr.Error(), err)
	}
	return err
}

// pipelineAbove is how many scripts must already be in flight for the
// next to go through the automatic pipeliner (see adapter.Eval): at 8,
// 64 goroutines on 64 keys go through it and 8 goroutines that take turns
// on one lock do not (benchmarks module, scenarios keys64 and goroutines8).
const pipelineAbove = 8

// Sharding says how the client spreads keys (lease.Topology), which
// decides which leases distlock renews in one script: a *redis.ClusterClient
// (NewClusterClient, and a UniversalClient made for several addresses) is
// a Redis Cluster, where they must share a slot; a *redis.Client (one
// server, or NewFailoverClient behind Sentinel) holds them all; anything
// else, such as a *redis.Ring (which places a key by its hash tag among
// its shards), renews only the leases of one lock together.
func (r *adapter) Sharding() lease.Sharding {
	switch r.rdb.(type) {
	case *redis.ClusterClient:
		return lease.ShardedBySlot
	case *redis.Client:
		return lease.Unsharded
	}
	return lease.ShardedByTag
}
