// Command distlock works with distlock locks from the shell.
//
//	distlock demo [flags]     a few workers contend for one lock and print what happens
//
// Run "distlock help" for the flags of each subcommand.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Exit codes shared by the subcommands.
const (
	exitOK    = 0
	exitError = 1 // a runtime failure, such as Redis unreachable
	exitUsage = 2 // bad flags or arguments
)

const usage = `distlock works with distributed locks kept in Redis.

Usage:
  distlock demo [flags]    a few workers contend for one lock and print their
                           transitions and tokens

Run "distlock <command> -h" for a command's flags. Redis is taken from
--redis, then $REDIS_URL; the demo falls back to an embedded Redis.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches to a subcommand and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	var err error
	switch args[0] {
	case "demo":
		err = runDemo(ctx, args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "distlock: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "distlock %s: %v\n", args[0], err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "distlock %s: %v\n", args[0], err)
		return exitError
	}
}

// usageError marks an error in the command line.
type usageError struct{ error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }
