package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/lease"
)

// Exit codes of "distlock run". Otherwise it exits with the command's own
// status, or 128+N if a signal N killed the command, as a shell does.
const (
	exitNotAcquired = 75  // EX_TEMPFAIL, the default of -E: -n found the lock held, or -w ran out
	exitLost        = 76  // the lock was lost before the command finished
	exitWrongKind   = 78  // KEY is used by another kind of lease (EX_CONFIG: fix the command line or the other users)
	exitCannotExec  = 126 // the command was found but cannot be executed
	exitNotFound    = 127 // the command was not found
	exitSignalBase  = 128 // plus N: signal N killed the command, or ended distlock's wait
)

// Defaults of "distlock run".
const (
	defaultGrace = 10 * time.Second
	// releaseSlack is added to the TTL to bound the final release; the
	// guard bounds it itself by the end of the lease, so this is only a
	// backstop.
	releaseSlack = time.Second
)

// shell runs the command line of -c, as "sh -c LINE".
const shell = "/bin/sh"

const runUsage = `Usage: distlock run [flags] KEY [--] COMMAND [ARGS...]
       distlock run [flags] KEY -c 'COMMAND LINE'
       distlock run [flags] -k NAME [-k NAME]... [--] COMMAND [ARGS...]

Runs COMMAND while holding the lock KEY, exclusively (-x, the default) or
shared with the other -s runs of KEY (-s). distlock waits for the lock (as
long as it takes, or up to -w; -n makes a single attempt), starts the
command with these variables added to its environment:

  DISTLOCK_KEY     the lock name, KEY (with several -k, the first NAME)
  DISTLOCK_TOKEN   the fencing token of this acquisition: a number greater
                   than every earlier token of KEY; pass it along with every
                   write the lock protects, and have the storage reject a
                   write with a lower token than it has seen (with several
                   -k, the first NAME's token)
  DISTLOCK_TOKENS  NAME=TOKEN for every name held, one per line, in the
                   order given: "KEY=TOKEN" for one name. A name never
                   holds a newline, and a token never holds "=": split each
                   line at its last "="
  DISTLOCK_OWNER   the owner id written into the lock (--owner)

and keeps the lease renewed (every TTL/3) while the command runs. The
command's standard input, output and error are distlock's own. When the
command exits, distlock releases the lock and exits with the command's status.

Flags go before KEY or between KEY and the command. The command starts at
the first word after KEY that is not a flag, or after "--"; everything from
there on is the command's. With -c, the command is one string that sh -c
runs, so it may use pipes, redirections and $DISTLOCK_TOKEN.

With -k NAME, repeated, the command runs while holding every NAME at once
(in Go: distlock.NewMultiMutex). -k takes the place of KEY: the command
starts at the first word after the flags that is not a flag, or after
"--". One -k NAME is the same run as KEY. Each NAME is the same lock
as "distlock run NAME" and as a Mutex of that name, so runs whose sets of
names overlap exclude each other, and a run of several names waits in
line like any other waiter of each. Every run takes its names in one
order, whatever order they are given in (by Redis Cluster slot, then by
key), holding those it has while it waits in the line of the next; so runs
of overlapping sets never deadlock. While it waits, the names it holds have
a lease of the claim window only (half a second), renewed as it waits, so
a waiter that dies frees them within half a second. -n makes one attempt
at every name and takes none if any is held; -w bounds the whole wait; if
any name is lost while the command runs, the run is lost (status 76).
Several names are held exclusively: -s and --permits take one KEY. At
most 64 names.

KEY is a read-write lock (in Go: distlock.NewRWMutex, whose Lock is -x
and RLock -s): -s runs share it with each other and exclude every -x
run; an -x run excludes everyone. Waiting is in arrival order: an -s run
that comes while an -x run waits queues behind it, and an -x run waits for
the -s runs that came before it, not for those after. A Mutex or an
Election of the Go library (distlock.NewMutex, NewElection) of the same
name and namespace is the same lock, held as -x holds it: a service that
guards KEY with a Mutex and a cron line "distlock run KEY" exclude each
other, and wait for each other in one line.

With --permits N, KEY names a semaphore of N permits instead of a lock,
and the command runs while holding one of them: up to N commands run at
once, and the others wait in line (or, with -n and -w, give up) as they
would for the lock. Each permit has its own lease and fencing token, and
every other flag means what it means for the lock. All the runs of one KEY
should pass the same N: a semaphore and a lock of one name share keys and
refuse each other, and each caller brings its own N (see "distlock help
inspect" for what it shows).

If the lock is lost while the command runs (no renewal could be confirmed
before the lease deadline, or someone deleted or took over the key),
distlock sends the command SIGTERM, then SIGKILL after --grace, and exits
with status 76. A renewal that merely fails (a reset connection, a refused
dial, a timeout) is retried while the lease holds and does not stop the
command; -v says so on stderr.

The command runs in a process group of its own, and signals go to the whole
group, so that a shell script stops together with what it started. SIGINT,
SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to distlock are passed on;
distlock releases the lock once the command has exited. Run from an
interactive shell (on Linux), or with --foreground, the command stays in
distlock's process group instead, so that it can read from the terminal;
signals then go to the command alone, and SIGINT and SIGQUIT are not passed
on, since the terminal sends them to the command directly. A signal that
arrives while distlock is still waiting for the lock ends the wait.

For flock(1) users: -n, -w (also --wait and --timeout), -E, -c and -v
mean what they mean there, but
the default -E is 75, not 1; -c runs sh, not $SHELL; and -w also takes
durations such as 1m30s. -s and -x mean what they mean there (-x is the
default; --permits N lets N commands share a semaphore instead), and the
lock is released when the command exits (no -u, -o or -F).
Unlike flock's lock, which goes with the holder's processes, a lease
outlives a distlock that is killed with SIGKILL (an OOM kill, say): the lock
stays held until its lease ends, at most --ttl (10s by default) after the
last renewal, and a -n run that starts meanwhile skips.

The lease is 10s unless --ttl says otherwise, where the Go library's
default (distlock.DefaultTTL) is 30s: a "distlock run" that is SIGKILLed
keeps the lock for the rest of its lease, which flock(1) users do not
expect, and a service's hold, which renews itself from a long-lived
process, can afford a longer one. The TTL only bounds that wait (and how
long a frozen holder keeps the lock): the command itself may run for hours,
renewed every TTL/3. "distlock break KEY" ends a stuck holder's lease at
once.

With -w, everything before the command counts against the wait: the
connection to Redis, the wait in line, and a call that Redis does not
answer. A Redis that accepts connections but does not answer (stopped,
overloaded) ends the run with status 125 at most a fraction of a second
after -w runs out, and the command does not run. Without -w (and with -n),
a Redis that does not answer makes distlock wait as long as its calls'
own timeouts.

Every time span (--ttl, -w, --grace) is a duration such as 10s, 500ms or
1m30s, or a bare number of seconds: --ttl 10 is ten seconds.

Exit status:
  the command's    the command exited on its own
  128+N            the command was killed by signal N, or distlock got
                   signal N while still waiting for the lock
  64               usage error: bad flags or arguments
  75               not acquired: -n found the lock held (or all the
                   permits of --permits), or -w ran out
                   (set another code with -E)
  76               the lock (or permit) was lost before the command finished (the
                   command's own status is printed on stderr)
  78               KEY is used by another kind: a semaphore's name given
                   without --permits, or a lock's name with it; the
                   message names both kinds and what to change
  125              distlock failed: Redis unreachable or erroring
  126              the command cannot be executed
  127              the command was not found

Examples:
  distlock run --redis redis://10.0.0.5:6379 nightly-report -- ./report.sh --full
  distlock run -n --ttl 10s backup -c 'pg_dump app > "/backup/$DISTLOCK_TOKEN.sql"'
  distlock run -w 5m --grace 30s migrate -- ./migrate up
  distlock run -w 0.5 -E 0 cache-warm ./warm.sh   # held for 0.5s more: exit 0
  distlock run --permits 4 transcode -- ./transcode.sh   # up to 4 at once
  distlock run -s config -- ./read-config.sh     # many at once, none while an -x run holds config
  distlock run config -- ./rewrite-config.sh     # alone
  distlock run -k accounts -k ledger -- ./transfer.sh   # both, or wait for both
  distlock run -k a -k b -c 'printf "%s\n" "$DISTLOCK_TOKENS"'   # a=17 and b=42, one per line

Flags:
`

