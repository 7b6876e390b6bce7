package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/rueidis"
)

// FromRueidis returns the [Redis] of a rueidis client, or nil for a nil
// client.
func FromRueidis(rc rueidis.Client) Redis {
	if rc == nil {
		return nil
	}
	return rueidisRedis{rc}
}

// rueidisRedis is the protocol's seam on rueidis. rueidis follows MOVED and
// ASK for the commands it sends itself and answers NOSCRIPT with EVAL
// (rueidis.Lua); the calls that pick their own connection (a dedicated one)
// do both by hand.
type rueidisRedis struct{ rc rueidis.Client }

// maxRedirects bounds how many cluster redirections one call follows, as
// rueidis does for its own commands.
const maxRedirects = 5

func (r rueidisRedis) Identity() any { return r.rc }

// KeepsDeadlines reports true: rueidis ends a command when its context's
// deadline passes, whether it waits for its reply in a pipeline or on a
// connection of its own (where it sets the deadline on the connection).
func (r rueidisRedis) KeepsDeadlines() bool { return true }

func (r rueidisRedis) Eval(ctx context.Context, s *Script, keys, args []string) Reply {
	return rueidisReply(s.lua.Exec(ctx, r.rc, keys, args))
}

// EvalDedicated runs s on a connection of its own, borrowed from rueidis's
// pool of dedicated connections (rueidis.Client.Dedicated) and handed back
// after.
//
// It serves a call that may still be running while the client's owner
// closes the client, such as the clean-up an acquire call leaves to the
// background. A command on the client's shared connections may have to dial
// one of them first, and a dial that is under way while Close runs leaves
// a connection that Close never sees and nothing ever closes (rueidis
// v1.0.79), which keeps the client in memory for good. A borrowed
// connection goes back to its pool when the call is over, and a pool that
// Close has shut closes it then. A cluster redirection (MOVED or ASK: the
// slot is moving) is left to the shared connections, which follow it.
func (r rueidisRedis) EvalDedicated(ctx context.Context, s *Script, keys, args []string) Reply {
	var res rueidis.RedisResult
	err := r.rc.Dedicated(func(d rueidis.DedicatedClient) error {
		res = evalOn(ctx, d, s, keys, args)
		return nil
	})
	if err != nil {
		return ErrorReply(err)
	}
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok {
		if _, moved := rerr.IsMoved(); moved {
			return r.Eval(ctx, s, keys, args)
		}
		if _, ask := rerr.IsAsk(); ask {
			return r.Eval(ctx, s, keys, args)
		}
	}
	return rueidisReply(res)
}

