package lease

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// Redis is what the lease protocol needs of a Redis client: a handful of
// calls, all the protocol sends. [FromRueidis] makes one of a rueidis
// client; the module github.com/distkit-go/distlock/goredis makes one of a
// go-redis client. Everything above this seam (the scripts, their replies,
// the retries of TRYAGAIN, the waiting for replicas' counts) is the same
// code for every client, and clients of either kind share one lock: the
// keys, scripts and channels are the same.
//
// An implementation must be safe for concurrent use. Its methods return
// a Redis error reply as a [*ReplyError] (so that the protocol can tell
// a call that Redis refused from a call whose outcome is unknown) and any
// other failure as it is.
type Redis interface {
	// Eval runs s on keys and args: EVALSHA, and EVAL with s's body when
	// Redis answers NOSCRIPT. On a cluster it follows MOVED and ASK to the
	// node that owns the keys' slot; a TRYAGAIN reply is returned, since
	// the caller knows how long it may wait.
	Eval(ctx context.Context, s *Script, keys, args []string) Reply

	// EvalWait is Eval followed by WAIT replicas on the same connection
	// (WAIT counts the writes of its own connection), in one round trip
	// where it can: on a cluster, on the primary that owns the keys' slot,
	// following MOVED and ASK with both commands. It returns the script's
	// reply, and WAIT's count of replicas or why there is none. timeout is
	// WAIT's, at least one millisecond.
	EvalWait(ctx context.Context, s *Script, keys, args []string, replicas int, timeout time.Duration) (Reply, int64, error)

	// Subscribe subscribes to channel, with SSUBSCRIBE when sharded is true
	// (on a cluster, at the node that owns the channel's slot) and
	// SUBSCRIBE otherwise, and calls ready once Redis has confirmed the
	// subscription and message with every message on it, in order, from
	// the calling goroutine. It returns ctx.Err() when ctx ends, having
	// ended the subscription; nil when the server ended it (a slot moved,
	// or the connection was re-established); a *ReplyError when Redis
	// refused it; or the connection's error. After any return, messages
	// may have been missed: it never resubscribes on its own.
	Subscribe(ctx context.Context, channel string, sharded bool, ready func(), message func(string)) error

	// Identity returns the client behind this Redis, comparable with ==:
	// the locks of one process that share it share a waiting room per lock
	// and one subscription.
	Identity() any
}

// DedicatedEvaler is implemented by a Redis that can run a script on a
// connection of its own, borrowed for the call, rather than on the shared
// ones. The protocol uses it for the clean-up that may still run after its
// caller has returned, while the client's owner closes the client (see
// [Client.CancelDedicated]); a Redis without it runs the clean-up with
// Eval.
type DedicatedEvaler interface {
	EvalDedicated(ctx context.Context, s *Script, keys, args []string) Reply
}

// Script is one of the protocol's Lua scripts: its body and the body's
// SHA1, which EVALSHA names.
type Script struct {
	src string
	sha string
	lua *rueidis.Lua // for FromRueidis, which runs it with rueidis's own fallback
}

func newScript(src string) *Script {
	sum := sha1.Sum([]byte(src))
	s := &Script{src: src, sha: hex.EncodeToString(sum[:]), lua: rueidis.NewLuaScript(src)}
	allScripts = append(allScripts, s)
	return s
}

// allScripts lists every script of the protocol, as it is sent, for the
// tests that check each one (lua_internal_test.go). The scripts are
// package-level values, so it is complete once the package is initialised.
var allScripts []*Script

// Source returns the script's body, for EVAL.
func (s *Script) Source() string { return s.src }

// SHA1 returns the hex SHA1 of the script's body, for EVALSHA.
func (s *Script) SHA1() string { return s.sha }

// ReplyError is an error reply of Redis: the call reached Redis, and Redis
// answered it with an error (a script's error, NOSCRIPT, TRYAGAIN, MOVED, a
// refused command), as opposed to a call that got no reply. It unwraps to
// the client library's own error, if the Redis gave one.
type ReplyError struct {
	Message string // as Redis sent it, such as "NOSCRIPT No matching script."
	Err     error  // the client library's error, if any
}

