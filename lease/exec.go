package lease

import (
	"context"
	"slices"
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
	res, _ := tryAgain(ctx, func() (Reply, waited) { return c.eval(ctx, s, keys, args), waited{} })
	return res
}

// eval is c.r.Eval. Through the interface, escape analysis cannot see
// that Eval keeps neither keys nor args, so the callers' slices (built on
// the stack) would move to the heap: three allocations more on every call
// of a script. So it calls rueidis's Eval by its type, and gives any other
// Redis copies, which cost that only on its own path (where the client
// copies them again into its command).
func (c *Client) eval(ctx context.Context, s *Script, keys, args []string) Reply {
	if r, ok := c.r.(rueidisRedis); ok {
		return r.Eval(ctx, s, keys, args)
	}
	return c.r.Eval(ctx, s, slices.Clone(keys), slices.Clone(args))
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
