package lease

import (
	"context"
	"time"
)

// run runs s without waiting for replicas.
//
// A TRYAGAIN reply is retried, with a short pause, until ctx ends. Redis
// Cluster gives it, while a slot is being migrated, for a script on several
// keys of the slot of which some have moved and some have not (or, on the
// node importing the slot, some are not there yet). The script did not run,
// and the migration ends it soon.
func (c *Client) run(ctx context.Context, s *Script, keys, args []string) Reply {
	res, _ := tryAgain(ctx, func() (Reply, waited) { return c.r.Eval(ctx, s, keys, args), waited{} })
	return res
}

// runDedicated is run on a connection of its own, where the Redis can (see
// [DedicatedEvaler]), and run otherwise.
func (c *Client) runDedicated(ctx context.Context, s *Script, keys, args []string) Reply {
	d, ok := c.r.(DedicatedEvaler)
	if !ok {
		return c.run(ctx, s, keys, args)
	}
	res, _ := tryAgain(ctx, func() (Reply, waited) { return d.EvalDedicated(ctx, s, keys, args), waited{} })
	return res
}

// tryAgain calls attempt until it gets a reply other than TRYAGAIN or ctx
// ends.
func tryAgain(ctx context.Context, attempt func() (Reply, waited)) (Reply, waited) {
	pause := tryAgainPause
	for {
		res, w := attempt()
		if !isTryAgain(res.Err()) {
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
