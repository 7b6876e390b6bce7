// Command distlock works with distlock locks from the shell.
//
//	distlock run [flags] KEY -- COMMAND [ARGS...]   run a command while holding a lock
//	distlock inspect [flags] KEY                    show who holds a lock; --watch follows it
//	distlock demo [flags]                           a few workers contend for one lock
//
// Run "distlock help" for an overview and "distlock COMMAND -h" for the
// flags and exit codes of each subcommand.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Exit codes shared by the subcommands. "distlock run" adds its own (see
// run.go), and otherwise exits with the status of the command it ran.
const (
	exitOK    = 0
	exitError = 1  // a runtime failure, such as Redis unreachable
	exitUsage = 64 // bad flags or arguments (EX_USAGE in sysexits.h)
)

const usage = `distlock works with distributed locks kept in Redis.

Usage:
  distlock run [flags] KEY -- COMMAND [ARGS...]
        run COMMAND while holding the lock KEY: wait for it, keep it renewed,
        stop the command if it is lost, release it when the command exits
  distlock inspect [flags] KEY
        show who holds the lock KEY, for how long, and its last fencing token
  distlock demo [flags]
        a few workers contend for one lock and print their transitions

Examples:
  # only one machine runs the nightly report at a time; the others wait
  distlock run --redis redis://redis.internal:6379 nightly-report -- ./report.sh

  # skip this run if another machine has the lock (exit status 75)
  distlock run --try --ttl 10s backup -- pg_dump -f /backup/db.sql app

  # who holds it now, and follow every change until Ctrl-C
  distlock inspect backup
  distlock inspect --watch --json backup

  # see the lock at work, on an embedded Redis
  distlock demo --workers 5 --duration 10s

Redis comes from --redis, else $REDIS_URL, as a URL: redis://[user:pass@]host:port/db,
rediss:// for TLS, unix:///path/to/redis.sock, and several ?addr=host:port
parameters for a cluster. Only the demo falls back to an embedded Redis.

Run "distlock COMMAND -h" for a command's flags and exit codes.
`

func main() {
	// Each subcommand handles signals itself: demo and inspect stop on
	// SIGINT or SIGTERM, while run passes signals on to its command.
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches to a subcommand and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	var err error
	switch args[0] {
	case "run":
		err = runCommand(ctx, args[1:], stderr)
	case "inspect":
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		err = runInspect(ctx, args[1:], stdout, stderr)
		stop()
	case "demo":
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		err = runDemo(ctx, args[1:], stdout, stderr)
		stop()
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "distlock: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	var ue usageError
	var es *exitStatus
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &es):
		if es.err != nil {
			fmt.Fprintf(stderr, "distlock %s: %s\n", args[0], message(es.err))
		}
		return es.code
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "distlock %s: %s\n", args[0], message(err))
		return exitUsage
	default:
		fmt.Fprintf(stderr, "distlock %s: %s\n", args[0], message(err))
		return exitError
	}
}

// message is err's text without the library's "distlock: " prefix, which
// would only repeat the command's own.
func message(err error) string {
	return strings.TrimPrefix(err.Error(), "distlock: ")
}

// usageError marks an error in the command line.
type usageError struct{ error }

// newFlagSet returns the flag set of a subcommand, which prints usage and
// then the flags for -h or a bad flag.
func newFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args with fs. The flag package has already printed
// what is wrong, and the usage, when it returns an error; the error it
// returns here only sets the exit status (0 for -h, exitUsage otherwise).
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return &exitStatus{code: exitUsage}
}

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

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