// runConfig is the command line of "distlock run".
type runConfig struct {
	common
	// names are the locks to hold: KEY, or every -k NAME in the order
	// given; key is the first of them.
	names        namesValue
	key          string
	argv         []string
	wait         time.Duration // -w: how long to wait for the lock
	waitSet      bool          // whether -w was given: without it, wait as long as it takes
	try          bool
	conflictCode int
	command      string
	grace        time.Duration
	owner        string
	permits      int  // with --permits: a semaphore of that many permits; 0 without
	shared       bool // -s: a read hold of the read-write lock KEY; without, a write hold
	exclusive    bool // -x: a write hold, the default
	foreground   bool
	verbose      bool
}

// runTTL is the default lease of "distlock run": shorter than the library's
// DefaultTTL (30 s), on purpose, and said so in runUsage and the README. A
// holder that is SIGKILLed (an OOM kill) cannot release, so its lock stays
// held for the rest of its lease and a -n cron job that starts meanwhile
// skips its run; flock(1) frees the lock as soon as the holder's processes
// are gone. Ten seconds bounds that; renewals, every TTL/3, are one round
// trip each and cost little. A library user's hold lives in a long-running
// service, whose restarts are rarer than a cron job's kills, and whose
// renewals compete with its own work: there 30 s leaves more room.
const runTTL = 10 * time.Second

