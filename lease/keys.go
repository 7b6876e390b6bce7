package lease

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on the names that make up a lock's Redis keys.
const (
	// MaxNameLen is the longest lock name, in bytes.
	MaxNameLen = 512
	// MaxNamespaceLen is the longest namespace, in bytes.
	MaxNamespaceLen = 128
	// MaxOwnerLen is the longest owner id, in bytes.
	MaxOwnerLen = 256
)

// ErrInvalidName is wrapped by every error that [CheckName], [CheckNamespace]
// and [CheckOwner] return.
var ErrInvalidName = errors.New("invalid name")

// Keys are the Redis keys of one lock. All of them share the hash tag
// "{name}", so in Redis Cluster they live in one slot and a script may touch
// them together.
type Keys struct {
	// Lease holds the current holder's value and carries the lease's TTL.
	Lease string
	// Fence holds the highest fencing token issued for the lock.
	Fence string
	// Queue is the waiting line: a sorted set of the values of the waiters,
	// scored by ticket (their place in line).
	Queue string
	// Waiters holds, for each value in Queue, when its place lapses, its
	// claim window and the room it is told of a grant in (see [Client.Wait]).
	Waiters string
	// Wake is the prefix of the sharded pub/sub channels on which grants are
	// announced: a waiting room (one per process, client and lock) listens
	// on Wake + ":" + its id. See [Keys.WakeChannel]. The scripts publish
	// on Lease + ":wake:" + the room, so it must be Lease + ":wake", as
	// [NewKeys] makes it.
	Wake string
	// Leader is the sharded pub/sub channel on which an election announces
	// every change of its leader (see [Keys.Election]); the scripts publish
	// on Lease + ":leader", as [NewKeys] makes it.
	Leader string
	// Permits is 0 for a lock, whose lease is a string holding the one
	// holder's value, and n >= 1 for a semaphore of n permits, whose lease
	// is a sorted set of its holders' values scored by the server time (ms)
	// at which each one's lease ends. See [Keys.Semaphore].
	Permits int
	// Announce makes the scripts of a lock publish every change of holder
	// on the Leader channel; see [Keys.Election].
	Announce bool
	// Limit holds the permits of the last grant of a semaphore, for
	// inspection; nothing decides on it.
	Limit string
	// Mode is, for a read-write lock, the mode its acquire calls ask for
	// ([Read] or [Write]), and 0 for every other kind; see [Keys.RW].
	Mode Mode
}

// Semaphore returns k for a semaphore of permits permits (at least 1): up
// to permits values hold the lease at once, each with its own expiry.
func (k Keys) Semaphore(permits int) Keys {
	k.Permits = permits
	return k
}

// Election returns k for an election: a lock whose scripts announce every
// change of holder on [Keys.Leader], as "<token>\n<value>" for a new holder
// and "<token>\n" when the holder with that token left without a successor.
func (k Keys) Election() Keys {
	k.Announce = true
	return k
}

// WakeChannel returns the channel on which the waiting room room hears of
// grants to its waiters.
func (k Keys) WakeChannel(room string) string { return k.Wake + ":" + room }

// Void returns the key that marks value as given up: [Client.Cancel] sets
// it, and while it exists an acquire with value is refused. It is the lease
// key followed by ":void:" and the value, so it shares the lock's hash tag.
func (k Keys) Void(value string) string { return k.Lease + ":void:" + value }

// NewKeys returns the keys of the lock name in namespace ns. It checks both
// with [CheckNamespace] and [CheckName].
//
// The lease key is "ns:{name}", the fencing key "ns:{name}:fence", the queue
// "ns:{name}:queue" with its entries in "ns:{name}:waiters", the wake
// channels "ns:{name}:wake:<room>", an election's channel "ns:{name}:leader"
// and a semaphore's record of its limit "ns:{name}:permits". A lock, a
// read-write lock, an election and a semaphore of the same name share
// these keys. A lock, an election (a lock whose grants are announced) and
// a read-write lock of one name are one lock, with one line; the scripts
// of a lock and of a semaphore refuse each other's lease with an error
// (see [WrongKindError]).
func NewKeys(ns, name string) (Keys, error) {
	if err := CheckNamespace(ns); err != nil {
		return Keys{}, err
	}
	if err := CheckName(name); err != nil {
		return Keys{}, err
	}
	// One allocation holds every key: each is a piece of one string.
	suffixes := [...]string{"", ":fence", ":queue", ":waiters", ":wake", ":leader", ":permits"}
	baseLen := len(ns) + len(":{") + len(name) + len("}")
	var b strings.Builder
	b.Grow(len(suffixes)*baseLen + len(":fence:queue:waiters:wake:leader:permits"))
	for _, suffix := range suffixes {
		b.WriteString(ns)
		b.WriteString(":{")
		b.WriteString(name)
		b.WriteString("}")
		b.WriteString(suffix)
	}
	all := b.String()
	var keys [len(suffixes)]string
	for i, suffix := range suffixes {
		n := baseLen + len(suffix)
		keys[i], all = all[:n], all[n:]
	}
	return Keys{
		Lease:   keys[0],
		Fence:   keys[1],
		Queue:   keys[2],
		Waiters: keys[3],
		Wake:    keys[4],
		Leader:  keys[5],
		Limit:   keys[6],
	}, nil
}

// CheckName reports whether name may be used as a lock name: 1 to
// [MaxNameLen] bytes of valid UTF-8 made of printable characters (letters,
// marks, numbers, punctuation, symbols and the ASCII space), without '{' or
// '}'. The braces are reserved because distlock wraps the name in a Redis
// Cluster hash tag; control characters and other white space are refused so
// that a key reads the same in logs, redis-cli and the distlock command.
func CheckName(name string) error { return check("key", name, MaxNameLen, true) }

// CheckNamespace applies the rules of [CheckName] to a namespace, with a
// limit of [MaxNamespaceLen] bytes.
func CheckNamespace(ns string) error { return check("namespace", ns, MaxNamespaceLen, true) }

// CheckOwner reports whether id may be used as an owner id: 1 to
// [MaxOwnerLen] bytes of printable UTF-8. Braces are allowed, since the owner
// id is stored in the value, never in a key name.
func CheckOwner(id string) error { return check("owner", id, MaxOwnerLen, false) }

func check(what, s string, maxLen int, keyPart bool) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: %s is empty", ErrInvalidName, what)
	case len(s) > maxLen:
		return fmt.Errorf("%w: %s is %d bytes long, more than %d", ErrInvalidName, what, len(s), maxLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidName, what)
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(s[i:])
		return fmt.Errorf("%w: %s has the unprintable character %U at byte %d", ErrInvalidName, what, r, i)
	}
	if keyPart {
		if i := strings.IndexAny(s, "{}"); i >= 0 {
			return fmt.Errorf("%w: %s has %q at byte %d; braces are reserved for the Redis Cluster hash tag", ErrInvalidName, what, s[i], i)
		}
	}
	return nil
}
