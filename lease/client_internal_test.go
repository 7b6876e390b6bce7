package lease

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
)

// TestScriptReplyReadsEachKind checks scriptReply on each kind of reply,
// and that an array, the reply of a release that passed the lock on and of
// a call that stands in line, costs no allocation to read.
func TestScriptReplyReadsEachKind(t *testing.T) {
	refused := NewReplyError("NOSCRIPT No matching script", nil)
	arr := []Reply{IntReply(1), IntReply(7), StringReply("v"), StringReply("room")}
	cases := []struct {
		name    string
		reply   Reply
		n       int64
		arr     int
		wantErr error
	}{
		{"number", IntReply(3), 3, 0, nil},
		{"number as a string", StringReply("4"), 4, 0, nil},
		{"array", ArrayReply(arr), 0, len(arr), nil},
		{"empty array", ArrayReply(nil), 0, 0, ErrProtocol},
		{"nil", NilReply(), 0, 0, ErrProtocol},
		{"not a number", StringReply("x"), 0, 0, ErrProtocol},
		{"error", ErrorReply(refused), 0, 0, refused},
	}
	for _, c := range cases {
		n, got, err := scriptReply(c.reply)
		if c.wantErr != nil {
			if !errors.Is(err, c.wantErr) {
				t.Errorf("%s: got error %v, want %v", c.name, err, c.wantErr)
			}
			continue
		}
		if err != nil || n != c.n || len(got) != c.arr {
			t.Errorf("%s: got %d, %d elements, %v; want %d, %d elements, no error", c.name, n, len(got), err, c.n, c.arr)
		}
	}
	reply := ArrayReply(arr)
	if allocs := testing.AllocsPerRun(100, func() { _, _, _ = scriptReply(reply) }); allocs != 0 {
		t.Errorf("reading an array: got %v allocations, want 0", allocs)
	}
}

// TestIsTimeout checks which errors IsTimeout takes for a client's own
// timeout: a network deadline, as rueidis and go-redis report it, wrapped
// or not; never a context's error, an error reply, or another failure.
func TestIsTimeout(t *testing.T) {
	ioTimeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	cases := []struct {
		err  error
		want bool
	}{
		{ioTimeout, true},
		{fmt.Errorf("eval: %w", ioTimeout), true},
		{os.ErrDeadlineExceeded, true},
		{nil, false},
		{context.DeadlineExceeded, false},
		{fmt.Errorf("call: %w", context.DeadlineExceeded), false},
		{context.Canceled, false},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, false},
		{NewReplyError("BUSY Redis is busy running a script", nil), false},
	}
	for _, c := range cases {
		if got := IsTimeout(c.err); got != c.want {
			t.Errorf("IsTimeout(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
