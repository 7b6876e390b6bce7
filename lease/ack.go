package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/rueidis"
)

// Waiting for replicas.
//
// Redis replicates asynchronously: a write that the primary confirmed may be
// missing on a replica that a failover then promotes, and a lease that is
// missing there can be granted a second time. A Client made by [NewWithAck]
// narrows that window: after each acquire or renew script it sends WAIT,
// which blocks until the given number of replicas have acknowledged every
// write made so far on the same connection, or until a timeout.
//
// WAIT counts the writes of its own connection, so it must follow the script
// on the connection that ran it. rueidis multiplexes the commands of many
// callers over shared connections, so the Client borrows a dedicated
// connection (rueidis.Client.Dedicate, from rueidis's blocking pool) and
// pipelines the script and WAIT on it in one round trip. On that connection
// nothing hides the replies of the script: a NOSCRIPT reply is answered by
// sending the script's body (EVAL) and WAIT again on the same connection, and
// a cluster redirection (MOVED or ASK) by doing both on the node it names, so
// WAIT always follows the write it is meant to count, on the primary that
// owns the lock's slot.

// ErrNotReplicated is matched by [*AckError]: fewer replicas than asked
// acknowledged a write in time.
var ErrNotReplicated = errors.New("distlock: write not acknowledged by enough replicas")

// ErrBadAck is returned by [NewWithAck] for settings it cannot use.
var ErrBadAck = errors.New("lease: invalid replica acknowledgement")

// maxRedirects bounds how many cluster redirections one call follows, as
// rueidis does for its own commands.
const maxRedirects = 5

// undoTimeout bounds the conditional delete that undoes an acquisition the
// replicas did not acknowledge. It runs even when the caller's context has
// ended, since the write it undoes may be in Redis.
const undoTimeout = 250 * time.Millisecond

// Ack is how many replicas must acknowledge each acquire and renew write, and
// how long to wait for them.
type Ack struct {
	// Replicas is the number of replicas that must acknowledge the write.
	Replicas int
	// Timeout bounds each wait. Redis counts it in whole milliseconds, and
	// the Client shortens it to fit the deadline of the call's context.
	Timeout time.Duration
}

// AckError reports that fewer replicas than asked acknowledged a write in
// time. It matches [ErrNotReplicated] and unwraps to the error of the wait,
// if the wait itself failed (the context ended, the connection broke, or
// Redis refused WAIT).
type AckError struct {
	Op      string        // "acquire" or "renew"
	Key     string        // the lease key
	Want    int           // replicas asked for
	Got     int           // replicas that acknowledged the write
	Timeout time.Duration // how long Redis was asked to wait
	Err     error         // why the wait gave no count, if it did not
}

func (e *AckError) Error() string {
	// distlock wraps this error in one that names the key and says what it
	// was doing, so the text says neither, nor repeats the "distlock:"
	// prefix; errors.Is still finds ErrNotReplicated.
	write := e.Op
	switch e.Op {
	case "acquire":
		write = "acquisition"
	case "renew":
		write = "renewal"
	}
	if e.Err != nil {
		return fmt.Sprintf("waiting for %d replicas to acknowledge the %s failed: %v", e.Want, write, e.Err)
	}
	return fmt.Sprintf("only %d of %d replicas acknowledged the %s within %v", e.Got, e.Want, write, e.Timeout)
}

// Is reports whether target is [ErrNotReplicated].
func (e *AckError) Is(target error) bool { return target == ErrNotReplicated }

// Unwrap returns the error of the wait, if any.
func (e *AckError) Unwrap() error { return e.Err }

// NewWithAck returns a Client that, after each acquire and renew write, waits
// until ack.Replicas replicas have it, for up to ack.Timeout. An acquisition
// that is not acknowledged in time is deleted again and reported as an
// [*AckError]; so is a renewal, which however stays applied on the primary
// (a renewal only extends a lease that the caller holds).
//
// ack.Replicas 0 makes a Client that does not wait, as [New] does. A
// negative count, or a timeout under one millisecond (WAIT 0 would block
// forever), is refused with an error matching [ErrBadAck].
func NewWithAck(rc rueidis.Client, ack Ack) (*Client, error) {
	switch {
	case ack.Replicas < 0:
		return nil, fmt.Errorf("%w: %d replicas", ErrBadAck, ack.Replicas)
	case ack.Replicas > 0 && ack.Timeout < time.Millisecond:
		return nil, fmt.Errorf("%w: timeout %v is under one millisecond", ErrBadAck, ack.Timeout)
	}
	return &Client{rc: rc, ack: ack}, nil
}

