package main

import (
	"testing"
	"time"
)

// TestLocalTime checks that a Unix time comes back as the local time it
// names, with a monotonic reading: a second from now is a second from now.
func TestLocalTime(t *testing.T) {
	const slack = 50 * time.Millisecond // a loaded machine may preempt the test
	want := time.Now().Add(time.Second)
	got := localTime(want.UnixNano())
	if d := got.Sub(want); d < -slack || d > slack {
		t.Errorf("localTime: got %v, %v off what it was given", got, d)
	}
	if got.Round(0) == got { // Round(0) drops the monotonic reading
		t.Errorf("localTime: got %v without a monotonic reading", got)
	}
}