// singleAttempt reports whether the command line asks for one attempt at
// the lock: -n, or -w 0.
func (c *runConfig) singleAttempt() bool { return c.try || (c.waitSet && c.wait == 0) }

// runFlags returns the flag set of "distlock run", bound to c.
func runFlags(c *runConfig) *flag.FlagSet {
	fs := newFlagSet("run")
	c.register(fs, "; run needs a real Redis", runTTL)
	fs.BoolVar(&c.try, "n", false, "make a single attempt: if the lock is held, exit at once with the status of -E")
	alias(fs, "n", "nonblock", "try")
	fs.Var(&durationValue{d: &c.wait, set: &c.waitSet}, "w", "wait at most `SECONDS` for the lock, then exit with the status of -E: seconds (5, 0.5) or a duration (1m30s); 0 makes a single attempt, like -n (default: wait as long as it takes)")
	alias(fs, "w", "wait", "timeout") // flock(1) takes all three
	fs.IntVar(&c.conflictCode, "E", exitNotAcquired, "the exit status (`CODE`, 0 to 255) when the lock is not acquired (-n found it held, or -w ran out)")
	alias(fs, "E", "conflict-exit-code")
	fs.StringVar(&c.command, "c", "", "run `LINE` with sh -c, instead of COMMAND [ARGS...]")
	alias(fs, "c", "command")
	durationVar(fs, &c.grace, "grace", defaultGrace, "after the lock is lost, how long (`DURATION`) the command gets between SIGTERM and SIGKILL (0: SIGKILL at once)")
	fs.StringVar(&c.owner, "owner", "", "owner `ID` written into the lock, shown by \"distlock inspect\" (default HOST:PID, of distlock)")
	fs.BoolVar(&c.shared, "s", false, "hold KEY shared, with every other -s run (a read hold of the read-write lock KEY), instead of exclusively")
	alias(fs, "s", "shared")
	fs.BoolVar(&c.exclusive, "x", false, "hold KEY exclusively (a write hold of the read-write lock KEY): the default")
	alias(fs, "x", "exclusive")
	fs.Var(&c.names, "k", "hold the lock `NAME`, in place of KEY; repeat -k to hold several names at once, exclusively (not with -s or --permits); at most 64")
	alias(fs, "k", "key")
	fs.IntVar(&c.permits, "permits", 0, "run under one of `N` permits of a semaphore named KEY (N >= 1), so that up to N commands run at once, instead of under the lock KEY")
	fs.BoolVar(&c.foreground, "foreground", false, "keep the command in distlock's process group, so that it can use the terminal (default: true when run from an interactive shell)")
	fs.BoolVar(&c.verbose, "v", false, "say on stderr what distlock does: the wait, the acquisition, the command's start and end, failed renewals, the release")
	alias(fs, "v", "verbose")
	return fs
}

// namesValue is the value of -k: every NAME given, in order, one per -k.
type namesValue []string

func (v *namesValue) String() string {
	if v == nil {
		return ""
	}
	return strings.Join(*v, ", ")
}

func (v *namesValue) Set(name string) error {
	if name == "" {
		return errors.New("the name is empty")
	}
	*v = append(*v, name)
	return nil
}

