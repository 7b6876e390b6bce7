package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
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

const inspectUsage = `Usage: distlock inspect [flags] KEY [KEY...]

Shows who holds the lock KEY (the owner id from the lock's value), how long
its lease has left, the last fencing token issued for it, and who waits for
it (the owners of the first 10 in line, first in line first). It only reads:
it never changes the lock.

KEY may also name a semaphore, a read-write lock or an election; the type
of its Redis key tells which. For a semaphore it shows the holders (their owners and how long
each lease has left, the first 10 to end, and how many in all), its number
of permits as of the last grant (the number is not kept as a rule: each
caller brings its own), how many of them are free, the line and the last
token. For a read-write lock (what "distlock run" holds) it shows how it is
held (by readers, or by a writer), the holders with how long each lease has
left, and the line with the mode each waiter waits for. A read-write lock
and a Mutex or Election of the Go library of one name are one lock: when a
Mutex holds it, it shows as a lock, with the line's modes if a read-write
lock's waiter stands in it (a Mutex's waiter waits as a writer). For an election it
shows the leader (the value it proclaimed), its
term token and lease, and how many observers follow it: the subscriptions
to its leader channel, one per observed Election value in each process. A
lock and an election that nobody observes look alike, and are shown as a
lock.

It also shows the name's void markers (NAMESPACE:{KEY}:void:<value>):
each is a waiter that gave up (its wait was cancelled or ran out, a
MultiMutex's Lock among them), and lasts one TTL, during which a late
acquire with that value is refused. Nothing lists them, so inspect scans
the keyspace for them (SCAN MATCH, on every node): on a database of
millions of keys that is a pass over all of them, which --watch makes at
most every 5s.

With --watch it prints the state, then reads it again every --interval and
prints one line for each change it sees (a new holder, a release, a new
token, an error) until interrupted. It reads, it does not follow every
event: a hold that begins and ends between two reads is not shown, but the
token it took is, in the next line. With --json each state is one JSON
object per line:

  {"time":"...","key":"distlock:{backup}","state":"held","kind":"lock",
   "owner":"db-2:4711","value":"db-2:4711#<uuid>","expires_in_ms":8734,
   "last_token":1760086512345678,"waiting":2,"waiters":["db-1:812","db-3:77"]}

state is "held", "free" or "error"; expires_in_ms is -1 for a key without
expiry (not written by distlock); last_token is missing if the lock was never
acquired (or not in the last 24 hours). kind is "lock", "semaphore",
"rwmutex", "election" (when someone observes it), or missing for a free key
that nothing tells more of. A semaphore has "holding" (how many hold a permit),
"holders" (the first 10: owner, value, expires_in_ms), and "permits" and
"free_permits" when known, instead of owner, value and expires_in_ms; an
election has "observers"; a read-write lock has "mode" ("read" or
"write"), "holding" and "holders" as a semaphore has, and "line" (the first
10 in line: owner and mode), which a lock has too when a read-write lock's
waiter stands in its line. Every kind has "voided" (how many void markers
the name has) and "voids" (the first 10 to end: owner, value,
expires_in_ms) when it has any.

With several KEYs it shows each one as above, a line each in the order
given, and then a line for each request that holds several of them, or
holds some and stands in another's line: a "distlock run" with several
-k, or a distlock.MultiMutex. Such a request takes its names one after the
other (by Redis Cluster slot, then by key), holds those it has (with a
lease of its claim window while it waits) and stands in the line of the
next, with one lease value in all of them; inspect finds that value in each
line and shows the request once:

  request db-2:4711#<uuid>  holds ledger, users; waits in the line of accounts, at place 1 of 2

Place 1 is the first in line. A request that holds none of the KEYs yet
shows only as a waiter in a line, as any waiter does. With --watch, each
change prints every one of those lines again, each with the time. With
--json, several
KEYs print one object per look, with a "locks" array of the objects above
(one per KEY, in the order given) and a "requests" array:

  {"time":"...","locks":[{"key":"distlock:{accounts}",...},...],
   "requests":[{"owner":"db-2:4711","value":"db-2:4711#<uuid>",
     "holds":["ledger","users"],"waits":[{"name":"accounts","place":1,"waiting":2}]}]}

Flags may come before or after the KEYs.

Exit status:
  0      the lock is held (by anyone, even a key not written by distlock),
         a semaphore has a holder, or an election a leader; with several
         KEYs, at least one of them is
  1      the lock is free (a semaphore without holders, an election
         without a leader); with several KEYs, all of them are
  64     usage error
  125    Redis cannot be read, or the lock's keys hold something else
With --watch, the state does not set the status: it is 0 when interrupted,
125 if stdout is closed.

Examples:
  distlock inspect nightly-report
  if distlock inspect nightly-report >/dev/null; then echo "still running"; fi
  distlock inspect --watch --interval 1s --namespace jobs nightly-report
  distlock inspect --json backup | jq .owner
  distlock inspect --json workers | jq .free_permits
  distlock inspect accounts ledger users    # and who holds or waits for several at once

Flags:
`

