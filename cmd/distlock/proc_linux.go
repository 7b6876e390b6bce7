package main

import (
	"syscall"
	"unsafe"
)

// setParentDeathSignal makes the kernel kill the command when distlock dies.
// (Strictly, when the thread that started it exits; Go ends a thread only
// when a goroutine locked to it returns, and distlock locks none.)
func setParentDeathSignal(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGKILL
}

// inForeground reports whether distlock runs in the foreground process group
// of its controlling terminal, that is, straight from an interactive shell.
// There the command should stay in distlock's process group: a command in a
// background group is stopped when it reads from the terminal.
func inForeground() bool {
	fd, err := syscall.Open("/dev/tty", syscall.O_RDONLY|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false // no controlling terminal: cron, systemd, a container
	}
	defer syscall.Close(fd)
	var pgrp int32
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), uintptr(syscall.TIOCGPGRP), uintptr(unsafe.Pointer(&pgrp)))
	return errno == 0 && int(pgrp) == syscall.Getpgrp()
}
