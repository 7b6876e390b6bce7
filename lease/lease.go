package lease

import (
	"errors"
	"fmt"
	"regexp"
	"time"
)

// FenceRetention is how long the fencing key outlives the last acquisition.
// It guards token order against a server clock that steps back; see the
// package documentation.
const FenceRetention = 24 * time.Hour

// ErrProtocol is wrapped by errors for replies that do not have the shape the
// scripts return, which means something other than distlock wrote the keys or
// answered the call.
var ErrProtocol = errors.New("unexpected reply")

// ErrWrongKind is matched by a [*WrongKindError].
var ErrWrongKind = errors.New("distlock: name used by another kind of lease")

// WrongKindError reports a call of one kind (a lock's in any face, a
// semaphore's) refused because the lease key holds another kind, or a key
// that distlock did not write. Nothing was written. A lock's and a
// read-write lock's calls are one kind: they never refuse each other.
type WrongKindError struct {
	Key   string // the lease key
	Want  string // "lock", "semaphore" or "rwmutex"
	Found string // "semaphore", "lock", "rwmutex", or the Redis type of a foreign key ("hash", "list", ...)
	Reply error  // the script's error reply
}

func (e *WrongKindError) Error() string {
	// distlock wraps this error in one that says what it was doing, so the
	// text does not repeat the "distlock:" prefix.
	if e.Found == "lock" || e.Found == "semaphore" || e.Found == "rwmutex" {
		return fmt.Sprintf("%s is a %s, not a %s: the name is used by another kind", e.Key, e.Found, e.Want)
	}
	return fmt.Sprintf("%s holds a %s, not a %s: distlock did not write it", e.Key, e.Found, e.Want)
}

// Is reports whether target is [ErrWrongKind].
func (e *WrongKindError) Is(target error) bool { return target == ErrWrongKind }

// Unwrap returns the script's error reply.
func (e *WrongKindError) Unwrap() error { return e.Reply }

// IsReply reports whether err is, or wraps, an error that Redis answered
// with (an error reply): the call reached Redis and did not run to a write,
// as opposed to a call that got no reply (a lost connection, a deadline),
// whose outcome is unknown.
func IsReply(err error) bool {
	_, ok := replyError(err)
	return ok
}

// IsTryAgain reports whether err is Redis Cluster's TRYAGAIN reply: a
// script on several keys of a slot that is being migrated, some of whose
// keys have moved. The script did not run, and the same call can be sent
// again once the migration has gone on (the scripts retry it themselves
// until their context ends).
func IsTryAgain(err error) bool { return isTryAgain(err) }

// wrongKindReply matches the error reply of a script that found the lease
// key of another kind (see lineLua's scan and semLua's notSemaphore).
var wrongKindReply = regexp.MustCompile(`^(?:ERR )?distlock: .* holds a (\w+), not a (lock|semaphore|rwmutex);`)

// kindError turns the error reply of a script that found the lease key of
// another kind into a *WrongKindError, and returns any other error as it is.
func kindError(k Keys, err error) error {
	rerr, ok := replyError(err)
	if !ok {
		return err
	}
	m := wrongKindReply.FindStringSubmatch(rerr.Message)
	if m == nil {
		return err
	}
	found := m[1]
	switch found {
	case "string":
		found = "lock" // a lock's or an election's lease
	case "zset":
		found = "semaphore"
	}
	return &WrongKindError{Key: k.Lease, Want: m[2], Found: found, Reply: err}
}

// ErrBadTTL is returned for a TTL under one millisecond, Redis's unit.
var ErrBadTTL = errors.New("lease: TTL under one millisecond")