// inspectConfig is the command line of "distlock inspect".
type inspectConfig struct {
	common
	names    []string // the KEYs, in the order given
	watch    bool
	interval time.Duration
	json     bool
}

// inspectFlags returns the flag set of "distlock inspect", bound to c.
func inspectFlags(c *inspectConfig) *flag.FlagSet {
	fs := newFlagSet("inspect")
	c.register(fs, "; inspect needs a real Redis", 0)
	fs.BoolVar(&c.watch, "watch", false, "print each change until interrupted")
	durationVar(fs, &c.interval, "interval", defaultWatchInterval, "how often (`DURATION`) --watch looks")
	fs.BoolVar(&c.json, "json", false, "print JSON objects, one per line")
	return fs
}

// parseInspect parses the command line of "distlock inspect": flags before,
// between or after the KEYs; after "--", only KEYs.
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
		return c, usagef("missing KEY: distlock inspect [flags] KEY [KEY...]")
	case c.interval < minWatchInterval:
		return c, usagef("--interval must be at least %v", minWatchInterval)
	}
	for i, w := range words {
		if slices.Contains(words[:i], w) {
			return c, usagef("KEY %q is given twice", w)
		}
	}
	c.names = words
	return c, nil
}

// maxNamedWaiters is how many waiters inspect names, first in line first.
const maxNamedWaiters = 10

// maxNamedHolders is how many holders of a semaphore inspect names, the
// first lease to end first.
const maxNamedHolders = 10

// The kinds of lock that inspect tells apart, in lockState.Kind.
const (
	kindLock      = "lock"
	kindSemaphore = "semaphore"
	kindElection  = "election"
	kindRWMutex   = "rwmutex"
)

// lockState is what inspect reports about a lock, semaphore or election at
// one moment. Its JSON form is the --json output.
type lockState struct {
	Time  time.Time `json:"time"`
	Key   string    `json:"key"`   // the lease key, NAMESPACE:{KEY}
	State string    `json:"state"` // "held", "free" or "error"
	// Kind is what the key is, as far as Redis tells: "semaphore",
	// "election" (someone observes its leader), "lock" (held, and nobody
	// observes it: a lock, or an election without observers), or empty
	// (free, and nothing tells).
	Kind string `json:"kind,omitempty"`
	// Owner, Value and ExpiresInMS describe the holder of a lock, or the
	// leader of an election.
	Owner string `json:"owner,omitempty"`
	Value string `json:"value,omitempty"`
	// ExpiresInMS is the remaining lease of a held lock, -1 if the key has
	// no expiry.
	ExpiresInMS *int64 `json:"expires_in_ms,omitempty"`
	// LastToken is the last fencing token issued: for a held lock or
	// election, its holder's (an election's term token).
	LastToken int64 `json:"last_token,omitempty"`
	// Holding is how many hold a permit of a semaphore; Holders describes
	// the first maxNamedHolders of them, the first lease to end first.
	Holding int           `json:"holding,omitempty"`
	Holders []holderState `json:"holders,omitempty"`
	// Permits is the semaphore's number of permits as of its last grant (0:
	// unknown); FreePermits is how many of them nobody holds, when known.
	Permits     int  `json:"permits,omitempty"`
	FreePermits *int `json:"free_permits,omitempty"`
	// Observers is how many subscriptions follow an election's leader.
	Observers int `json:"observers,omitempty"`
	// Mode is how a read-write lock is held: "read" (Holders are its
	// readers) or "write" (Holders is its writer).
	Mode string `json:"mode,omitempty"`
	// Line is, for a read-write lock, and for a lock whose line a
	// read-write lock of the name stands in, the first in line with the
	// mode each waits for ("write" for a Mutex's or an Election's waiter,
	// which waits for the lock alone), first in line first.
	Line []waiterState `json:"line,omitempty"`
	// Waiting is how many Lock calls stand in the lock's line; Waiters
	// names the owners of the first ones, first in line first.
	Waiting int      `json:"waiting"`
	Waiters []string `json:"waiters,omitempty"`
	// Voided is how many void markers the name has: values that gave up
	// waiting, whose late acquire Redis refuses while the marker lasts
	// (one TTL). Voids names the first maxNamedVoids to end.
	Voided int         `json:"voided,omitempty"`
	Voids  []voidState `json:"voids,omitempty"`
	Error  string      `json:"error,omitempty"`
}

