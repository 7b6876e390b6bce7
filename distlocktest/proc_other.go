//go:build !linux

package distlocktest

import "syscall"

// procAttr returns nil: only Linux can tie redis-server's life to the test
// binary's, so elsewhere a test binary that is killed leaves its servers
// running.
func procAttr() *syscall.SysProcAttr { return nil }
