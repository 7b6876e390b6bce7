// Command distlock works with distlock locks from the shell.
//
//	distlock run [flags] KEY [--] COMMAND [ARGS...]   run a command while holding a lock
//	distlock run [flags] KEY -c 'COMMAND LINE'        the same, through sh -c
//	distlock run --permits N [flags] KEY ...          the same, under one of N permits of a semaphore
//	distlock run [flags] -k NAME -k NAME ... [--] ... the same, holding several locks at once (all or none)
//	distlock inspect [flags] KEY [KEY...]             show who holds a lock, semaphore or election; --watch follows it
//	distlock break [flags] KEY                        end the lease of a stuck holder; the first in line gets the lock
//	distlock demo [flags]                             a few workers contend for one lock
//
// Run "distlock help" for an overview and "distlock help COMMAND" for the
// flags and exit codes of each subcommand.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Exit codes shared by the subcommands. "distlock run" adds its own (see
// run.go), and otherwise exits with the status of the command it ran;
// "distlock inspect" adds exitFree.
const (
	exitOK     = 0
	exitError  = 1   // the demo found the lock misbehaving, or failed
	exitUsage  = 64  // bad flags or arguments (EX_USAGE in sysexits.h, as flock(1) uses it)
	exitFailed = 125 // distlock failed: Redis unreachable or erroring (as env(1) and timeout(1) use it)
)

const usage = `distlock works with distributed locks kept in Redis.

Usage:
  distlock run [flags] KEY [--] COMMAND [ARGS...]
  distlock run [flags] KEY -c 'COMMAND LINE'
        run COMMAND while holding the lock KEY: wait for it, keep it renewed,
        stop the command if it is lost, release it when the command exits;
        -n, -w, -E and -c work as they do for flock(1); --permits N runs it
        under one of N permits of a semaphore instead, so N run at once
  distlock run [flags] -k NAME [-k NAME]... [--] COMMAND [ARGS...]
        the same, holding every NAME at once: the command starts once all
        are held; runs of overlapping names never deadlock
  distlock inspect [flags] KEY [KEY...]
        show who holds the lock KEY, for how long, and its last fencing
        token (or a semaphore's holders and permits, or an election's
        leader); exit status 0 if it is held, 1 if it is free; with several
        KEYs, also who holds some and waits for others at once
  distlock break [flags] KEY
        end the lease of whoever holds KEY (a holder that is frozen or
        dead), as its expiry would: the first in line gets the lock at
        once with a larger token, and the holder's next renewal is
        refused; exit status 0 if it broke a lease, 1 if there was none
  distlock demo [flags]
        a few workers contend for one lock and print their transitions
  distlock help [COMMAND]
        this overview, or a command's flags and exit codes
  distlock --version
        print distlock's version

Examples:
  # only one machine runs the nightly report at a time; the others wait
  distlock run --redis redis://redis.internal:6379 nightly-report -- ./report.sh

  # skip this run if another machine has the lock (exit status 75)
  distlock run -n --ttl 10s backup -- pg_dump -f /backup/db.sql app

  # wait at most 30 seconds; a shell command line, with the fencing token
  distlock run -w 30 backup -c 'pg_dump app > "/backup/$DISTLOCK_TOKEN.sql"'

  # at most 4 transcodes at once across all machines; the others wait
  distlock run --permits 4 transcode -- ./transcode.sh

  # hold two locks at once; DISTLOCK_TOKENS has a NAME=TOKEN line for each
  distlock run -k accounts -k ledger -- ./transfer.sh

  # is it held? who holds it now? follow every change until Ctrl-C
  if distlock inspect backup >/dev/null; then echo busy; fi
  distlock inspect backup
  distlock inspect --watch --json backup

  # its holder is frozen and its lease has an hour left: end it now
  distlock break backup

  # see the lock at work, on an embedded Redis
  distlock demo --workers 5 --duration 10s

Redis comes from --redis, else $REDIS_URL, as a URL: redis://[user:pass@]host:port/db,
rediss:// for TLS, unix:///path/to/redis.sock, and several ?addr=host:port
parameters for a cluster. Only the demo falls back to an embedded Redis.

Every flag that takes a time span (--ttl, -w, --grace, --interval, the
demo's) takes a duration such as 10s, 500ms or 1m30s, or a bare number of
seconds: --ttl 10 is ten seconds, -w 0.5 half a second.

Exit status:
  0      success; for inspect, the lock is held
  64     usage error: bad flags or arguments
  run exits with its command's status, or 75 (not acquired), 76 (lost),
  78 (KEY is used by another kind: a semaphore's name without --permits,
  or a lock's with it), 125 (Redis failed), 126 or 127 (the command
  cannot run); inspect exits 1
  when the lock is free and 125 when Redis cannot be read; break exits 1
  when it broke nothing. "distlock help COMMAND" tells each command's
  codes in full.
`

