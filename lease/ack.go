package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
// on the connection that ran it: [Redis.EvalWait] sends both there, on the
// primary that owns the lock's slot.

// ErrNotReplicated is matched by [*AckError]: fewer replicas than asked
// acknowledged a write in time.
var ErrNotReplicated = errors.New("distlock: write not acknowledged by enough replicas")

// ErrBadAck is returned by [NewWithAck] for settings it cannot use.
var ErrBadAck = errors.New("lease: invalid replica acknowledgement")

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
	return NewOn(FromRueidis(rc), ack)
}

// NewOn returns a Client that talks to Redis through r and waits for
// replicas as [NewWithAck] does (ack.Replicas 0: it does not wait).
func NewOn(r Redis, ack Ack) (*Client, error) {
	switch {
	case ack.Replicas < 0:
		return nil, fmt.Errorf("%w: %d replicas", ErrBadAck, ack.Replicas)
	case ack.Replicas > 0 && ack.Timeout < time.Millisecond:
		return nil, fmt.Errorf("%w: timeout %v is under one millisecond", ErrBadAck, ack.Timeout)
	}
	return &Client{r: r, ack: ack}, nil
}

// waited is the outcome of the WAIT that followed a script.
type waited struct {
	replicas int64 // how many replicas acknowledged
	err      error // why there is no count
}

// exec runs s. When c waits for replicas, it also runs WAIT after s on the
// same connection ([Redis.EvalWait]) and returns its outcome; otherwise the
// outcome is empty. A TRYAGAIN reply is retried as [Client.run] does.
func (c *Client) exec(ctx context.Context, s *Script, keys, args []string) (Reply, waited) {
	if c.ack.Replicas == 0 {
		return c.run(ctx, s, keys, args), waited{}
	}
	ks, as := slices.Clone(keys), slices.Clone(args) // see Client.eval
	return tryAgain(ctx, func() (Reply, waited) {
		res, n, err := c.r.EvalWait(ctx, s, ks, as, c.ack.Replicas, c.waitTimeout(ctx))
		return res, waited{replicas: n, err: err}
	})
}

// waitTimeout returns WAIT's timeout: the Client's, cut to three quarters
// of what is left of ctx's deadline so that Redis's answer can arrive
// before the caller gives up (a client fails every reply of the pipeline,
// the script's too, if the context ends first), and never under one
// millisecond, since WAIT 0 would block forever.
func (c *Client) waitTimeout(ctx context.Context) time.Duration {
	d := c.ack.Timeout
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)*3/4)
	}
	return max(d.Truncate(time.Millisecond), time.Millisecond)
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