// parseRun parses the command line of "distlock run": flags, KEY, more
// flags, then the command, which starts after "--" or at the first word
// that is not a flag. With -k there is no KEY: the command starts after
// the first flags.
func parseRun(args []string) (runConfig, error) {
	var c runConfig
	fs := runFlags(&c)
	if err := parseFlags(fs, args); err != nil {
		return c, err
	}
	rest := fs.Args()
	var dashDash bool
	byFlag := len(c.names) > 0 // the names came with -k
	if byFlag {
		c.argv = rest
		dashDash = endedByDashDash(fs, args, rest)
	} else {
		if len(rest) == 0 || endedByDashDash(fs, args, rest) {
			return c, usagef("missing KEY: distlock run [flags] KEY [--] COMMAND [ARGS...], or -k NAME [-k NAME]... [--] COMMAND [ARGS...]")
		}
		key := rest[0]
		afterKey := rest[1:]
		if err := parseFlags(fs, afterKey); err != nil {
			return c, err
		}
		if len(c.names) > 0 {
			return c, usagef("KEY %q and -k %q exclude each other: give every name with -k, or one KEY", key, c.names[0])
		}
		c.names = namesValue{key}
		c.argv = fs.Args()
		dashDash = endedByDashDash(fs, afterKey, c.argv)
	}
	c.key = c.names[0]

	set := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	commandSet := set["c"] || set["command"]
	switch {
	case commandSet && c.command == "":
		return c, usagef("-c needs a command line")
	case commandSet && (len(c.argv) > 0 || dashDash):
		return c, usagef("-c and a COMMAND after KEY exclude each other: -c takes the whole command line as one string")
	case !commandSet && len(c.argv) == 0 && dashDash:
		return c, usagef("missing the command after \"--\"")
	case !commandSet && len(c.argv) == 0 && byFlag:
		return c, usagef("missing the command: distlock run [flags] -k NAME [-k NAME]... [--] COMMAND [ARGS...], or -c 'COMMAND LINE'")
	case !commandSet && len(c.argv) == 0:
		return c, usagef("missing the command after KEY %q: distlock run [flags] KEY [--] COMMAND [ARGS...], or -c 'COMMAND LINE'", c.key)
	case c.try && c.waitSet && c.wait > 0:
		return c, usagef("-n and -w %v exclude each other (-w 0 is the same as -n)", c.wait)
	case c.conflictCode < 0 || c.conflictCode > 255:
		return c, usagef("-E %d: the exit status must be 0 to 255", c.conflictCode)
	case set["permits"] && c.permits < 1:
		return c, usagef("--permits %d: a semaphore needs at least 1 permit", c.permits)
	case c.shared && c.exclusive:
		return c, usagef("-s and -x exclude each other: a hold is shared or exclusive")
	case set["permits"] && (c.shared || c.exclusive):
		return c, usagef("--permits and -%s exclude each other: a semaphore's permits are neither shared nor exclusive", map[bool]string{true: "s", false: "x"}[c.shared])
	case len(c.names) > 1 && c.shared:
		return c, usagef("-s takes one name: several -k names (%s) are held exclusively, all at once", c.names.String())
	case len(c.names) > 1 && set["permits"]:
		return c, usagef("--permits takes one name: a semaphore of several -k names (%s) is not possible", c.names.String())
	case len(c.names) > lease.MaxSet:
		return c, usagef("%d names given with -k: at most %d at once", len(c.names), lease.MaxSet)
	}
	for i, name := range c.names {
		if slices.Contains(c.names[:i], name) {
			return c, usagef("-k %q is given twice: name each lock once", name)
		}
	}
	if commandSet {
		c.argv = []string{shell, "-c", c.command}
	}
	if c.owner == "" {
		c.owner = defaultOwner()
	}
	if !set["foreground"] {
		c.foreground = inForeground()
	}
	return c, nil
}

// defaultOwner is "host:pid", which tells an operator where to look.
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

// runner is one "distlock run".
type runner struct {
	cfg   runConfig
	start time.Time
	// deadline is, with -w N (N > 0), start plus N: the command starts by
	// then or not at all. Zero without a bound.
	deadline time.Time
	lk       *locker // what the command runs under, once run has made it

	// mu serialises the lines written to stderr, which come from the
	// runner and, with -v, from the guard's goroutine (runObserver).
	mu     sync.Mutex
	stderr io.Writer
}

// logf writes one line to stderr. Every message of "distlock run" goes
// through it, so all have one format; the library's own log is not used
// (it would report the same events a second time, in another format).
func (r *runner) logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.stderr, "distlock run: "+format+"\n", args...)
}

// held names what the command runs under, with its verb, for messages:
// "lock was", "locks were" or "permit was".
func (r *runner) held() string {
	switch {
	case r.cfg.permits > 0:
		return "permit was"
	case len(r.cfg.names) > 1:
		return "locks were"
	}
	return "lock was"
}

func (r *runner) verbosef(format string, args ...any) {
	if r.cfg.verbose {
		r.logf(format, args...)
	}
}

// runCommand implements "distlock run". It returns an *exitStatus carrying
// the command's status, or an error that says why the command did not run
// or why its run cannot be trusted.
func runCommand(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := parseRun(args)
	if err != nil {
		return err
	}
	r := &runner{cfg: cfg, stderr: stderr, start: time.Now()}
	return r.run(ctx)
}

