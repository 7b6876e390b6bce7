package distlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"sync/atomic"
)

// process is the state that this process keeps for all of its locks, in
// one place with one owner: the package variable proc. It lives as long as
// the process, and everything in it is removed once no call needs it:
//
//   - the sessions (session.go), one per client while the client has a
//     live guard, a Lock call waiting in a room, or a room or restart
//     watch that lingers after its last user: each holds what the
//     client's locks share (the waiting rooms, the restart watch, the
//     renewal batcher) and has one stop;
//   - the work that acquire calls left to run in the background (a call in
//     flight whose caller gave up, the clean-up of a call that gave up),
//     and the end of a session's part or of a session that is stopping,
//     counted so that [Settle] can wait for it;
//   - the count of the guards' actors that run (one per guard past its
//     first renewal, until its end or its final loss).
//
// Nothing in it refers to a client once the client's session has stopped
// and the background work that used the client has ended. Nothing a guard
// or a Lock call does waits for a session, or a part of one, to stop.
type process struct {
	// roomID names this process's waiting rooms in Redis: a waiter in line
	// is told of its grant on the channel "<lock>:wake:<roomID>". It is
	// drawn at random once per process, so the rooms of two processes never
	// share a channel; the rooms of one process (one per client that waits
	// for the lock) share it, and each wakes only its own waiters.
	roomID string

	// sessions hold what each client's locks share (session.go).
	sessions sessionSet

	work workCount

	// actors counts the guards' actors that run (guardactor.go).
	actors atomic.Int64
}

// proc is the process's state.
var proc = &process{roomID: newProcessID()}

// newProcessID returns 16 random hex digits.
func newProcessID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported systems
	return hex.EncodeToString(b[:])
}

// goWork runs f in a goroutine of its own as the process's background
// work, which Settle waits for. f must return in bounded time, and must
// begin with
//
//	defer proc.work.done()
//
// which gives back the count goWork takes: f runs as it is, with no
// wrapper around it, which would cost the hot path of a cancellable Lock
// an allocation.
func (p *process) goWork(f func()) {
	p.work.add(1)
	go f()
}

// workCount counts goroutines and tells whoever waits when none is left.
// Counting costs no allocation; a waiter's channel is made only when
// someone waits.
type workCount struct {
	mu      sync.Mutex
	n       int
	waiters []chan struct{} // closed when n drops to 0
}

// done counts one goroutine out.
func (w *workCount) done() { w.add(-1) }

func (w *workCount) add(d int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n += d
	if w.n == 0 {
		for _, ch := range w.waiters {
			close(ch)
		}
		w.waiters = nil
	}
}

// wait returns once no counted goroutine runs, or ctx's error when ctx
// ends first.
func (w *workCount) wait(ctx context.Context) error {
	w.mu.Lock()
	if w.n == 0 {
		w.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	w.waiters = append(w.waiters, ch)
	w.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Settle waits until the work that acquire calls left to the background in
// this process is done, or until ctx ends, and returns ctx's error then.
//
// A Lock, TryLock or TryLockFor call that gives up (its context ended, its
// wait ran out, or a call's outcome was unknown) returns at once and leaves
// its clean-up to a goroutine of its own: it takes the caller's place out of
// the lock's line and passes on a lock that was passed to it meanwhile. A
// program that exits right after such a call would cut that clean-up short;
// Redis then forgets the place, and the lock passed to it, on its own within
// the claim window (see [WithClaimWindow]). Calling Settle before exiting,
// with a short timeout, lets the next waiter have the lock at once instead.
// It also waits for the end of what a client's session (session.go) is
// stopping: a waiting room's or a restart watch's subscription whose
// linger has passed, and the session's own stop, which ends its renewal
// batcher; nothing a Release, a final loss or a Lock does waits for those.
// It does not wait for a linger to pass.
// Settle is safe for concurrent use and needs no call to have given up: with
// nothing in the background it returns nil at once. It waits on a signal,
// not by polling. A nil ctx is refused, as Lock refuses it, with an
// [*ArgumentError] matching [ErrInvalidArgument].
func Settle(ctx context.Context) error {
	if ctx == nil {
		return badArgument("ctx", "is nil")
	}
	return proc.work.wait(ctx)
}
