//go:build unix && !linux

package main

import "syscall"

// setParentDeathSignal does nothing here: only Linux offers it portably.
func setParentDeathSignal(*syscall.SysProcAttr) {}

// inForeground reports false: the terminal check is implemented for Linux
// only. Pass --foreground to run an interactive command.
func inForeground() bool { return false }