// subcommand is one of distlock's commands.
type subcommand struct {
	// usage is the help text, up to the list of flags.
	usage string
	// flags returns a fresh flag set with the command's flags, for its help.
	flags func() *flag.FlagSet
	// run runs the command with the arguments after its name.
	run func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var subcommands = map[string]subcommand{
	"run": {
		usage: runUsage,
		flags: func() *flag.FlagSet { return runFlags(new(runConfig)) },
		// run passes signals on to its command; it catches them itself.
		run: func(ctx context.Context, args []string, _, stderr io.Writer) error {
			return runCommand(ctx, args, stderr)
		},
	},
	"inspect": {
		usage: inspectUsage,
		flags: func() *flag.FlagSet { return inspectFlags(new(inspectConfig)) },
		run:   stopOnSignal(runInspect),
	},
	"break": {
		usage: breakUsage,
		flags: func() *flag.FlagSet { return breakFlags(new(breakConfig)) },
		run:   stopOnSignal(runBreak),
	},
	"demo": {
		usage: demoUsage,
		flags: func() *flag.FlagSet { return demoFlags(new(demoConfig)) },
		run:   stopOnSignal(runDemo),
	},
}

// stopOnSignal returns f with a context that SIGINT and SIGTERM cancel.
func stopOnSignal(f func(context.Context, []string, io.Writer, io.Writer) error) func(context.Context, []string, io.Writer, io.Writer) error {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		return f(ctx, args, stdout, stderr)
	}
}

func main() {
	// Each subcommand handles signals itself: demo and inspect stop on
	// SIGINT or SIGTERM, while run passes signals on to its command.
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches to a subcommand and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return usageFailed(stderr, "", errors.New("missing command"))
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		return help(args[1:], stdout, stderr)
	case "version", "-version", "--version", "-V":
		fmt.Fprintf(stdout, "distlock %s\n", version())
		return exitOK
	}
	sub, ok := subcommands[name]
	if !ok {
		return usageFailed(stderr, "", fmt.Errorf("unknown command %q", name))
	}
	err := sub.run(ctx, args[1:], stdout, stderr)
	var ue usageError
	var es *exitStatus
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		printHelp(stdout, sub)
		return exitOK
	case errors.As(err, &es):
		if es.err != nil {
			fmt.Fprintf(stderr, "distlock %s: %s\n", name, message(es.err))
		}
		return es.code
	case errors.As(err, &ue):
		return usageFailed(stderr, name, err)
	default:
		fmt.Fprintf(stderr, "distlock %s: %s\n", name, message(err))
		return exitError
	}
}

// help prints the overview, or the help of the command named in args.
func help(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0:
		fmt.Fprint(stdout, usage)
		return exitOK
	case len(args) > 1:
		return usageFailed(stderr, "help", fmt.Errorf("one COMMAND at most (got %q)", args))
	}
	sub, ok := subcommands[args[0]]
	if !ok {
		return usageFailed(stderr, "", fmt.Errorf("unknown command %q", args[0]))
	}
	printHelp(stdout, sub)
	return exitOK
}

// usageFailed prints a usage error, and where to read the usage, in two
// lines, and returns exitUsage. command is the subcommand's name, or empty.
func usageFailed(stderr io.Writer, command string, err error) int {
	who, helpCmd := "distlock", "distlock help"
	if _, ok := subcommands[command]; ok {
		who, helpCmd = who+" "+command, helpCmd+" "+command
	}
	fmt.Fprintf(stderr, "%s: %s\nRun '%s' for usage.\n", who, message(err), helpCmd)
	return exitUsage
}

// version is the module version distlock was built from, as the go command
// recorded it, or "(devel)" when it recorded none.
func version() string {
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(devel)"
}

// message is err's text without the library's "distlock: " prefix, which
// would only repeat the command's own.
func message(err error) string {
	return strings.TrimPrefix(err.Error(), "distlock: ")
}

// usageError marks an error in the command line.
type usageError struct{ error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// newFlagSet returns an empty flag set for a subcommand. It prints nothing
// itself: parseFlags turns its errors into usage errors, and run prints
// the help for -h.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseFlags parses args with fs. It returns flag.ErrHelp for -h, a
// usageError for a bad flag, and nil otherwise.
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return usageError{err}
}

