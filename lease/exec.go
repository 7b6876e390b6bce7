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
