package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/lease"
)

// Exit codes of "distlock break", as grep(1) has them: 0 when it broke a
// lease, 1 when there was nothing to break.
const (
	exitBroke   = 0
	exitNothing = 1
)

// breakTimeout bounds each look at Redis and each release of "distlock
// break", so that a hung server ends in an error rather than a frozen
// command.
const breakTimeout = 5 * time.Second

const breakUsage = `Usage: distlock break [flags] KEY

Ends the lease of whoever holds the lock KEY now, as its expiry would: the
first waiter in line is granted the lock at once, with a fencing token
larger than the holder's, and the holder's next renewal is refused (its
guard turns Lost; a "distlock run" that held it stops its command and
exits 76). Use it for a lock whose holder is frozen (a stopped process, a
hung machine) or dead, when waiting for its lease to end would take too
long.

It reads the holder's value and releases the lease as that holder's own
release would, in one step that first checks the lease still holds that
value: a holder that released meanwhile, or was followed by another, is
not broken. A key that someone set by hand without an expiry is deleted
the same way.

KEY may name a lock (a Mutex, an Election, what "distlock run" holds), a
read-write lock, or a semaphore. A read-write lock's readers and a
semaphore's permits are each a lease of their own: break ends every one of
them, or with --holder only those of one holder. A semaphore passes each
freed permit on to the next in line.

Breaking a live holder is unsafe unless what the lock protects checks
fencing tokens: the old holder does not learn of the break until its next
renewal (a third of its TTL at most), and may still act meanwhile. The new
holder's token is larger; storage that refuses a smaller token than it has
seen refuses the old holder's late writes.

It prints a line for each lease it broke: the holder's owner and value,
its token (a semaphore keeps only its last grant's token, so a permit's
holder is shown without one), and to whom the lease passed.

Exit status:
  0      it broke a lease
  1      nothing to break: KEY is free, --holder matched no holder, or the
         holder changed before the break (the new one is not broken)
  64     usage error
  125    Redis cannot be reached, or KEY holds something distlock did not
         write

Examples:
  distlock break nightly-report
  distlock break --holder db-2:4711 transcode     # one holder of a semaphore
  distlock break --namespace jobs --redis redis://10.0.0.5:6379 migrate

Flags:
`

// breakConfig is the command line of "distlock break".
type breakConfig struct {
	common
	name   string
	holder string
}

// breakFlags returns the flag set of "distlock break", bound to c.
func breakFlags(c *breakConfig) *flag.FlagSet {
	fs := newFlagSet("break")
	c.register(fs, "; break needs a real Redis", 0)
	fs.StringVar(&c.holder, "holder", "", "break only the holds of this `HOLDER`: a value as \"distlock inspect --json\" shows it, or an owner (every hold of that owner)")
	return fs
}

// parseBreak parses the command line of "distlock break": flags before or
// after KEY.
func parseBreak(args []string) (breakConfig, error) {
	var c breakConfig
	fs := breakFlags(&c)
	if err := parseFlags(fs, args); err != nil {
		return c, err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return c, usagef("missing KEY: distlock break [flags] KEY")
	}
	c.name = rest[0]
	if !endedByDashDash(fs, args, rest) {
		more := rest[1:]
		if err := parseFlags(fs, more); err != nil {
			return c, err
		}
		rest = append([]string{c.name}, fs.Args()...)
	}
	set := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case len(rest) > 1:
		return c, usagef("one KEY at a time (got %q): break each with a command of its own", rest)
	case set["holder"] && c.holder == "":
		return c, usagef("--holder needs a value or an owner")
	}
	return c, nil
}

// hold is one hold that break found: a holder's value, its token when
// known (0: not kept), and its lease's time left.
type hold struct {
	value string
	token int64
	left  time.Duration
}

// breaker breaks the holds of one lock, semaphore or read-write lock.
type breaker struct {
	rc rueidis.Client
	lc *lease.Client
	k  lease.Keys
}

// runBreak implements "distlock break".
func runBreak(ctx context.Context, args []string, stdout, _ io.Writer) error {
	cfg, err := parseBreak(args)
	if err != nil {
		return err
	}
	k, err := lease.NewKeys(cfg.namespace, cfg.name)
	if err != nil {
		return usageError{err}
	}
	client, _, closeClient, err := connectReal(cfg.redis, time.Time{})
	if err != nil {
		return err
	}
	defer closeClient()
	b := &breaker{rc: client, lc: lease.New(client), k: k}

	keys, holds, err := b.holds(ctx)
	if err != nil {
		return &exitStatus{code: exitFailed, err: err}
	}
	if len(holds) == 0 {
		fmt.Fprintf(stdout, "%s is free: nothing to break\n", k.Lease)
		return &exitStatus{code: exitNothing}
	}
	if cfg.holder != "" {
		var picked []hold
		for _, h := range holds {
			if h.value == cfg.holder || lease.Owner(h.value) == cfg.holder {
				picked = append(picked, h)
			}
		}
		if len(picked) == 0 {
			owners := make([]string, len(holds))
			for i, h := range holds {
				owners[i] = h.value
			}
			fmt.Fprintf(stdout, "%s: no holder is %q (it is held by %s): nothing broken\n", k.Lease, cfg.holder, strings.Join(owners, ", "))
			return &exitStatus{code: exitNothing}
		}
		holds = picked
	}

	broke := 0
	for _, h := range holds {
		rctx, cancel := context.WithTimeout(ctx, breakTimeout)
		rel, err := b.lc.Release(rctx, keys, h.value)
		cancel()
		if err != nil {
			if broke > 0 {
				err = fmt.Errorf("%w (after breaking %d of %d holds)", err, broke, len(holds))
			}
			return &exitStatus{code: exitFailed, err: fmt.Errorf("breaking %s of %s: %w", h.value, k.Lease, err)}
		}
		fmt.Fprintln(stdout, b.report(h, rel))
		if rel.Deleted {
			broke++
		}
	}
	if broke == 0 {
		return &exitStatus{code: exitNothing}
	}
	return nil
}

