// Package loopback has the small network helpers that starting a private
// redis-server needs, shared by the test harness (internal/redistest) and
// the public test helper (distlocktest): a free loopback port, whether a
// given port is free, and a check that a server answers there.
package loopback

import (
	"fmt"
	"net"
	"strconv"
	"time"
)

// Ping checks that addr answers a RESP PING with PONG, within about 700ms.
func Ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 7)
	n, err := conn.Read(buf)
	if err != nil {
		return err
	}
	if string(buf[:n]) != "+PONG\r\n" {
		return fmt.Errorf("unexpected reply %q", buf[:n])
	}
	return nil
}

// FreePort returns a port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// IsFree reports whether port on 127.0.0.1 was free a moment ago.
func IsFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}
