package lease

import (
	"errors"
	"fmt"
	"testing"
)

func TestReplyErrorIsFoundAsErrorsAsFindsIt(t *testing.T) {
	re := NewReplyError("TRYAGAIN Multiple keys request during rehashing of slot", nil)
	other := errors.New("connection reset")
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"itself", re, true},
		{"wrapped", fmt.Errorf("acquire: %w", re), true},
		{"joined", errors.Join(other, fmt.Errorf("x: %w", re)), true},
		{"wrapped twice in a join", fmt.Errorf("y: %w", errors.Join(other, re)), true},
		{"other", other, false},
		{"other joined", errors.Join(other, errors.New("b")), false},
	}
	for _, c := range cases {
		got, ok := replyError(c.err)
		var want *ReplyError
		wantOK := errors.As(c.err, &want)
		if ok != c.want || ok != wantOK || got != want {
			t.Errorf("%s: replyError = %v, %v; errors.As = %v, %v", c.name, got, ok, want, wantOK)
		}
	}
	if !isTryAgain(fmt.Errorf("w: %w", re)) || isTryAgain(NewReplyError("TRYAGAINX", nil)) || isTryAgain(other) {
		t.Error("isTryAgain reads the error code wrong")
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = replyError(nil); _ = isTryAgain(other) }); n != 0 {
		t.Errorf("replyError allocates %v times per call", n)
	}
}

func TestReplyConversions(t *testing.T) {
	if n, err := StringReply("42").AsInt64(); err != nil || n != 42 {
		t.Errorf("a numeric string reply: %v, %v", n, err)
	}
	if _, err := StringReply("x").AsInt64(); !errors.Is(err, ErrProtocol) {
		t.Errorf("a non-numeric string as an integer: %v", err)
	}
	if s, err := IntReply(7).ToString(); err != nil || s != "7" {
		t.Errorf("an integer as a string: %q, %v", s, err)
	}
	if _, err := NilReply().ToString(); !errors.Is(err, ErrProtocol) {
		t.Errorf("nil as a string: %v", err)
	}
	boom := errors.New("boom")
	if _, err := ErrorReply(boom).ToArray(); err != boom {
		t.Errorf("an error reply as an array gives %v, not its error", err)
	}
	if !ErrorReply(nil).IsNil() || ErrorReply(nil).Err() != nil {
		t.Error("ErrorReply(nil) is not the nil reply")
	}
	arr, err := ArrayReply([]Reply{IntReply(1), NilReply()}).ToArray()
	if err != nil || len(arr) != 2 || !arr[1].IsNil() {
		t.Errorf("an array reply: %v, %v", arr, err)
	}
}

func TestRefusesPubSubOnlyForARefusal(t *testing.T) {
	for msg, want := range map[string]bool{
		"ERR unknown command 'SSUBSCRIBE'":                true,
		"NOPERM User app has no permissions to access":    true,
		"MOVED 3999 127.0.0.1:6381":                       false,
		"ASK 3999 127.0.0.1:6381":                         false,
		"TRYAGAIN Multiple keys request during rehashing": false,
		"CLUSTERDOWN The cluster is down":                 false,
		"LOADING Redis is loading the dataset in memory":  false,
		"MASTERDOWN Link with MASTER is down":             false,
	} {
		if got := RefusesPubSub(fmt.Errorf("subscribe: %w", NewReplyError(msg, nil))); got != want {
			t.Errorf("RefusesPubSub(%q) = %v", msg, got)
		}
	}
	if RefusesPubSub(errors.New("connection reset")) || RefusesPubSub(nil) {
		t.Error("an error that is not a reply is not a refusal")
	}
}