func (r *runner) run(ctx context.Context) error {
	cfg := r.cfg
	if !processControl {
		return usagef("this command needs a Unix system")
	}
	// Find the command before waiting for the lock, so that a typo fails
	// at once rather than after the wait.
	if _, err := exec.LookPath(cfg.argv[0]); err != nil {
		return execError(err)
	}
	if cfg.waitSet && cfg.wait > 0 {
		// -w bounds all that comes before the command: the connect as
		// well as the wait (see acquire).
		r.deadline = r.start.Add(cfg.wait)
	}
	client, where, closeClient, err := connectReal(cfg.redis, r.deadline)
	if errors.Is(err, errConnectTime) {
		return &exitStatus{code: exitFailed, err: fmt.Errorf("%w; -w %v ran out, and the command did not run", errors.Unwrap(err), cfg.wait)}
	}
	if err != nil {
		return err
	}
	defer closeSoon(closeClient)

	opts := []distlock.Option{
		distlock.WithNamespace(cfg.namespace),
		distlock.WithTTL(cfg.ttl),
		distlock.WithOwner(cfg.owner),
		distlock.WithMaxWait(cfg.wait),
	}
	if cfg.verbose {
		opts = append(opts, distlock.WithObserver(&runObserver{r: r}))
	}
	m, err := newLocker(client, cfg, opts)
	if err != nil {
		return usageError{err}
	}
	r.lk = m

	// From here on, distlock catches the signals it passes on. signal.Notify
	// never blocks: a burst larger than the buffer loses signals, which is
	// as much as a process can expect of signals anyway.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwardedSignals...)
	defer signal.Stop(sigs)

	// lockCtx bounds the wait and the hold. It is cancelled only by a signal
	// during the wait (and at the very end, after the release).
	lockCtx, cancelLock := context.WithCancelCause(ctx)
	defer cancelLock(nil)
	r.verbosef("waiting for %s on %s as %q", m.what, where, cfg.owner)
	g, err := r.acquire(lockCtx, cancelLock, m, sigs)
	if err != nil {
		return err
	}
	r.verbosef("acquired %s, after %v", m.tokens(g), time.Since(r.start).Round(time.Millisecond))

	child, err := r.startCommand(g)
	if err != nil {
		r.release(g)
		return err
	}
	lost := r.supervise(child, g, sigs)
	ps := child.cmd.ProcessState
	if lost != nil {
		// supervise has said why; this says what became of the command.
		r.release(g)
		return &exitStatus{code: exitLost, err: fmt.Errorf("the %s lost while the command ran; the command %s", r.held(), describe(ps))}
	}
	// The lease may also have slipped unnoticed just before the command
	// exited: a release that finds the key gone or taken says so.
	if slipped := r.release(g); slipped != nil {
		return &exitStatus{code: exitLost, err: fmt.Errorf("%s; the command %s", message(slipped), describe(ps))}
	}
	return &exitStatus{code: exitCode(ps)}
}

// closeTimeout bounds how long "distlock run" waits for its Redis client to
// close before it exits. The lock is released (or its release given up on)
// by then, so the close only frees sockets; but rueidis gives a server that
// does not answer a second per connection before it drops it.
const closeTimeout = 250 * time.Millisecond