// waited is the outcome of the WAIT that followed a script.
type waited struct {
	replicas int64 // how many replicas acknowledged
	err      error // why there is no count
}

// exec runs s. When c waits for replicas, it also runs WAIT after s on the
// same connection and returns its outcome; otherwise the outcome is empty.
// A TRYAGAIN reply is retried as [Client.run] does.
func (c *Client) exec(ctx context.Context, s script, keys, args []string) (rueidis.RedisResult, waited) {
	return tryAgain(ctx, func() (rueidis.RedisResult, waited) { return c.execOnce(ctx, s, keys, args) })
}

// execOnce is one attempt of exec.
func (c *Client) execOnce(ctx context.Context, s script, keys, args []string) (rueidis.RedisResult, waited) {
	if c.ack.Replicas == 0 {
		return s.Exec(ctx, c.rc, keys, args), waited{}
	}
	node := c.rc
	asking := false
	for redirects := 0; ; redirects++ {
		res, w := c.execWait(ctx, node, s, keys, args, asking)
		rerr, ok := rueidis.IsRedisErr(res.Error())
		if !ok || redirects == maxRedirects {
			return res, w
		}
		addr, moved := rerr.IsMoved()
		if asking = false; !moved {
			if addr, asking = rerr.IsAsk(); !asking {
				return res, w
			}
		}
		// The script did not run there; WAIT's count is meaningless.
		var err error
		if node, err = c.node(ctx, addr); err != nil {
			return rueidis.NewErrorResult(err), waited{}
		}
	}
}

// node returns a client of the cluster node at addr, waiting for rueidis to
// learn of a node it does not know yet (the redirection that named it has
// already made the cluster client refresh its topology).
func (c *Client) node(ctx context.Context, addr string) (rueidis.Client, error) {
	const poll = 10 * time.Millisecond
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lease: following a redirection to %s: %w", addr, ctx.Err())
		case <-t.C:
		}
		if n, ok := c.rc.Nodes()[addr]; ok {
			return n, nil
		}
		t.Reset(poll)
	}
}

// execWait pipelines s and WAIT on one dedicated connection of rc, after
// ASKING when asked to. A NOSCRIPT reply is answered by sending the body
// (EVAL) the same way, on the same connection.
func (c *Client) execWait(ctx context.Context, rc rueidis.Client, s script, keys, args []string, asking bool) (rueidis.RedisResult, waited) {
	d, release := rc.Dedicate()
	defer release()
	res, w := c.pipeline(ctx, d, s, keys, args, asking, false)
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
		res, w = c.pipeline(ctx, d, s, keys, args, asking, true)
	}
	return res, w
}

func (c *Client) pipeline(ctx context.Context, d rueidis.DedicatedClient, s script, keys, args []string, asking, body bool) (rueidis.RedisResult, waited) {
	cmds := make(rueidis.Commands, 0, 3)
	if asking {
		cmds = append(cmds, d.B().Asking().Build())
	}
	if body {
		cmds = append(cmds, d.B().Eval().Script(s.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	} else {
		cmds = append(cmds, d.B().Evalsha().Sha1(s.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	cmds = append(cmds, d.B().Wait().Numreplicas(int64(c.ack.Replicas)).Timeout(c.waitMillis(ctx)).Build())
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
	return res, waited{replicas: n, err: err}
}

// waitMillis returns WAIT's timeout: the Client's, cut to three quarters of
// what is left of ctx's deadline so that Redis's answer can arrive before
// the caller gives up (rueidis fails every reply of the pipeline, the
// script's too, if the context ends first), and never 0, which would make
// WAIT block forever.
func (c *Client) waitMillis(ctx context.Context) int64 {
	d := c.ack.Timeout
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)*3/4)
	}
	return max(d.Milliseconds(), 1)
}

// ackError returns an *AckError when c waits for replicas and w does not show
// enough of them, and nil otherwise.
func (c *Client) ackError(op, key string, w waited) error {
	if c.ack.Replicas == 0 || (w.err == nil && w.replicas >= int64(c.ack.Replicas)) {
		return nil
	}
	return &AckError{Op: op, Key: key, Want: c.ack.Replicas, Got: int(w.replicas), Timeout: c.ack.Timeout, Err: w.err}
}

// undo deletes an acquisition that the replicas did not acknowledge. It
// ignores the cancellation of ctx, which may be why the wait failed, and is
// bounded by undoTimeout. Failing leaves the lease to expire on its own.
func (c *Client) undo(ctx context.Context, k Keys, value string) error {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	_, err := c.Release(uctx, k, value)
	return err
}