// waiterState is one waiter in a line that shows modes.
type waiterState struct {
	Owner string `json:"owner"`
	Mode  string `json:"mode"` // "read" or "write"
}

// holderState is one holder of a semaphore's permit, or of a read-write
// lock.
type holderState struct {
	Owner       string `json:"owner"`
	Value       string `json:"value"`
	ExpiresInMS int64  `json:"expires_in_ms"`
}

// differs reports whether s and o describe different states, ignoring the
// time and the leases' countdowns.
func (s lockState) differs(o lockState) bool {
	noExpiry := func(l lockState) bool { return l.ExpiresInMS != nil && *l.ExpiresInMS < 0 }
	holders := func(l lockState) []string {
		var vs []string
		for _, h := range l.Holders {
			vs = append(vs, h.Value)
		}
		return vs
	}
	return s.State != o.State || s.Kind != o.Kind || s.Value != o.Value || s.LastToken != o.LastToken ||
		s.Waiting != o.Waiting || s.Error != o.Error || noExpiry(s) != noExpiry(o) ||
		s.Holding != o.Holding || !slices.Equal(holders(s), holders(o)) ||
		s.Permits != o.Permits || s.Observers != o.Observers || s.Mode != o.Mode || !slices.Equal(s.Line, o.Line) ||
		s.Voided != o.Voided
}