// NewReplyError returns a *ReplyError for the error reply msg, as err of
// the client library reported it (err may be nil).
func NewReplyError(msg string, err error) *ReplyError { return &ReplyError{Message: msg, Err: err} }

func (e *ReplyError) Error() string { return e.Message }

// Unwrap returns the client library's error.
func (e *ReplyError) Unwrap() error { return e.Err }

// prefix reports whether the reply's first word (its error code) is code.
func (e *ReplyError) prefix(code string) bool {
	m := e.Message
	return len(m) >= len(code) && m[:len(code)] == code && (len(m) == len(code) || m[len(code)] == ' ')
}

// replyError returns the *ReplyError in err's chain, if any, as errors.As
// would. It walks the chain by hand: errors.As's target escapes, which
// would cost an allocation on every call of every script, error or not.
func replyError(err error) (*ReplyError, bool) {
	for err != nil {
		switch e := err.(type) {
		case *ReplyError:
			return e, true
		case interface{ Unwrap() error }:
			err = e.Unwrap()
		case interface{ Unwrap() []error }:
			for _, err := range e.Unwrap() {
				if re, ok := replyError(err); ok {
					return re, true
				}
			}
			return nil, false
		default:
			return nil, false
		}
	}
	return nil, false
}

// isTryAgain reports whether err is Redis's TRYAGAIN: the script did not
// run, since some of its keys are moving to another node (see run).
func isTryAgain(err error) bool {
	re, ok := replyError(err)
	return ok && re.prefix("TRYAGAIN")
}

// Reply is a reply of Redis to a script: an integer, a string, an array of
// replies, nil, or an error. The zero Reply is nil.
type Reply struct {
	kind replyKind
	n    int64
	s    string
	arr  []Reply
	err  error
}

type replyKind uint8

const (
	replyNil replyKind = iota
	replyInt
	replyString
	replyArray
	replyErr
)

// IntReply returns an integer reply.
func IntReply(n int64) Reply { return Reply{kind: replyInt, n: n} }

// StringReply returns a string reply (bulk or simple).
func StringReply(s string) Reply { return Reply{kind: replyString, s: s} }

// ArrayReply returns an array reply of elems.
func ArrayReply(elems []Reply) Reply { return Reply{kind: replyArray, arr: elems} }

// NilReply returns a nil reply (a Lua false or nil).
func NilReply() Reply { return Reply{} }

// ErrorReply returns a reply that failed with err: an error reply of Redis
// as a [*ReplyError], or why there is no reply. A nil err is a nil reply.
func ErrorReply(err error) Reply {
	if err == nil {
		return Reply{}
	}
	return Reply{kind: replyErr, err: err}
}

// Err returns the reply's error, if it is one.
func (r Reply) Err() error { return r.err }

// IsNil reports whether the reply is nil.
func (r Reply) IsNil() bool { return r.kind == replyNil }

// AsInt64 returns an integer reply, or a string reply read as an integer.
func (r Reply) AsInt64() (int64, error) {
	switch r.kind {
	case replyInt:
		return r.n, nil
	case replyString:
		n, err := strconv.ParseInt(r.s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: %q is not an integer", ErrProtocol, r.s)
		}
		return n, nil
	}
	return 0, r.mismatch("an integer")
}

// ToString returns a string reply, or an integer reply as its decimal text.
func (r Reply) ToString() (string, error) {
	switch r.kind {
	case replyString:
		return r.s, nil
	case replyInt:
		return strconv.FormatInt(r.n, 10), nil
	}
	return "", r.mismatch("a string")
}

// ToArray returns the elements of an array reply.
func (r Reply) ToArray() ([]Reply, error) {
	if r.kind == replyArray {
		return r.arr, nil
	}
	return nil, r.mismatch("an array")
}

func (r Reply) mismatch(want string) error {
	switch r.kind {
	case replyErr:
		return r.err
	case replyNil:
		return fmt.Errorf("%w: nil where %s was expected", ErrProtocol, want)
	case replyArray:
		return fmt.Errorf("%w: an array where %s was expected", ErrProtocol, want)
	}
	return fmt.Errorf("%w: a value of another type where %s was expected", ErrProtocol, want)
}
