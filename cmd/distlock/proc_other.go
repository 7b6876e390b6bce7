//go:build !unix

package main

import (
	"errors"
	"os"
	"os/exec"
)

// processControl is false: "distlock run" relies on Unix process groups and
// signals, and refuses to run elsewhere.
const processControl = false

var (
	forwardedSignals = []os.Signal{os.Interrupt}
	sigTerm          = os.Interrupt
	sigKill          = os.Kill
)

type child struct{ cmd *exec.Cmd }

func newChild(cmd *exec.Cmd, _ bool) *child { return &child{cmd: cmd} }
func (c *child) forwards(os.Signal) bool    { return true }
func (c *child) signal(os.Signal) error     { return errors.ErrUnsupported }
func signalNumber(os.Signal) int            { return 0 }
func killedBy(*os.ProcessState) int         { return 0 }
func inForeground() bool                    { return false }