// runInspect implements "distlock inspect". Without --watch it returns nil
// for a held lock and an *exitStatus with exitFree for a free one; a
// failure is an *exitStatus with exitFailed.
func runInspect(ctx context.Context, args []string, stdout, _ io.Writer) error {
	cfg, err := parseInspect(args)
	if err != nil {
		return err
	}
	keys := make([]lease.Keys, len(cfg.names))
	for i, name := range cfg.names {
		if keys[i], err = lease.NewKeys(cfg.namespace, name); err != nil {
			return usageError{err}
		}
	}
	client, _, closeClient, err := connectReal(cfg.redis, time.Time{})
	if err != nil {
		return err
	}
	defer closeClient()
	in := &inspector{rc: client, lc: lease.New(client), names: cfg.names, keys: keys}
	if cfg.watch {
		in.voidEvery = voidScanEvery
	}

	emit := func(s lookState) error {
		if cfg.json {
			// One KEY prints its lockState alone, as it always has.
			var v any = s
			if len(s.Locks) == 1 {
				v = s.Locks[0]
			}
			b, err := json.Marshal(v)
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
		s, err := in.look(ctx)
		if err == nil {
			err = emit(s)
		}
		switch {
		case err != nil:
			return &exitStatus{code: exitFailed, err: err}
		case !s.held():
			return &exitStatus{code: exitFree}
		}
		return nil // held
	}
	if err := in.watch(ctx, cfg.interval, emit); err != nil {
		return &exitStatus{code: exitFailed, err: err}
	}
	return nil
}

// inspector reads the state of the locks, semaphores or elections named
// on the command line.
type inspector struct {
	rc    rueidis.Client
	lc    *lease.Client
	names []string     // as given
	keys  []lease.Keys // of each name
	// voidScans is the last scan for void markers of each lease key, and
	// voidEvery how old it may be before the next look scans again (0:
	// every look scans).
	voidScans map[string]voidScan
	voidEvery time.Duration
}

// watch prints the state, then every change, until ctx is done. A Redis
// error is a state like any other: it is printed once, and watching goes
// on.
func (in *inspector) watch(ctx context.Context, interval time.Duration, emit func(lookState) error) error {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	var last *lookState
	for {
		s, _ := in.look(ctx) // an error is in s, as the state of the KEY it concerns
		if ctx.Err() != nil {
			return nil // interrupted: the normal end of a watch
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

// inspect reads the state of one lock once: the holders, the fencing
// token and the permits in one round trip (lease.Client.Read, which the
// key's type tells the kind by), the line of waiters in a second, and for
// a lock or election the observers of its leader in a third. The holders,
// token and permits belong together; the line and the observers may be a
// moment newer.
func (in *inspector) inspect(ctx context.Context, keys lease.Keys) (lockState, error) {
	ctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	s := lockState{Time: time.Now(), Key: keys.Lease, State: "free"}
	snap, err := in.lc.Read(ctx, keys)
	if err != nil {
		return s, fmt.Errorf("reading %s: %w", keys.Lease, err)
	}
	line, err := in.lc.ReadLine(ctx, keys, maxNamedWaiters)
	if err != nil {
		return s, fmt.Errorf("reading %s: %w", keys.Queue, err)
	}
	s.Waiting = line.Waiting
	for _, v := range line.Values {
		s.Waiters = append(s.Waiters, lease.Owner(v))
	}
	entries := line.Entries
	// Read reports a fencing key that holds no token as no token; say so
	// instead.
	if line.FenceSet {
		if n, err := strconv.ParseInt(line.Fence, 10, 64); err != nil || n <= 0 {
			return s, fmt.Errorf("fencing key %s holds %q, not a token", keys.Fence, line.Fence)
		}
	}
	s.LastToken = snap.Fence

	switch snap.Type {
	case "hash":
		s.Kind = kindRWMutex
		return s, in.rwmutex(ctx, &s, keys, entries)
	case "zset":
		s.Kind = kindSemaphore
		s.semaphore(snap)
		return s, nil
	case "string":
		if len(snap.Holders) != 1 {
			return s, fmt.Errorf("reading %s: %d holders of a lock", keys.Lease, len(snap.Holders))
		}
		h := snap.Holders[0]
		ms := h.TTL.Milliseconds()
		if h.TTL < 0 {
			ms = -1
		}
		s.State, s.Kind, s.Value, s.Owner, s.ExpiresInMS = "held", kindLock, h.Value, lease.Owner(h.Value), &ms
	case "none":
		if snap.Limit > 0 {
			// A semaphore whose last holder has left.
			s.Kind = kindSemaphore
			s.semaphore(snap)
			return s, nil
		}
	default:
		return s, fmt.Errorf("%s holds a %s, not a lock, semaphore, election or rwmutex", keys.Lease, snap.Type)
	}
	// A Mutex's or an Election's hold, or a free key: the line shows its
	// modes when a read-write lock of the name waits in it (they are one
	// lock). Those who observe an election tell it from a lock. Not
	// knowing is no error: a lock and an election without observers look
	// alike anyway.
	if anyMode(entries) {
		s.line(entries)
	}
	if n, err := in.observers(ctx, keys); err == nil && n > 0 {
		s.Kind, s.Observers = kindElection, n
	}
	return s, nil
}

// rwmutex fills in s for a read-write lock: its holders, and the modes of
// those in line from their entries.
func (in *inspector) rwmutex(ctx context.Context, s *lockState, keys lease.Keys, entries []string) error {
	rw, err := in.lc.ReadRW(ctx, keys)
	if err != nil {
		return fmt.Errorf("reading %s: %w", keys.Lease, err)
	}
	if !rw.Marked {
		return fmt.Errorf("%s holds a hash, not a lock, semaphore, election or rwmutex", keys.Lease)
	}
	for _, h := range rw.Holders {
		if h.Value == rw.Writer {
			s.Mode = "write"
		}
		if len(s.Holders) < maxNamedHolders {
			s.Holders = append(s.Holders, holderState{Owner: lease.Owner(h.Value), Value: h.Value, ExpiresInMS: h.TTL.Milliseconds()})
		}
		s.Holding++
	}
	if s.Holding > 0 {
		s.State = "held"
		if s.Mode == "" {
			s.Mode = "read"
		}
	}
	s.line(entries)
	return nil
}

// line fills in s.Line from the entries of those in line: a read-write
// lock's "<lapse> <claim> <r|w> <room>", or a Mutex's or an Election's
// "<lapse> <claim> <room>", which waits for the lock alone, as a writer.
func (s *lockState) line(entries []string) {
	for i, e := range entries {
		mode := "?"
		switch f := strings.Fields(e); {
		case len(f) == 4 && (f[2] == "r" || f[2] == "w"):
			mode = map[string]string{"r": "read", "w": "write"}[f[2]]
		case len(f) == 3:
			mode = "write"
		}
		s.Line = append(s.Line, waiterState{Owner: s.Waiters[i], Mode: mode})
	}
}

// anyMode reports whether an entry in line is a read-write lock's, whose
// mode the line is shown with when a Mutex holds the lock or nobody does.
func anyMode(entries []string) bool {
	for _, e := range entries {
		if f := strings.Fields(e); len(f) == 4 && (f[2] == "r" || f[2] == "w") {
			return true
		}
	}
	return false
}

// semaphore fills in s from a read of a semaphore.
func (s *lockState) semaphore(snap lease.Snapshot) {
	s.Holding = len(snap.Holders)
	if s.Holding > 0 {
		s.State = "held"
	}
	for _, h := range snap.Holders[:min(len(snap.Holders), maxNamedHolders)] {
		s.Holders = append(s.Holders, holderState{Owner: lease.Owner(h.Value), Value: h.Value, ExpiresInMS: h.TTL.Milliseconds()})
	}
	if snap.Limit > 0 {
		s.Permits = snap.Limit
		free := max(snap.Limit-s.Holding, 0)
		s.FreePermits = &free
	}
}

// observers returns how many subscriptions follow the leader channel of an
// election of this name: the sharded channel that the library subscribes
// to, or the plain one on a server without sharded pub/sub (Redis 6.2),
// where the library falls back to it. A plain subscription is on whichever
// node its client picked (a plain publish reaches every node of a
// Cluster), so those are counted on every node the client knows.
func (in *inspector) observers(ctx context.Context, keys lease.Keys) (int, error) {
	ch := keys.Leader
	n, err := numsub(in.rc.Do(ctx, in.rc.B().PubsubShardnumsub().Channel(ch).Build()), ch)
	var re *rueidis.RedisError
	if !errors.As(err, &re) || !strings.Contains(strings.ToLower(re.Error()), "unknown") {
		return n, err
	}
	n = 0
	for _, node := range in.rc.Nodes() {
		m, err := numsub(node.Do(ctx, node.B().PubsubNumsub().Channel(ch).Build()), ch)
		if err != nil {
			return 0, err
		}
		n += m
	}
	return n, nil
}

// numsub reads the reply of PUBSUB NUMSUB or SHARDNUMSUB for ch: a flat
// list of channels and counts (a map in RESP3).
func numsub(res rueidis.RedisResult, ch string) (int, error) {
	m, err := res.AsIntMap()
	if err != nil {
		return 0, err
	}
	return int(m[ch]), nil
}

// text is the human form of s: one line, prefixed with the time for a watch.
func (s lockState) text(withTime bool) string {
	var b strings.Builder
	if withTime {
		b.WriteString(s.Time.Format("15:04:05.000  "))
	}
	b.WriteString(s.Key)
	switch {
	case s.State == "error":
		fmt.Fprintf(&b, "  error: %s", s.Error)
		return b.String()
	case s.Kind == kindSemaphore:
		s.semaphoreText(&b)
	case s.Kind == kindRWMutex:
		s.rwmutexText(&b)
	case s.State == "held" && s.Kind == kindElection:
		fmt.Fprintf(&b, "  election led by %s", s.Owner)
		s.expiryText(&b)
		fmt.Fprintf(&b, "  term token %d", s.LastToken)
	case s.State == "held":
		fmt.Fprintf(&b, "  held by %s", s.Owner)
		s.expiryText(&b)
	case s.Kind == kindElection:
		b.WriteString("  election without a leader")
	default:
		b.WriteString("  free")
	}
	if s.State != "held" || s.Kind != kindElection {
		if s.LastToken > 0 {
			fmt.Fprintf(&b, "  last token %d", s.LastToken)
		} else {
			b.WriteString("  no token issued")
		}
	}
	if s.Observers > 0 {
		fmt.Fprintf(&b, "  observers: %d", s.Observers)
	}
	if s.Waiting > 0 && s.Line != nil {
		fmt.Fprintf(&b, "  %d waiting: ", s.Waiting)
		for i, w := range s.Line {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s (%s)", w.Owner, w.Mode)
		}
		if s.Waiting > len(s.Line) {
			b.WriteString(", ...")
		}
	} else if s.Waiting > 0 {
		fmt.Fprintf(&b, "  %d waiting: %s", s.Waiting, strings.Join(s.Waiters, ", "))
		if s.Waiting > len(s.Waiters) {
			b.WriteString(", ...")
		}
	}
	s.voidText(&b)
	return b.String()
}

// expiryText writes how long the lease of a held lock or election has left.
func (s lockState) expiryText(b *strings.Builder) {
	if ms := *s.ExpiresInMS; ms >= 0 {
		fmt.Fprintf(b, "  expires in %v", time.Duration(ms)*time.Millisecond)
	} else {
		b.WriteString("  with no expiry (not written by distlock)")
	}
}

// rwmutexText writes the holders of a read-write lock:
//
//	rwmutex held by 2 readers: a (expires in 4.2s), b (expires in 3.1s)
//	rwmutex held by a (writer, expires in 9.9s)
func (s lockState) rwmutexText(b *strings.Builder) {
	switch {
	case s.Holding == 0:
		b.WriteString("  rwmutex free")
		return
	case s.Mode == "write":
		h := s.Holders[0]
		fmt.Fprintf(b, "  rwmutex held by %s (writer, expires in %v)", h.Owner, time.Duration(h.ExpiresInMS)*time.Millisecond)
		return
	}
	fmt.Fprintf(b, "  rwmutex held by %d readers: ", s.Holding)
	s.holdersText(b)
}

// holdersText writes the holders of a semaphore or of a read-write lock's
// readers: "a (expires in 4.2s), b (expires in 3.1s), and 3 more".
func (s lockState) holdersText(b *strings.Builder) {
	for i, h := range s.Holders {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(b, "%s (expires in %v)", h.Owner, time.Duration(h.ExpiresInMS)*time.Millisecond)
	}
	if s.Holding > len(s.Holders) {
		fmt.Fprintf(b, ", and %d more", s.Holding-len(s.Holders))
	}
}

// semaphoreText writes the holders and permits of a semaphore:
//
//	semaphore held by 2: a (expires in 4.2s), b (expires in 3.1s)  permits: 4 (as of the last grant), 2 free
func (s lockState) semaphoreText(b *strings.Builder) {
	if s.Holding == 0 {
		b.WriteString("  semaphore free")
	} else {
		fmt.Fprintf(b, "  semaphore held by %d: ", s.Holding)
		s.holdersText(b)
	}
	if s.Permits > 0 {
		fmt.Fprintf(b, "  permits: %d (as of the last grant), %d free", s.Permits, *s.FreePermits)
	} else {
		b.WriteString("  permits: unknown")
	}
}
