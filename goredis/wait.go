package goredis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/distkit-go/distlock/lease"
)

// errNoReplicaAck is returned (wrapped, as the reply of the script) by a
// lock made with distlock.WithReplicaAck on a go-redis client other than a
// *redis.Client (NewClient, NewFailoverClient) or a *redis.ClusterClient
// (NewClusterClient, NewFailoverClusterClient), such as a *redis.Ring: WAIT
// must follow the write on the connection of the primary that made it,
// and a Ring does not say which node or connection that is.
var errNoReplicaAck = errors.New("goredis: WithReplicaAck needs a *redis.Client (NewClient, NewFailoverClient) or a *redis.ClusterClient")

// maxRedirects bounds how many cluster redirections (MOVED, ASK) one
// EvalWait follows, as lease's rueidis seam does.
const maxRedirects = 5

// Finding the primary that a redirection names: the cluster's layout is
// read again (ClusterClient.ForEachMaster reloads it) every redirectPoll,
// for up to redirectLookup, until that primary is in it.
const (
	redirectPoll   = 10 * time.Millisecond
	redirectLookup = time.Second
)

// EvalWait pipelines s and WAIT on one connection of the primary that runs
// s: WAIT counts the writes of its own connection.
//
// On a *redis.Client the pipeline is the client's own: go-redis sends the
// commands of a pipeline on one pooled connection, in order. A borrowed
// connection (Client.Conn) would add nothing but its cost. On a
// *redis.ClusterClient it is a pipeline of the node client of the primary
// that owns the first key's slot (ClusterClient.MasterForKey), since the
// cluster's own pipeline would send the keyless WAIT to a node of its
// choosing. Redirections are followed by hand there, at most maxRedirects:
// MOVED sends both commands to the primary it names, ASK sends ASKING and
// both commands to the node it names (see masterAt). NOSCRIPT is answered
// by sending the script's body (EVAL) and WAIT again, on the same node.
//
// A pipeline that fails without a reply (a deadline, a broken connection)
// never hands a connection with a WAIT still pending back to the pool:
// go-redis removes a connection whose read failed (for a timeout as for
// any network error) instead of returning it, which closes it, and it
// returns from a pipeline only once the read is over. Redis drops a
// blocked WAIT when its client's connection closes.
func (r *adapter) EvalWait(ctx context.Context, s *lease.Script, keys, args []string, replicas int, timeout time.Duration) (lease.Reply, int64, error) {
	argv := argValues(args)
	switch rdb := r.rdb.(type) {
	case *redis.Client:
		cmd, wait := evalWait(ctx, rdb, s, keys, argv, replicas, timeout, false)
		n, err := wait.Int64()
		return reply(cmd), n, err
	case *redis.ClusterClient:
		return evalWaitCluster(ctx, rdb, s, keys, argv, replicas, timeout)
	}
	err := fmt.Errorf("%w, not a %T", errNoReplicaAck, r.rdb)
	return lease.ErrorReply(err), 0, err
}

// evalWaitCluster is EvalWait on a cluster client.
func evalWaitCluster(ctx context.Context, cc *redis.ClusterClient, s *lease.Script, keys []string, argv []any, replicas int, timeout time.Duration) (lease.Reply, int64, error) {
	if len(keys) == 0 {
		err := errors.New("goredis: a script without keys has no primary to wait on")
		return lease.ErrorReply(err), 0, err
	}
	node, err := cc.MasterForKey(ctx, keys[0])
	if err != nil {
		return lease.ErrorReply(err), 0, err
	}
	asking := false
	for redirects := 0; ; redirects++ {
		cmd, wait := evalWait(ctx, node, s, keys, argv, replicas, timeout, asking)
		addr, moved := redis.IsMovedError(cmd.Err())
		if !moved {
			addr, asking = redis.IsAskError(cmd.Err())
		}
		if (!moved && !asking) || redirects == maxRedirects {
			n, err := wait.Int64()
			return reply(cmd), n, err
		}
		// The script did not run there; WAIT's count is meaningless.
		if node, err = masterAt(ctx, cc, redirectAddr(addr, node)); err != nil {
			return lease.ErrorReply(err), 0, err
		}
	}
}

