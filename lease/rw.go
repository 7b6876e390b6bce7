package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Read-write locks, and the lock of a name in all its faces.
//
// A read-write lock ([Keys.RW]) keeps its holders in a hash at the lease
// key: a field per holder, from its value to "<end> <token>", the server
// time (ms) at which its lease ends and its grant's token, the field "~w"
// naming the writer while one holds, and the field "~" holding "rw", the
// mark of the kind (a hash without it is not distlock's). The hash is kept
// at least as long as its longest lease, and as long as anyone stands in
// line behind its holders, so that a semaphore of the same name always
// finds it and refuses it. A lock or an election of the same name is the
// same lock: its exclusive hold is the string it has always written, which
// the read-write lock's scripts read as a writer's hold, and its scripts
// read the hash. The line, the rooms, the fencing key and the void markers
// are one; a waiter's entry in the waiters hash says its mode: "<lapse>
// <claim> <r|w> <room>" for a read-write lock's, "<lapse> <claim> <room>"
// (exclusive) for a lock's or an election's.
//
// The rules, in every script that grants, whatever the caller's face:
//
//   - holders whose lease has ended are dropped first (by the full path;
//     the lean paths never need to know), so a dead reader or writer stops
//     counting when its own lease ends;
//   - the head of the line is served first: a reader is granted while
//     nobody holds alone, and the run of readers behind it with it; an
//     exclusive waiter (a writer, a lock's) when nobody holds; the first
//     waiter that cannot be granted stops the run (arrival order: nobody
//     gets ahead of an earlier waiter);
//   - a caller is granted only when nobody is ahead of it and its mode
//     allows (a reader: nobody holds alone; an exclusive hold: nobody
//     holds); a caller that does not stand in line (TryRLock, TryLock) is
//     refused while anyone waits;
//   - every grant, to a caller or passed to a waiter, has a new token from
//     the fencing key (nextToken), so an exclusive holder's token is above
//     that of every reader granted before it. A holder that asks again (a
//     claim, a lost reply) keeps its token, as a lock's holder does.
//
// Release and Cancel drop the caller's hold (any mode, either format) and,
// when someone stands in line, serve the head of the line as above: an
// exclusive hold's release grants the whole run of readers at the head,
// the last reader's release the exclusive waiter first in line. Downgrade
// turns the writer's hold into a reader's in one script and serves the
// head of the line the same way. Renew extends the caller's hold in
// whatever mode and format it is (so a renewal in flight across a
// Downgrade is not refused), and never re-creates one.

// Mode is how a read-write lock's call holds it: [Read] shares it with
// other readers, [Write] excludes everyone. The zero Mode is no read-write
// lock.
type Mode byte

const (
	// Read holds a read-write lock shared with other readers.
	Read Mode = 'r'
	// Write holds a read-write lock alone.
	Write Mode = 'w'
)

// String returns "read", "write", or "" for the zero Mode.
func (m Mode) String() string {
	switch m {
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return ""
}

// RW returns k for a read-write lock whose acquire calls ask for mode
// (Read or Write). Renew, Release and Cancel do not depend on the mode:
// they act on the caller's hold, whichever it is.
func (k Keys) RW(mode Mode) Keys {
	k.Mode = mode
	return k
}

// ErrBadMode is returned for [Keys] whose Mode is neither 0, [Read] nor
// [Write], or that mix a read-write lock with a semaphore or an election.
var ErrBadMode = errors.New("lease: invalid read-write mode")

func (k Keys) checkMode() error {
	switch {
	case k.Mode == 0:
		return nil
	case k.Mode != Read && k.Mode != Write:
		return fmt.Errorf("%w: %q", ErrBadMode, k.Mode)
	case k.Permits != 0 || k.Announce:
		return fmt.Errorf("%w: a read-write lock is neither a semaphore nor an election", ErrBadMode)
	}
	return nil
}

// Downgrade turns value's write hold of k's read-write lock into a read
// hold with the given TTL, counted from when Redis runs the script, and in
// the same step grants the run of readers at the head of the line (each
// told in its room, as a release's passes are). It reports whether value
// now holds the lock as a reader: false when it did not hold it (its lease
// ended, or another holds it); true also when it was a reader already, so
// that a Downgrade whose reply was lost can be sent again. The readers
// granted are in the Release's Passed and More (its Deleted is unused).
//
// A TTL under a millisecond is refused with ErrBadTTL, keys that are not a
// read-write lock's with ErrBadMode, before anything is sent.
func (c *Client) Downgrade(ctx context.Context, k Keys, value string, ttl time.Duration) (bool, Release, error) {
	if ttl < time.Millisecond {
		return false, Release{}, ErrBadTTL
	}
	if k.Mode == 0 {
		return false, Release{}, fmt.Errorf("%w: %s is not a read-write lock", ErrBadMode, k.Lease)
	}
	if err := k.check(); err != nil {
		return false, Release{}, err
	}
	res := c.run(ctx, rwDowngradeScript, []string{k.Lease, k.Fence, k.Queue, k.Waiters}, []string{value, ms(ttl)})
	n, arr, err := scriptReply(res)
	switch {
	case err != nil:
		return false, Release{}, err
	case arr == nil:
		return n == 1, Release{}, nil
	}
	r, err := parseRelease(arr)
	if err != nil {
		return false, Release{}, err
	}
	ok := r.Deleted
	r.Deleted = false
	return ok, r, nil
}
