//go:build unix

package main

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// processControl reports whether "distlock run" can manage its command on
// this system.
const processControl = true

// forwardedSignals are the signals that "distlock run" catches and passes on
// to its command: those that would otherwise end distlock and leave the
// command running without anyone renewing its lease.
var forwardedSignals = []os.Signal{
	syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
}

var (
	sigTerm os.Signal = syscall.SIGTERM
	sigKill os.Signal = syscall.SIGKILL
)

// child is the command that "distlock run" started.
type child struct {
	cmd *exec.Cmd
	// group is true when the command leads a process group of its own and
	// signals go to the whole group; false when it shares distlock's group
	// (--foreground) and signals go to the command alone.
	group bool
}

// newChild prepares cmd to run in a process group of its own, or in
// distlock's when ownGroup is false. Where the system allows it (Linux), the
// command is also killed if distlock dies without a chance to stop it (the
// OOM killer, SIGKILL): nobody would renew its lease any more.
func newChild(cmd *exec.Cmd, ownGroup bool) *child {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: ownGroup}
	setParentDeathSignal(cmd.SysProcAttr)
	return &child{cmd: cmd, group: ownGroup}
}

// forwards reports whether sig should be passed on. A command in distlock's
// own process group gets SIGINT and SIGQUIT from the terminal directly;
// passing them on as well would deliver them twice.
func (c *child) forwards(sig os.Signal) bool {
	return c.group || (sig != syscall.SIGINT && sig != syscall.SIGQUIT)
}

// signal sends sig to the command's process group, or to the command alone
// when it has none of its own. A command that has already exited is not an
// error.
func (c *child) signal(sig os.Signal) error {
	if !c.group {
		err := c.cmd.Process.Signal(sig)
		if errors.Is(err, os.ErrProcessDone) {
			return nil
		}
		return err
	}
	s, ok := sig.(syscall.Signal)
	if !ok {
		return errors.New("not a Unix signal")
	}
	// The group outlives its leader while any member is alive; after that
	// kill reports ESRCH.
	if err := syscall.Kill(-c.cmd.Process.Pid, s); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// signalNumber returns sig's number, for the 128+N exit status.
func signalNumber(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return int(s)
	}
	return 0
}

// killedBy returns the number of the signal that killed the process, or 0
// if it exited on its own.
func killedBy(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return int(ws.Signal())
	}
	return 0
}
