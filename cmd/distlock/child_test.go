package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The tests run the test binary itself as the command under "distlock run"
// (TestMain sends it to childMain when childEnv is set). The child reports
// through files in a directory:
//
//	NAME.env      written at start: what it found in its environment
//	NAME.signals  one line per signal it received
//
// and it exits with -exit when the file NAME.go appears, or with -sig-exit
// when it receives SIGTERM, SIGINT or SIGHUP (unless -ignore-term).

// childReport is the content of NAME.env.
type childReport struct {
	Key    string `json:"key"`
	Token  string `json:"token"`
	Tokens string `json:"tokens"` // DISTLOCK_TOKENS
	Owner  string `json:"owner"`
	Pid    int    `json:"pid"`
	Pgid   int    `json:"pgid"`
}

// childArgs returns the command line that runs a child named name
// reporting in dir, with extra child flags.
func childArgs(t *testing.T, dir, name string, flags ...string) []string {
	exe, err := os.Executable()
	require.NoError(t, err)
	return append([]string{exe, "-dir", dir, "-name", name}, flags...)
}

func childMain(args []string) int {
	fs := flag.NewFlagSet("child", flag.ContinueOnError)
	dir := fs.String("dir", "", "report directory")
	name := fs.String("name", "", "report name")
	exit := fs.Int("exit", 0, "status when NAME.go appears")
	sigExit := fs.Int("sig-exit", 0, "status on SIGTERM, SIGINT or SIGHUP")
	ignoreTerm := fs.Bool("ignore-term", false, "ignore SIGTERM")
	killSelf := fs.Bool("kill-self", false, "die by SIGKILL once started")
	spawn := fs.Bool("spawn", false, "start a grandchild NAME-grand in the same process group")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "child %s: %v\n", *name, err)
		return 99
	}
	sigs := make(chan os.Signal, 4)
	if *ignoreTerm {
		signal.Ignore(syscall.SIGTERM)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGHUP)
	} else {
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	}
	var grand *exec.Cmd
	if *spawn {
		grand = exec.Command(os.Args[0], "-dir", *dir, "-name", *name+"-grand", "-sig-exit", strconv.Itoa(*sigExit))
		grand.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := grand.Start(); err != nil {
			return fail(err)
		}
	}
	pgid, _ := syscall.Getpgid(0)
	rep := childReport{
		Key: os.Getenv("DISTLOCK_KEY"), Token: os.Getenv("DISTLOCK_TOKEN"), Tokens: os.Getenv("DISTLOCK_TOKENS"),
		Owner: os.Getenv("DISTLOCK_OWNER"),
		Pid:   os.Getpid(), Pgid: pgid,
	}
	if err := writeJSON(filepath.Join(*dir, *name+".env"), rep); err != nil {
		return fail(err)
	}
	if *killSelf {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case sig := <-sigs:
			if err := appendLine(filepath.Join(*dir, *name+".signals"), sig.String()); err != nil {
				return fail(err)
			}
			if grand != nil {
				// Like a shell, wait for the grandchild, which got the
				// signal too (it dies with this process otherwise).
				_ = grand.Wait()
			}
			return *sigExit
		case <-tick.C:
			if _, err := os.Stat(filepath.Join(*dir, *name+".go")); err == nil {
				return *exit
			}
		}
	}
}

// writeJSON writes v to path atomically, so that a reader never sees half.
func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, line)
	return errors.Join(err, f.Close())
}

// waitReport waits for the child name to start and returns its report.
func waitReport(t *testing.T, dir, name string) childReport {
	t.Helper()
	path := filepath.Join(dir, name+".env")
	var rep childReport
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(path)
		return err == nil && json.Unmarshal(b, &rep) == nil
	}, eventually, pollEvery, "child %s never started", name)
	return rep
}

// started reports whether the child name has started.
func started(dir, name string) bool {
	_, err := os.Stat(filepath.Join(dir, name+".env"))
	return !errors.Is(err, fs.ErrNotExist)
}

// release lets the child name exit with its -exit status.
func letExit(t *testing.T, dir, name string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".go"), nil, 0o644))
}

// signalsOf returns the signals the child name received, one per line.
func signalsOf(dir, name string) string {
	b, _ := os.ReadFile(filepath.Join(dir, name+".signals"))
	return string(b)
}