// closeSoon calls closeClient and returns when it has returned or after
// closeTimeout, whichever comes first. In the latter case the close goes on
// in a goroutine that the process's exit, which comes next, ends.
func closeSoon(closeClient func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		closeClient()
	}()
	t := time.NewTimer(closeTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// locker is what "distlock run" holds while the command runs: the
// read-write lock KEY, for writing or with -s for reading, with --permits
// a permit of the semaphore KEY, or with several -k every NAME at once.
type locker struct {
	what  string   // for messages: the lease key, and the permits
	names []string // the names held, in the order given
	keys  []string // their lease keys, likewise
	wait  func(context.Context) (*distlock.Guard, error)
	try   func(context.Context) (*distlock.Guard, error)
}

// held says what a guard of l holds, for messages: its lease key, or its
// lease keys joined.
func (l *locker) held() string { return strings.Join(l.keys, ", ") }

// tokens says what g holds with its fencing tokens, for messages:
// "distlock:{a}: token 7", or for several names
// "distlock:{a}: token 7, distlock:{b}: token 9".
func (l *locker) tokens(g *distlock.Guard) string {
	if len(l.names) == 1 {
		return fmt.Sprintf("%s: token %d", l.keys[0], g.Token())
	}
	parts := make([]string, len(l.names))
	for i, name := range l.names {
		parts[i] = fmt.Sprintf("%s: token %d", l.keys[i], g.TokenOf(name))
	}
	return strings.Join(parts, ", ")
}

// environ returns the variables that tell the command what it runs under
// (see runUsage): DISTLOCK_KEY and DISTLOCK_TOKEN of the first name,
// DISTLOCK_TOKENS of every one, and DISTLOCK_OWNER.
func (l *locker) environ(g *distlock.Guard, owner string) []string {
	tokens := []string{l.names[0] + "=" + strconv.FormatInt(g.Token(), 10)}
	if len(l.names) > 1 {
		tokens = tokens[:0]
		for _, name := range l.names {
			tokens = append(tokens, name+"="+strconv.FormatInt(g.TokenOf(name), 10))
		}
	}
	return []string{
		"DISTLOCK_KEY=" + l.names[0],
		"DISTLOCK_TOKEN=" + strconv.FormatInt(g.Token(), 10),
		"DISTLOCK_TOKENS=" + strings.Join(tokens, "\n"),
		"DISTLOCK_OWNER=" + owner,
	}
}

// newLocker returns the lock, semaphore or set of locks that cfg asks for.
func newLocker(client rueidis.Client, cfg runConfig, opts []distlock.Option) (*locker, error) {
	if len(cfg.names) > 1 {
		mm, err := distlock.NewMultiMutex(client, cfg.names, opts...)
		if err != nil {
			return nil, err
		}
		keys := make([]string, len(cfg.names))
		for i, name := range cfg.names {
			k, err := lease.NewKeys(cfg.namespace, name)
			if err != nil {
				return nil, err
			}
			keys[i] = k.Lease
		}
		return &locker{what: strings.Join(keys, ", ") + " (all at once)", names: cfg.names, keys: keys,
			wait: mm.Lock, try: mm.TryLock}, nil
	}
	l, err := newSingleLocker(client, cfg, opts)
	if err != nil {
		return nil, err
	}
	l.names = cfg.names
	return l, nil
}

// newSingleLocker returns the lock or semaphore KEY.
func newSingleLocker(client rueidis.Client, cfg runConfig, opts []distlock.Option) (*locker, error) {
	if cfg.permits == 0 {
		rw, err := distlock.NewRWMutex(client, cfg.key, opts...)
		if err != nil {
			return nil, err
		}
		keys := []string{rw.Key()}
		if cfg.shared {
			return &locker{what: "a shared hold of " + rw.Key(), keys: keys, wait: rw.RLock, try: rw.TryRLock}, nil
		}
		return &locker{what: rw.Key(), keys: keys, wait: rw.Lock, try: rw.TryLock}, nil
	}
	s, err := distlock.NewSemaphore(client, cfg.key, cfg.permits, opts...)
	if err != nil {
		return nil, err
	}
	return &locker{
		what: fmt.Sprintf("a permit of %s (%d permits)", s.Key(), s.Permits()),
		keys: []string{s.Key()},
		wait: s.Acquire, try: s.TryAcquire,
	}, nil
}

// signalCause is the cause of lockCtx when a signal ended the wait.
type signalCause struct{ sig os.Signal }

// settleTimeout bounds how long distlock waits, before it exits, for the
// clean-up of a wait that ended without the lock.
const settleTimeout = time.Second

func (s *signalCause) Error() string { return "received " + s.sig.String() }

// noReplyCause is the cause of lockCtx when -w ran out with a call to Redis
// still unanswered (see acquire).
type noReplyCause struct{ wait time.Duration }

func (c *noReplyCause) Error() string {
	return fmt.Sprintf("Redis did not answer within -w %v", c.wait)
}

// waitSlack is how long past the deadline of -w acquire waits for the
// wait's own end (ErrTimeout, exit status 75) before it gives up on Redis
// (exit status 125).
const waitSlack = 300 * time.Millisecond

// acquire waits for the lock, or makes a single attempt with -n or -w 0. A
// signal ends the wait with status 128+N. Other failures are an
// *exitStatus with the documented code.
func (r *runner) acquire(lockCtx context.Context, cancelLock context.CancelCauseFunc, m *locker, sigs <-chan os.Signal) (*distlock.Guard, error) {
	waiting := make(chan struct{})
	watched := make(chan struct{})
	var expired <-chan time.Time
	if !r.deadline.IsZero() {
		// A backstop: the wait bounds itself (WithMaxWait) and ends with
		// ErrTimeout at the deadline, but a call to Redis that is in
		// flight then, to a server that does not answer, may not end
		// until its own timeout.
		t := time.NewTimer(time.Until(r.deadline) + waitSlack)
		defer t.Stop()
		expired = t.C
	}
	go func() {
		defer close(watched)
		select {
		case sig := <-sigs:
			cancelLock(&signalCause{sig: sig})
		case <-expired:
			cancelLock(&noReplyCause{wait: r.cfg.wait})
		case <-waiting:
		}
	}()
	var g *distlock.Guard
	var err error
	if r.cfg.singleAttempt() {
		g, err = m.try(lockCtx)
	} else {
		g, err = m.wait(lockCtx)
	}
	close(waiting)
	<-watched
	if err != nil {
		// distlock exits next: let the clean-up of the wait it gave up
		// reach Redis, so that the next waiter gets the lock now rather
		// than a claim window later. With -w, not past the backstop: a
		// server that did not answer the wait will not answer the
		// clean-up either (the waiter's place lapses on its own).
		settle := settleTimeout
		if !r.deadline.IsZero() {
			settle = min(settle, time.Until(r.deadline.Add(waitSlack)))
		}
		if settle > 0 {
			sctx, cancel := context.WithTimeout(context.Background(), settle)
			_ = distlock.Settle(sctx)
			cancel()
		}
	}

	var sc *signalCause
	var nr *noReplyCause
	switch {
	case errors.As(context.Cause(lockCtx), &sc):
		// The signal may have come just as the lock was granted; then the
		// guard is already releasing itself (its Lock context ended).
		if g != nil {
			r.release(g)
		}
		return nil, &exitStatus{code: exitSignalBase + signalNumber(sc.sig),
			err: fmt.Errorf("%v while waiting for %s", sc, m.what)}
	case errors.As(context.Cause(lockCtx), &nr):
		if g != nil { // granted just as the backstop fired: too late
			r.release(g)
		}
		return nil, &exitStatus{code: exitFailed, err: fmt.Errorf("waiting for %s: %v; the command did not run", m.what, nr)}
	}
	switch {
	case err == nil:
		return g, nil
	case errors.Is(err, distlock.ErrTimeout):
		return nil, &exitStatus{code: r.cfg.conflictCode, err: timedOut(r.cfg.wait, err)}
	case errors.Is(err, distlock.ErrNotAcquired):
		return nil, &exitStatus{code: r.cfg.conflictCode, err: err}
	case errors.Is(err, distlock.ErrWrongKind):
		// Neither a Redis failure nor a bad command line as such: KEY is
		// used by another kind (a semaphore's name without --permits, or a
		// lock's with it), and only the user knows which one is wrong.
		return nil, &exitStatus{code: exitWrongKind, err: wrongKind(r.cfg, err)}
	default:
		return nil, &exitStatus{code: exitFailed, err: err}
	}
}

// timedOut says how a wait bounded by -w ended without the lock. The
// library counts every call to Redis as an attempt; those of a waiter are
// the one that put it in line and the refreshes of its place (every half
// claim window), not polls: a grant reaches it by pub/sub.
func timedOut(wait time.Duration, err error) error {
	var te *distlock.TimeoutError
	if !errors.As(err, &te) {
		return err
	}
	calls := "1 call to Redis, which put it in line"
	if te.Attempts > 1 {
		refreshes := "refreshes"
		if te.Attempts == 2 {
			refreshes = "refresh"
		}
		calls = fmt.Sprintf("%d calls to Redis: one to stand in line, %d %s of its place", te.Attempts, te.Attempts-1, refreshes)
	}
	return fmt.Errorf("not acquired within -w %v: waited %v for %s (%s)", wait, te.Waited.Round(time.Millisecond), te.Key, calls)
}

// kindNames says in words what each kind of lease that a WrongKindError
// names is, and who uses it.
var kindNames = map[string]string{
	"semaphore": "a semaphore (distlock run --permits N, or a distlock.Semaphore)",
	"rwmutex":   "a lock (distlock run without --permits, or a distlock.RWMutex)",
	"lock":      "a lock of the Go library (a distlock.Mutex or Election)",
}

// wrongKind explains err, which matches distlock.ErrWrongKind: which kind
// this run asked for, which kind holds KEY, and what to change.
func wrongKind(cfg runConfig, err error) error {
	var wk *distlock.WrongKindError
	if !errors.As(err, &wk) {
		return fmt.Errorf("%w; pick another KEY, or run as the other users of %q do", err, cfg.key)
	}
	want, ok := kindNames[wk.Want]
	if !ok {
		want = "a " + wk.Want
	}
	key := cfg.key
	if len(cfg.names) > 1 {
		// The name whose lease key the error names.
		for _, name := range cfg.names {
			if k, err := lease.NewKeys(cfg.namespace, name); err == nil && k.Lease == wk.Key {
				key = name
			}
		}
	}
	found, ok := kindNames[wk.Found]
	if !ok {
		return fmt.Errorf("KEY %q is used by something else: %s holds a Redis %s that distlock did not write, and this run asks for %s; pick another KEY or --namespace", key, wk.Key, wk.Found, want)
	}
	var fix string
	switch {
	case len(cfg.names) > 1:
		fix = "leave it out of the -k names, or pick another name"
	case wk.Found == "semaphore":
		inspect := "distlock inspect " + cfg.key
		if cfg.namespace != distlock.DefaultNamespace {
			inspect = "distlock inspect --namespace " + cfg.namespace + " " + cfg.key
		}
		fix = fmt.Sprintf("run it with --permits N as the semaphore's users do (%q shows its permits), or pick another KEY", inspect)
	case cfg.permits > 0:
		fix = "run it without --permits to take the lock, or pick another KEY for the semaphore"
	default:
		fix = "pick another KEY"
	}
	return fmt.Errorf("KEY %q is %s, and this run asks for %s: the two kinds refuse each other on one name (%s); %s", key, found, want, wk.Key, fix)
}

// startCommand starts the command with the lock's variables in its environment.
func (r *runner) startCommand(g *distlock.Guard) (*child, error) {
	cmd := exec.Command(r.cfg.argv[0], r.cfg.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), r.lk.environ(g, r.cfg.owner)...)
	c := newChild(cmd, !r.cfg.foreground)
	if err := cmd.Start(); err != nil {
		return nil, execError(err)
	}
	r.verbosef("started %s (pid %d)", r.cfg.argv[0], cmd.Process.Pid)
	return c, nil
}

// supervise waits for the command to exit. Meanwhile it passes signals on,
// and when the lock is lost it sends SIGTERM, then SIGKILL after the grace
// period. It returns why the lock was lost, or nil if it was held throughout.
func (r *runner) supervise(c *child, g *distlock.Guard, sigs <-chan os.Signal) error {
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = c.cmd.Wait() // the status is read from cmd.ProcessState
	}()

	lostC := g.Context().Done()
	var lost error
	var killTimer *time.Timer
	var killC <-chan time.Time
	defer func() {
		if killTimer != nil {
			killTimer.Stop()
		}
	}()
	for {
		select {
		case sig := <-sigs:
			if !c.forwards(sig) {
				r.verbosef("%v: left to the terminal, which sends it to the command itself", sig)
				continue
			}
			r.verbosef("passing %v on to the command", sig)
			if err := c.signal(sig); err != nil {
				r.logf("cannot pass %v on to the command: %v", sig, err)
			}

		case <-lostC:
			lostC = nil
			lost = context.Cause(g.Context())
			if r.cfg.grace == 0 {
				r.logf("%s; killing the command", message(lost))
				r.kill(c)
				continue
			}
			r.logf("%s; sending SIGTERM to the command, SIGKILL in %v", message(lost), r.cfg.grace)
			if err := c.signal(sigTerm); err != nil {
				r.logf("cannot send SIGTERM: %v", err)
			}
			killTimer = time.NewTimer(r.cfg.grace)
			killC = killTimer.C

		case <-killC:
			killC = nil
			r.logf("the command is still running %v after SIGTERM; sending SIGKILL", r.cfg.grace)
			r.kill(c)

		case <-exited:
			if lost == nil { // otherwise the final message says it
				r.verbosef("the command %s", describe(c.cmd.ProcessState))
			}
			return lost
		}
	}
}