// evalOn runs s on d: EVALSHA, and EVAL with the script's body when Redis
// does not know it yet.
func evalOn(ctx context.Context, d rueidis.DedicatedClient, s *Script, keys, args []string) rueidis.RedisResult {
	res := d.Do(ctx, d.B().Evalsha().Sha1(s.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
		res = d.Do(ctx, d.B().Eval().Script(s.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	return res
}

// EvalWait pipelines s and WAIT on one connection borrowed from rueidis's
// blocking pool (rueidis.Client.Dedicate): rueidis multiplexes the commands
// of many callers over its shared connections, and WAIT counts the writes
// of its own. On that connection nothing hides the replies of the script: a
// NOSCRIPT reply is answered by sending the body (EVAL) and WAIT again on
// the same connection, and a cluster redirection (MOVED or ASK) by doing
// both on the node it names, so WAIT always follows the write it is meant
// to count, on the primary that owns the lock's slot.
func (r rueidisRedis) EvalWait(ctx context.Context, s *Script, keys, args []string, replicas int, timeout time.Duration) (Reply, int64, error) {
	node := r.rc
	asking := false
	for redirects := 0; ; redirects++ {
		res, n, werr := evalWait(ctx, node, s, keys, args, replicas, timeout, asking)
		rerr, ok := rueidis.IsRedisErr(res.Error())
		if !ok || redirects == maxRedirects {
			return rueidisReply(res), n, werr
		}
		addr, moved := rerr.IsMoved()
		if asking = false; !moved {
			if addr, asking = rerr.IsAsk(); !asking {
				return rueidisReply(res), n, werr
			}
		}
		// The script did not run there; WAIT's count is meaningless.
		var err error
		if node, err = r.node(ctx, addr); err != nil {
			return ErrorReply(err), 0, nil
		}
	}
}

// node returns a client of the cluster node at addr, waiting for rueidis to
// learn of a node it does not know yet (the redirection that named it has
// already made the cluster client refresh its topology).
func (r rueidisRedis) node(ctx context.Context, addr string) (rueidis.Client, error) {
	const poll = 10 * time.Millisecond
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lease: following a redirection to %s: %w", addr, ctx.Err())
		case <-t.C:
		}
		if n, ok := r.rc.Nodes()[addr]; ok {
			return n, nil
		}
		t.Reset(poll)
	}
}

// evalWait pipelines s and WAIT on one dedicated connection of rc, after
// ASKING when asked to. A NOSCRIPT reply is answered by sending the body
// (EVAL) the same way, on the same connection.
func evalWait(ctx context.Context, rc rueidis.Client, s *Script, keys, args []string, replicas int, timeout time.Duration, asking bool) (rueidis.RedisResult, int64, error) {
	d, release := rc.Dedicate()
	defer release()
	res, n, err := pipelineWait(ctx, d, s, keys, args, replicas, timeout, asking, false)
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
		res, n, err = pipelineWait(ctx, d, s, keys, args, replicas, timeout, asking, true)
	}
	return res, n, err
}

func pipelineWait(ctx context.Context, d rueidis.DedicatedClient, s *Script, keys, args []string, replicas int, timeout time.Duration, asking, body bool) (rueidis.RedisResult, int64, error) {
	cmds := make(rueidis.Commands, 0, 3)
	if asking {
		cmds = append(cmds, d.B().Asking().Build())
	}
	if body {
		cmds = append(cmds, d.B().Eval().Script(s.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	} else {
		cmds = append(cmds, d.B().Evalsha().Sha1(s.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	cmds = append(cmds, d.B().Wait().Numreplicas(int64(replicas)).Timeout(max(timeout.Milliseconds(), 1)).Build())
	resps := d.DoMulti(ctx, cmds...)
	for _, r := range resps {
		if r.NonRedisError() != nil {
			// A WAIT may still be blocking on this connection (the context
			// ended first): do not hand it back to the pool.
			d.Close()
			break
		}
	}
	res, wres := resps[len(resps)-2], resps[len(resps)-1]
	n, err := wres.AsInt64()
	return res, n, err
}

// unsubscribeTimeout bounds the command that ends a subscription.
const unsubscribeTimeout = time.Second

func (r rueidisRedis) Subscribe(ctx context.Context, channel string, sharded bool, ready func(), message func(string)) error {
	// A plain SUBSCRIBE names no key, so rueidis's Cluster client would
	// send it to any node; the slot of the channel's name sends it to the
	// node that holds the lock's keys, whose restart then ends it (the
	// restart watch on a Redis 6.2 Cluster, which has no sharded pub/sub).
	kind, cmd := "subscribe", r.rc.B().Subscribe().Channel(channel).Build().SetSlot(channel)
	if sharded {
		kind, cmd = "ssubscribe", r.rc.B().Ssubscribe().Channel(channel).Build()
	}
	ctx = rueidis.WithOnSubscriptionHook(ctx, func(s rueidis.PubSubSubscription) {
		if s.Kind == kind && s.Channel == channel {
			ready()
		}
	})
	// When ctx ends, Receive returns but the connection stays subscribed;
	// this hook runs on that connection and ends the subscription there.
	ctx = rueidis.WithOnReceiveReturnHook(ctx, func(err error, cc rueidis.CommandClient) error {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unsubscribeTimeout)
		defer cancel()
		unsub := cc.B().Unsubscribe().Channel(channel).Build()
		if sharded {
			unsub = cc.B().Sunsubscribe().Channel(channel).Build()
		}
		_ = cc.Do(uctx, unsub).Error()
		return err
	})
	err := r.rc.Receive(ctx, cmd, func(m rueidis.PubSubMessage) { message(m.Message) })
	if rerr, ok := rueidis.IsRedisErr(err); ok {
		return NewReplyError(rerr.Error(), rerr)
	}
	return err
}

// rueidisReply turns a rueidis result into a Reply. A number, the reply of
// the common cases, costs no allocation.
func rueidisReply(res rueidis.RedisResult) Reply {
	if err := res.NonRedisError(); err != nil {
		return ErrorReply(err)
	}
	m, err := res.ToMessage()
	if err != nil && !rueidis.IsRedisNil(err) {
		return ErrorReply(rueidisError(err))
	}
	return rueidisMessage(&m)
}

func rueidisMessage(m *rueidis.RedisMessage) Reply {
	switch {
	case m.IsInt64():
		n, _ := m.AsInt64()
		return IntReply(n)
	case m.IsString():
		s, _ := m.ToString()
		return StringReply(s)
	case m.IsArray():
		elems, _ := m.ToArray()
		arr := make([]Reply, len(elems))
		for i := range elems {
			arr[i] = rueidisMessage(&elems[i])
		}
		return ArrayReply(arr)
	case m.IsNil():
		return NilReply()
	}
	if err := m.Error(); err != nil {
		return ErrorReply(rueidisError(err))
	}
	return ErrorReply(fmt.Errorf("%w: a reply of a type the scripts do not return", ErrProtocol))
}

// rueidisError returns rueidis's error reply as a *ReplyError (unwrapping
// to rueidis's), and any other error as it is.
func rueidisError(err error) error {
	if rerr, ok := rueidis.IsRedisErr(err); ok {
		return NewReplyError(rerr.Error(), rerr)
	}
	return err
}
