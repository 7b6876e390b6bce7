package lease

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"time"

	"github.com/redis/rueidis"
)

// script is a Lua script that can be run through rueidis as usual (Exec), or
// sent by hand as EVALSHA or EVAL on a connection of the caller's choosing.
type script struct {
	*rueidis.Lua
	src string
	sha string
}

func newScript(src string) script {
	sum := sha1.Sum([]byte(src))
	return script{Lua: rueidis.NewLuaScript(src), src: src, sha: hex.EncodeToString(sum[:])}
}

// run runs s without waiting for replicas.
//
// A TRYAGAIN reply is retried, with a short pause, until ctx ends. Redis
// Cluster gives it, while a slot is being migrated, for a script on several
// keys of the slot of which some have moved and some have not (or, on the
// node importing the slot, some are not there yet). The script did not run,
// and the migration ends it soon.
func (c *Client) run(ctx context.Context, s script, keys, args []string) rueidis.RedisResult {
	res, _ := tryAgain(ctx, func() (rueidis.RedisResult, waited) { return s.Exec(ctx, c.rc, keys, args), waited{} })
	return res
}

// runDedicated is run on a connection of its own, borrowed from rueidis's
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
func (c *Client) runDedicated(ctx context.Context, s script, keys, args []string) rueidis.RedisResult {
	var res rueidis.RedisResult
	err := c.rc.Dedicated(func(d rueidis.DedicatedClient) error {
		res, _ = tryAgain(ctx, func() (rueidis.RedisResult, waited) { return evalOn(ctx, d, s, keys, args), waited{} })
		return nil
	})
	if err != nil {
		return rueidis.NewErrorResult(err)
	}
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok {
		if _, moved := rerr.IsMoved(); moved {
			return c.run(ctx, s, keys, args)
		}
		if _, ask := rerr.IsAsk(); ask {
			return c.run(ctx, s, keys, args)
		}
	}
	return res
}

// evalOn runs s on d: EVALSHA, and EVAL with the script's body when Redis
// does not know it yet.
func evalOn(ctx context.Context, d rueidis.DedicatedClient, s script, keys, args []string) rueidis.RedisResult {
	res := d.Do(ctx, d.B().Evalsha().Sha1(s.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
		res = d.Do(ctx, d.B().Eval().Script(s.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	return res
}

// tryAgain calls attempt until it gets a reply other than TRYAGAIN or ctx
// ends.
func tryAgain(ctx context.Context, attempt func() (rueidis.RedisResult, waited)) (rueidis.RedisResult, waited) {
	pause := tryAgainPause
	for {
		res, w := attempt()
		rerr, ok := rueidis.IsRedisErr(res.Error())
		if !ok || !rerr.IsTryAgain() {
			return res, w
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return res, w
		case <-t.C:
		}
		pause = min(2*pause, maxTryAgainPause)
	}
}

// Pauses between the attempts of a script that got TRYAGAIN.
const (
	tryAgainPause    = 5 * time.Millisecond
	maxTryAgainPause = 100 * time.Millisecond
)
