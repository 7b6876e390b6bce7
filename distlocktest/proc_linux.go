package distlocktest

import "syscall"

// procAttr makes the kernel kill redis-server if the test binary dies before
// it could (strictly, when the thread that started it exits; Go ends a
// thread only when a goroutine locked to it returns).
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