func (r *runner) kill(c *child) {
	if err := c.signal(sigKill); err != nil {
		r.logf("cannot send SIGKILL: %v", err)
	}
}

// release releases the lock and returns an error if the lease turned out to
// have slipped before the release. A Redis error is only reported: the lease
// then expires on its own within the TTL.
func (r *runner) release(g *distlock.Guard) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ttl+releaseSlack)
	defer cancel()
	st, err := g.Release(ctx)
	if err != nil {
		r.logf("%s; the lease expires on its own within %v", message(err), r.cfg.ttl)
	}
	if st == distlock.Lost {
		if err := context.Cause(g.Context()); errors.Is(err, distlock.ErrLost) {
			return err
		}
		noun, verb, _ := strings.Cut(r.held(), " ")
		return fmt.Errorf("the %s %s %s lost before the command finished (found at release)", noun, r.lk.held(), verb)
	}
	r.verbosef("released %s", r.lk.held())
	return nil
}

// execError maps a failure to find or start the command to its exit status.
func execError(err error) error {
	code := exitNotFound
	if errors.Is(err, fs.ErrPermission) || (!errors.Is(err, fs.ErrNotExist) && !errors.Is(err, exec.ErrNotFound)) {
		code = exitCannotExec
	}
	return &exitStatus{code: code, err: err}
}

// exitCode is the status distlock passes on for a command that ended as ps
// says: its exit status, or 128+N when signal N killed it.
func exitCode(ps *os.ProcessState) int {
	if n := killedBy(ps); n > 0 {
		return exitSignalBase + n
	}
	return ps.ExitCode()
}

// describe says how a command ended, for messages.
func describe(ps *os.ProcessState) string {
	if n := killedBy(ps); n > 0 {
		return fmt.Sprintf("was killed by signal %d (%s), status %d", n, strings.TrimPrefix(ps.String(), "signal: "), exitSignalBase+n)
	}
	return fmt.Sprintf("exited with status %d", ps.ExitCode())
}

// runObserver tells, with -v, what the runner cannot see by itself: a
// renewal that failed before the lock was lost (the loss itself the runner
// reports), and a lease renewed again after a loss. The guard's goroutine
// calls it; it only writes a line.
type runObserver struct {
	r    *runner
	lost atomic.Bool // the guard has been Lost at least once
}

func (o *runObserver) ObserveAcquire(distlock.AcquireInfo) {}

func (o *runObserver) ObserveRenew(i distlock.RenewInfo) {
	// A refused renewal is a loss, which the runner reports; after a loss
	// the command is being stopped, and retries are no news.
	if i.Err == nil || errors.Is(i.Err, distlock.ErrLost) || o.lost.Load() {
		return
	}
	o.r.logf("renewing %s failed after %v: %s", i.Key, i.Latency.Round(time.Millisecond), message(i.Err))
}

func (o *runObserver) ObserveTransition(i distlock.TransitionInfo) {
	switch {
	case i.To == distlock.Lost:
		o.lost.Store(true)
	case i.From == distlock.Lost && i.To == distlock.Acquired:
		o.r.logf("%s is held again (a renewal found it unchanged), but the command is stopped all the same", i.Key)
	}
}
