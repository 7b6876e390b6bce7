package loopback

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPingAndFreePort(t *testing.T) {
	port, err := FreePort()
	require.NoError(t, err)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	require.Error(t, Ping(addr), "nothing listens on a free port")

	l, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	defer l.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		buf := make([]byte, 6)
		if _, err := conn.Read(buf); err == nil {
			_, _ = conn.Write([]byte("+PONG\r\n"))
		}
	}()
	require.NoError(t, Ping(addr))
	<-done
}