// holds returns the live holds of the lease now, with the keys that
// release them: a lock's (an election's, so that those who follow an
// election learn of the break at once; nobody listens on a lock's channel)
// for a lock's string, a lock's for a read-write lock's hash (the release
// script of a lock drops a hold in either format), a semaphore's with its
// permits for a sorted set. A free lease has no holds; a key that distlock
// did not write is an error.
func (b *breaker) holds(ctx context.Context) (lease.Keys, []hold, error) {
	ctx, cancel := context.WithTimeout(ctx, breakTimeout)
	defer cancel()
	snap, err := b.lc.Read(ctx, b.k)
	if err != nil {
		return b.k, nil, fmt.Errorf("reading %s: %w", b.k.Lease, err)
	}
	switch snap.Type {
	case "none":
		return b.k, nil, nil
	case "string":
		if len(snap.Holders) != 1 {
			return b.k, nil, fmt.Errorf("reading %s: %d holders of a lock", b.k.Lease, len(snap.Holders))
		}
		h := snap.Holders[0]
		return b.k.Election(), []hold{{value: h.Value, token: snap.Fence, left: h.TTL}}, nil
	case "zset":
		// The permits of the last grant; unknown, as many as hold now, so
		// that each freed permit goes to the next in line and no more.
		permits := max(snap.Limit, len(snap.Holders), 1)
		holds := make([]hold, len(snap.Holders))
		for i, h := range snap.Holders {
			holds[i] = hold{value: h.Value, left: h.TTL}
		}
		return b.k.Semaphore(permits), holds, nil
	case "hash":
		return b.rwHolds(ctx)
	}
	return b.k, nil, fmt.Errorf("%s holds a %s, not a lock, semaphore or read-write lock: distlock did not write it, and break leaves it alone", b.k.Lease, snap.Type)
}

// rwHolds returns the live holds of a read-write lock's hash, each with
// the token its field keeps ("<end ms> <token>").
func (b *breaker) rwHolds(ctx context.Context) (lease.Keys, []hold, error) {
	rw, err := b.lc.ReadRW(ctx, b.k)
	if err != nil {
		return b.k, nil, fmt.Errorf("reading %s: %w", b.k.Lease, err)
	}
	if !rw.Marked {
		return b.k, nil, fmt.Errorf("%s holds a hash that distlock did not write, and break leaves it alone", b.k.Lease)
	}
	if len(rw.Holders) == 0 {
		return b.k, nil, nil
	}
	fields := make([]string, len(rw.Holders))
	for i, h := range rw.Holders {
		fields[i] = h.Value
	}
	vals, err := b.rc.Do(ctx, b.rc.B().Hmget().Key(b.k.Lease).Field(fields...).Build()).ToArray()
	if err != nil {
		return b.k, nil, fmt.Errorf("reading %s: %w", b.k.Lease, err)
	}
	holds := make([]hold, len(rw.Holders))
	for i, h := range rw.Holders {
		holds[i] = hold{value: h.Value, left: h.TTL}
		if i < len(vals) {
			// A hold that ended since the read has no field: no token.
			s, _ := vals[i].ToString()
			if _, tok, ok := strings.Cut(s, " "); ok {
				holds[i].token, _ = strconv.ParseInt(tok, 10, 64)
			}
		}
	}
	return b.k, holds, nil
}

// report says what breaking h did:
//
//	broke distlock:{k}: held by db-2:4711 (value db-2:4711#<uuid>, token 17, 58.2s left); passed to db-1:812 (token 18)
//	distlock:{k}: db-2:4711 (value ...) no longer holds it: nothing broken
func (b *breaker) report(h hold, rel lease.Release) string {
	var s strings.Builder
	who := fmt.Sprintf("%s (value %s", lease.Owner(h.value), h.value)
	if h.token > 0 {
		who += fmt.Sprintf(", token %d", h.token)
	}
	if !rel.Deleted {
		fmt.Fprintf(&s, "%s: %s) no longer holds it (released, expired or broken meanwhile): nothing broken", b.k.Lease, who)
	} else if h.left >= 0 {
		fmt.Fprintf(&s, "broke %s: held by %s, %v left)", b.k.Lease, who, h.left.Round(time.Millisecond))
	} else {
		fmt.Fprintf(&s, "broke %s: held by %s, without expiry)", b.k.Lease, who)
	}
	passes := rel.Passes()
	switch {
	case len(passes) == 0 && rel.Deleted:
		s.WriteString("; nobody was in line")
	case len(passes) > 0:
		s.WriteString("; passed to ")
		for i, p := range passes {
			if i > 0 {
				s.WriteString(", ")
			}
			fmt.Fprintf(&s, "%s (token %d)", lease.Owner(p.Value), p.Token)
		}
	}
	return s.String()
}