// endedByDashDash reports whether fs.Parse(args), which left rest, stopped
// at a "--" (which it consumes) rather than at a word that is not a flag. A
// "--" that is the value of a flag ("--owner --") does not count.
func endedByDashDash(fs *flag.FlagSet, args, rest []string) bool {
	parsed := args[:len(args)-len(rest)]
	for i := 0; i < len(parsed); i++ {
		if parsed[i] == "--" {
			return true
		}
		if takesValue(fs, parsed[i]) {
			i++ // its value
		}
	}
	return false
}

// takesValue reports whether arg is a flag of fs that takes the next
// argument as its value: "-w" does, "-w=5" and "-n" do not.
func takesValue(fs *flag.FlagSet, arg string) bool {
	name, ok := strings.CutPrefix(arg, "-")
	if !ok {
		return false
	}
	name = strings.TrimPrefix(name, "-")
	f := fs.Lookup(name) // nil for "", for "w=5" and for unknown flags
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

// durationValue is the value of every flag that takes a time span (--ttl,
// -w, --grace, --interval, the demo's): a Go duration ("1m30s", "500ms")
// or, as flock(1) takes -w, a bare number of seconds ("10", "0.5"). A
// negative span is refused.
type durationValue struct {
	d   *time.Duration
	set *bool // if not nil, set to true when the flag is given
}

// durationVar defines a flag of fs that parses as durationValue does, with
// the default value, into p.
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var(&durationValue{d: p}, name, usage)
}

func (v *durationValue) String() string {
	if v == nil || v.d == nil || (*v.d == 0 && (v.set == nil || !*v.set)) {
		return ""
	}
	return v.d.String()
}

func (v *durationValue) Set(s string) error {
	d, err := parseSeconds(s)
	if err != nil {
		return err
	}
	*v.d = d
	if v.set != nil {
		*v.set = true
	}
	return nil
}

// parseSeconds parses a time span as a Go duration ("1m30s", "500ms") or as
// a bare number of seconds with an optional fraction ("10", "0.5"). Its
// errors say what to write instead.
func parseSeconds(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		secs, ferr := strconv.ParseFloat(s, 64)
		switch {
		case ferr != nil || math.IsNaN(secs):
			return 0, errors.New("want a duration such as 10s, 500ms or 1m30s, or a number of seconds such as 10 or 0.5")
		case secs < 0:
			return 0, errors.New("must not be negative: want a duration such as 10s, or a number of seconds such as 10")
		case secs >= float64(math.MaxInt64)/float64(time.Second):
			return 0, fmt.Errorf("%s seconds is too long: want a duration such as 10s or 24h", s)
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d < 0 {
		return 0, errors.New("must not be negative: want a duration such as 10s, or a number of seconds such as 10")
	}
	return d, nil
}

// aliasOf starts the usage string of a flag that is another name for a
// flag; the name of that flag follows. printFlags lists them together.
const aliasOf = "\x00alias of "

// alias registers names as other names of the flag of, which must exist.
func alias(fs *flag.FlagSet, of string, names ...string) {
	f := fs.Lookup(of)
	for _, name := range names {
		fs.Var(f.Value, name, aliasOf+of)
	}
}

// printHelp prints a subcommand's help: its usage text, then its flags.
func printHelp(w io.Writer, sub subcommand) {
	fmt.Fprint(w, sub.usage)
	printFlags(w, sub.flags())
}

// printFlags lists the flags of fs, each with its other names
// ("-n, --nonblock, --try"): a name of one letter with one dash, a longer
// one with two (the flag package accepts either).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	aliases := make(map[string][]string)
	fs.VisitAll(func(f *flag.Flag) {
		if of, ok := strings.CutPrefix(f.Usage, aliasOf); ok {
			aliases[of] = append(aliases[of], f.Name)
		}
	})
	fs.VisitAll(func(f *flag.Flag) {
		if strings.HasPrefix(f.Usage, aliasOf) {
			return
		}
		var names []string
		for _, name := range append([]string{f.Name}, aliases[f.Name]...) {
			if len(name) == 1 {
				names = append(names, "-"+name)
			} else {
				names = append(names, "--"+name)
			}
		}
		arg, text := flag.UnquoteUsage(f)
		line := "  " + strings.Join(names, ", ")
		if arg != "" {
			line += " " + arg
		}
		switch f.DefValue {
		case "", "0", "false":
		default:
			text += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "%s\n        %s\n", line, text)
	})
}

// exitStatus is an error that sets the process's exit code. Its err, if not
// nil, is printed first; a nil err exits quietly (as when "distlock run"
// passes on the status of its command).
type exitStatus struct {
	code int
	err  error
}

func (e *exitStatus) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitStatus) Unwrap() error { return e.err }