// redirectAddr returns the address that a redirection names, completed with
// the host of the node that sent it when Redis left the host out (a node
// that does not know its own address answers "MOVED 3999 :6381").
func redirectAddr(addr string, from *redis.Client) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "" {
		return addr
	}
	fromHost, _, err := net.SplitHostPort(from.Options().Addr)
	if err != nil {
		return addr
	}
	return net.JoinHostPort(fromHost, port)
}

// masterAt returns the node client of the cluster's primary at addr, as the
// cluster client knows its nodes (by the addresses the cluster reports). A
// redirection names a node that has just taken the slot (MOVED) or is
// taking it (ASK); the cluster client may not know it as a primary yet, so
// masterAt reads the layout again until it does, for up to redirectLookup.
func masterAt(ctx context.Context, cc *redis.ClusterClient, addr string) (*redis.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, redirectLookup)
	defer cancel()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("goredis: following a cluster redirection to %s: no such primary: %w", addr, ctx.Err())
		case <-t.C:
		}
		var mu sync.Mutex // ForEachMaster calls fn concurrently
		var found *redis.Client
		_ = cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
			if c.Options().Addr == addr {
				mu.Lock()
				found = c
				mu.Unlock()
			}
			return nil
		})
		if found != nil {
			return found, nil
		}
		t.Reset(redirectPoll)
	}
}

// evalWait sends s and WAIT in one pipeline of rdb, after ASKING when
// asked to; on NOSCRIPT, it sends the body (EVAL) and WAIT the same way.
func evalWait(ctx context.Context, rdb *redis.Client, s *lease.Script, keys []string, argv []any, replicas int, timeout time.Duration, asking bool) (*redis.Cmd, *redis.Cmd) {
	rdb = withWaitTimeout(rdb, timeout)
	cmd, wait := pipelineWait(ctx, rdb, s, keys, argv, replicas, timeout, asking, false)
	if isNoScript(cmd.Err()) {
		cmd, wait = pipelineWait(ctx, rdb, s, keys, argv, replicas, timeout, asking, true)
	}
	return cmd, wait
}

func pipelineWait(ctx context.Context, rdb *redis.Client, s *lease.Script, keys []string, argv []any, replicas int, timeout time.Duration, asking, body bool) (*redis.Cmd, *redis.Cmd) {
	pipe := rdb.Pipeline()
	if asking {
		_ = pipe.Process(ctx, redis.NewCmd(ctx, "asking"))
	}
	var cmd *redis.Cmd
	if body {
		cmd = pipe.Eval(ctx, s.Source(), keys, argv...)
	} else {
		cmd = pipe.EvalSha(ctx, s.SHA1(), keys, argv...)
	}
	// WAIT through Do: Pipeliner has no Wait method (Cmdable does).
	wait := pipe.Do(ctx, "wait", replicas, max(timeout, time.Millisecond).Milliseconds())
	_, _ = pipe.Exec(ctx) // each command holds its own outcome
	return cmd, wait
}

// withWaitTimeout returns rdb, or a clone of it (sharing its pools) with a
// longer read timeout when WAIT's timeout would not fit in rdb's. go-redis
// gives a WAIT sent alone its timeout plus ten seconds to answer, but reads
// a pipeline's replies under the client's ReadTimeout; the clone allows
// ReadTimeout for the script and the network, plus WAIT's timeout. A client
// without read timeouts (ReadTimeout -1 or -2) is left as it is.
func withWaitTimeout(rdb *redis.Client, timeout time.Duration) *redis.Client {
	rt := rdb.Options().ReadTimeout
	if rt <= 0 || timeout < rt/2 {
		return rdb
	}
	return rdb.WithTimeout(rt + timeout)
}
