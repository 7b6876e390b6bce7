package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/lease"
)

// Exit codes of "distlock inspect" without --watch, so that a script can
// ask whether a lock is held, as it asks grep(1) whether a line matches.
const (
	exitHeld = 0 // the lock is held
	exitFree = 1 // the lock is free
)

// Timing of "distlock inspect".
const (
	defaultWatchInterval = 500 * time.Millisecond
	minWatchInterval     = 10 * time.Millisecond
	// inspectTimeout bounds one look at Redis, so that a hung server shows
	// up as an error instead of a frozen watch.
	inspectTimeout = 5 * time.Second
)

const inspectUsage = `Usage: distlock inspect [flags] KEY

Shows who holds the lock KEY (the owner id from the lock's value), how long
its lease has left, the last fencing token issued for it, and who waits for
it (the owners of the first 10 in line, first in line first). It only reads:
it never changes the lock.

With --watch it prints the state, then one line for each change (a new
holder, a release, a new token, an error) until interrupted; it polls every
--interval. With --json each state is one JSON object per line:

  {"time":"...","key":"distlock:{backup}","state":"held","owner":"db-2:4711",
   "value":"db-2:4711#<uuid>","expires_in_ms":8734,"last_token":1760086512345678,
   "waiting":2,"waiters":["db-1:812","db-3:77"]}

state is "held", "free" or "error"; expires_in_ms is -1 for a key without
expiry (not written by distlock); last_token is missing if the lock was never
acquired (or not in the last 24 hours).

Flags may come before or after KEY.

Exit status:
  0      the lock is held (by anyone, even a key not written by distlock)
  1      the lock is free
  64     usage error
  125    Redis cannot be read, or the lock's keys hold something else
With --watch, the state does not set the status: it is 0 when interrupted,
125 if stdout is closed.

Examples:
  distlock inspect nightly-report
  if distlock inspect nightly-report >/dev/null; then echo "still running"; fi
  distlock inspect --watch --interval 1s --namespace jobs nightly-report
  distlock inspect --json backup | jq .owner

Flags:
`

// inspectConfig is the command line of "distlock inspect".
type inspectConfig struct {
	common
	key      string
	watch    bool
	interval time.Duration
	json     bool
}

// inspectFlags returns the flag set of "distlock inspect", bound to c.
func inspectFlags(c *inspectConfig) *flag.FlagSet {
	fs := newFlagSet("inspect")
	c.register(fs, "; inspect needs a real Redis", 0)
	fs.BoolVar(&c.watch, "watch", false, "print each change until interrupted")
	fs.DurationVar(&c.interval, "interval", defaultWatchInterval, "how often (`DURATION`) --watch looks")
	fs.BoolVar(&c.json, "json", false, "print JSON objects, one per line")
	return fs
}

// parseInspect parses the command line of "distlock inspect": flags before
// or after KEY; after "--", only KEY.
func parseInspect(args []string) (inspectConfig, error) {
	var c inspectConfig
	fs := inspectFlags(&c)
	var words []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return c, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if endedByDashDash(fs, args, rest) {
			words = append(words, rest...)
			break
		}
		words, args = append(words, rest[0]), rest[1:]
	}
	switch {
	case len(words) == 0:
		return c, usagef("missing KEY: distlock inspect [flags] KEY")
	case len(words) > 1:
		return c, usagef("one KEY only (got %q)", words)
	case c.interval < minWatchInterval:
		return c, usagef("--interval must be at least %v", minWatchInterval)
	}
	c.key = words[0]
	return c, nil
}

// inspectScript reads a lock's state in one step, so that the value, its TTL,
// the token and the line belong together.
//
// KEYS[1] lease key, KEYS[2] fencing key, KEYS[3] the line of waiters.
// ARGV[1] how many waiters to name.
// Reply: {value or nil, pttl, last token or nil, waiters in line, the first
// ARGV[1] of their values}. pttl is -2 when the lease key does not exist and
// -1 when it has no expiry.
var inspectScript = rueidis.NewLuaScriptReadOnly(`
local n = redis.call('ZCARD', KEYS[3])
local first = redis.call('ZRANGE', KEYS[3], 0, tonumber(ARGV[1]) - 1)
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), n, first}
`)

// maxNamedWaiters is how many waiters inspect names, first in line first.
const maxNamedWaiters = 10

// lockState is what inspect reports about a lock at one moment. Its JSON
// form is the --json output.
type lockState struct {
	Time  time.Time `json:"time"`
	Key   string    `json:"key"`   // the lease key, NAMESPACE:{KEY}
	State string    `json:"state"` // "held", "free" or "error"
	Owner string    `json:"owner,omitempty"`
	Value string    `json:"value,omitempty"`
	// ExpiresInMS is the remaining lease of a held lock, -1 if the key has
	// no expiry.
	ExpiresInMS *int64 `json:"expires_in_ms,omitempty"`
	LastToken   int64  `json:"last_token,omitempty"`
	// Waiting is how many Lock calls stand in the lock's line; Waiters
	// names the owners of the first ones, first in line first.
	Waiting int      `json:"waiting"`
	Waiters []string `json:"waiters,omitempty"`
	Error   string   `json:"error,omitempty"`
}

// differs reports whether s and o describe different states, ignoring the
// time and the lease's countdown.
func (s lockState) differs(o lockState) bool {
	noExpiry := func(l lockState) bool { return l.ExpiresInMS != nil && *l.ExpiresInMS < 0 }
	return s.State != o.State || s.Value != o.Value || s.LastToken != o.LastToken ||
		s.Waiting != o.Waiting || s.Error != o.Error || noExpiry(s) != noExpiry(o)
}

// runInspect implements "distlock inspect". Without --watch it returns nil
// for a held lock and an *exitStatus with exitFree for a free one; a
// failure is an *exitStatus with exitFailed.
func runInspect(ctx context.Context, args []string, stdout, _ io.Writer) error {
	cfg, err := parseInspect(args)
	if err != nil {
		return err
	}
	keys, err := lease.NewKeys(cfg.namespace, cfg.key)
	if err != nil {
		return usageError{err}
	}
	client, _, closeClient, err := connect(cfg.redis, false)
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			return err
		}
		return &exitStatus{code: exitFailed, err: err}
	}
	defer closeClient()

	emit := func(s lockState) error {
		if cfg.json {
			b, err := json.Marshal(s)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(stdout, "%s\n", b)
			return err
		}
		_, err := fmt.Fprintln(stdout, s.text(cfg.watch))
		return err
	}
	if !cfg.watch {
		s, err := inspect(ctx, client, keys)
		if err == nil {
			err = emit(s)
		}
		switch {
		case err != nil:
			return &exitStatus{code: exitFailed, err: err}
		case s.State == "free":
			return &exitStatus{code: exitFree}
		}
		return nil // held
	}
	if err := watch(ctx, client, keys, cfg.interval, emit); err != nil {
		return &exitStatus{code: exitFailed, err: err}
	}
	return nil
}

// watch prints the lock's state, then every change, until ctx is done. A
// Redis error is a state like any other: it is printed once, and watching
// goes on.
func watch(ctx context.Context, client rueidis.Client, keys lease.Keys, interval time.Duration, emit func(lockState) error) error {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	var last *lockState
	for {
		s, err := inspect(ctx, client, keys)
		if ctx.Err() != nil {
			return nil // interrupted: the normal end of a watch
		}
		if err != nil {
			s = lockState{Time: time.Now(), Key: keys.Lease, State: "error", Error: err.Error()}
		}
		if last == nil || s.differs(*last) {
			if err := emit(s); err != nil {
				return err // stdout is gone (a closed pipe): nobody is watching
			}
			last = &s
		}
		select {
		case <-ticker.C:
		case <-ctx.Done():
			return nil
		}
	}
}

// inspect reads the lock's state once.
func inspect(ctx context.Context, client rueidis.Client, keys lease.Keys) (lockState, error) {
	ctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	s := lockState{Time: time.Now(), Key: keys.Lease, State: "free"}
	arr, err := inspectScript.Exec(ctx, client, []string{keys.Lease, keys.Fence, keys.Queue},
		[]string{strconv.Itoa(maxNamedWaiters)}).ToArray()
	if err != nil {
		return s, fmt.Errorf("reading %s: %w", keys.Lease, err)
	}
	if len(arr) != 5 {
		return s, fmt.Errorf("reading %s: %d replies instead of 5", keys.Lease, len(arr))
	}
	if n, err := arr[3].AsInt64(); err == nil {
		s.Waiting = int(n)
	}
	if values, err := arr[4].AsStrSlice(); err == nil {
		for _, v := range values {
			s.Waiters = append(s.Waiters, lease.Owner(v))
		}
	}
	pttl, err := arr[1].AsInt64()
	if err != nil {
		return s, fmt.Errorf("reading %s: %w", keys.Lease, err)
	}
	if v, err := arr[0].ToString(); err == nil {
		s.State, s.Value, s.Owner = "held", v, lease.Owner(v)
		s.ExpiresInMS = &pttl
	} else if !rueidis.IsRedisNil(err) {
		return s, fmt.Errorf("reading %s: %w", keys.Lease, err)
	}
	if raw, err := arr[2].ToString(); err == nil {
		if s.LastToken, err = strconv.ParseInt(raw, 10, 64); err != nil || s.LastToken <= 0 {
			return s, fmt.Errorf("fencing key %s holds %q, not a token", keys.Fence, raw)
		}
	} else if !rueidis.IsRedisNil(err) {
		return s, fmt.Errorf("reading %s: %w", keys.Fence, err)
	}
	return s, nil
}

// text is the human form of s: one line, prefixed with the time for a watch.
func (s lockState) text(withTime bool) string {
	var b strings.Builder
	if withTime {
		b.WriteString(s.Time.Format("15:04:05.000  "))
	}
	b.WriteString(s.Key)
	switch s.State {
	case "error":
		fmt.Fprintf(&b, "  error: %s", s.Error)
		return b.String()
	case "held":
		fmt.Fprintf(&b, "  held by %s", s.Owner)
		if ms := *s.ExpiresInMS; ms >= 0 {
			fmt.Fprintf(&b, "  expires in %v", time.Duration(ms)*time.Millisecond)
		} else {
			b.WriteString("  with no expiry (not written by distlock)")
		}
	default:
		b.WriteString("  free")
	}
	if s.LastToken > 0 {
		fmt.Fprintf(&b, "  last token %d", s.LastToken)
	} else {
		b.WriteString("  no token issued")
	}
	if s.Waiting > 0 {
		fmt.Fprintf(&b, "  %d waiting: %s", s.Waiting, strings.Join(s.Waiters, ", "))
		if s.Waiting > len(s.Waiters) {
			b.WriteString(", ...")
		}
	}
	return b.String()
}
