package distlock_test

// The fault suite for read-write locks: a reader or a writer stopped and
// killed in a helper process, a downgraded writer cut off, and Redis
// restarted, with the history checked for "no writer with anyone else"
// (history.Config.RW) and for arrival order (each contender's wire
// records when it first stood in line).
//
// The scenarios use the semaphore's harness (contender, permitWire, the
// permit helper with kind "rwmutex:read" or "rwmutex:write").

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/history"
)

// rwAcquire returns the RLock ("read") or Lock ("write") of the world's
// read-write lock through rc, for owner name.
func rwAcquire(rc rueidis.Client, mode string, ttl time.Duration, name string) (func(context.Context) (*distlock.Guard, error), error) {
	rw, err := distlock.NewRWMutex(rc, "safety", distlock.WithTTL(ttl), distlock.WithOwner(name))
	if err != nil {
		return nil, err
	}
	if mode == "read" {
		return rw.RLock, nil
	}
	return rw.Lock, nil
}

// newRW returns a contender of the world's read-write lock in mode whose
// wire records arrival order.
func (w *world) newRW(name, mode string) *contender {
	w.t.Helper()
	c := w.newContender(name, func(rc rueidis.Client, name string) func(context.Context) (*distlock.Guard, error) {
		acquire, err := rwAcquire(rc, mode, w.ttl, name)
		require.NoError(w.t, err)
		return acquire
	})
	c.c.mode = mode
	c.wire.ordered = true
	return c
}

// rwConfig is the history.Config of a world whose key is a read-write lock.
func (w *world) rwConfig() history.Config { return history.Config{RW: map[string]bool{w.key: true}} }

// waitLine waits until n stand in the world's line.
func (w *world) waitLine(t *testing.T, n int) {
	t.Helper()
	w.waitFor(t, eventually, "the line", func() bool { return w.lineLength() == n })
}

// writerAndReaders has a contender "a" take the world's lock for writing,
// then readers "r1" and "r2" stand in line, in that order.
func (w *world) writerAndReaders(t *testing.T) (a *contender, ha *holding, readers []*waiter) {
	t.Helper()
	a = w.newRW("a", "write")
	ha, err := a.take(t.Context())
	require.NoError(t, err)
	for i, name := range []string{"r1", "r2"} {
		readers = append(readers, w.newRW(name, "read").takeInBackground(t.Context()))
		w.waitLine(t, i+1)
	}
	return a, ha, readers
}

// notGot checks that wt has not acquired.
func notGot(t *testing.T, wt *waiter, what string) {
	t.Helper()
	select {
	case h := <-wt.got:
		t.Fatalf("%s acquired (token %d)", what, h.token)
	default:
	}
}

// TestSafetyRWHolderPaused: a helper process holds the lock, for reading
// beside an in-process reader or for writing, with a writer and readers
// in line (arrival order: the helper's writer is followed by two readers,
// its reader by a writer then a reader). The helper is stopped (SIGSTOP)
// past its lease, or killed: the first in line gets the lock only once the
// helper's lease can have expired (a killed one's, within a bound widened
// by the scheduling delay), the reader behind a writer only after that
// writer, and the stopped helper's first State after the resume says
// Lost.
func TestSafetyRWHolderPaused(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"read", "write"} {
		for _, kill := range []bool{false, true} {
			name := map[string]string{"read": "reader-", "write": "writer-"}[mode] + map[bool]string{false: "stopped", true: "killed"}[kill]
			subtest(t, name, 1, func(t *testing.T) {
				w := newWorld(t, permitTTL)
				child, granted := w.startPermitHelper("c", "rwmutex:"+mode)
				var held []*holding
				if mode == "read" {
					h, err := w.newRW("r0", "read").take(t.Context())
					require.NoError(t, err)
					held = append(held, h)
				}
				// The line: for a reader, a writer then a reader; for a
				// writer, two readers (one run) then a writer.
				modes := map[string][]string{"read": {"write", "read"}, "write": {"read", "read", "write"}}[mode]
				var waits []*waiter
				for i, m := range modes {
					waits = append(waits, w.newRW("w"+string(rune('1'+i)), m).takeInBackground(t.Context()))
					w.waitLine(t, i+1)
				}
				w.waitFor(t, 2*w.ttl, "a renewal by the helper", func() bool { return child.confirmations() >= 2 })
				for _, h := range held {
					w.releaseHeld(t, h)
				}
				first, at, expiry := faultHelper(t, child, kill, waits[0], "the first in line never acquired")
				assert.GreaterOrEqual(t, history.At(first.granted), expiry, "granted before the helper's lease could expire")
				assert.Greater(t, first.token, granted.Token)
				if kill {
					late := w.delayed(monoTime(expiry), first.granted)
					assert.Less(t, history.At(first.granted).Sub(expiry), slack+late,
						"granted long after the lease expired (%v explained by scheduling)", late)
				}
				got := []*holding{first}
				if mode == "write" {
					second := <-waits[1].got // the run of readers
					require.NotNil(t, second)
					got = append(got, second)
					for _, h := range got {
						// Each says Acquired now, with the other granted.
						assert.Equal(t, distlock.Acquired, h.sample(), "a reader of the run")
					}
				}
				last := waits[len(got)]
				notGot(t, last, "the next in line, with "+modes[0]+"s holding")
				if !kill {
					resumeAndStop(t, child, "the helper")
				}
				for _, h := range got {
					w.releaseHeld(t, h)
				}
				h := <-last.got
				require.NotNil(t, h, "the last in line never acquired")
				w.releaseHeld(t, h)
				r := w.checkWith(label("rw-7", name), w.rwConfig())
				if mode == "write" {
					assert.Equal(t, 2, r.Readers, "the run of readers did not share the lock")
				}
				figure(t, label("rw-7", name), "first_after_expiry_ms", history.At(first.granted).Sub(expiry),
					"first_after_fault_ms", history.At(first.granted).Sub(at))
			})
		}
	}
}

// TestSafetyRWDowngradedWriterPartition: a writer downgrades, which grants
// the two readers in line at once (a writer waits behind them), and is then
// cut off (blackhole both ways) for longer than the TTL. It reports Lost
// by its deadline, before Redis can expire its read lease; the writer gets
// the lock only after that expiry and after the readers' releases, with a
// larger token; after the heal the old holder stays Lost, and its Release
// leaves the writer alone.
func TestSafetyRWDowngradedWriterPartition(t *testing.T) {
	t.Parallel()
	repeat(t, runs(t, 1), func(t *testing.T) {
		w := newWorld(t, permitTTL)
		a, ha, readers := w.writerAndReaders(t)
		x := w.newRW("x", "write").takeInBackground(t.Context())
		w.waitLine(t, 3)

		downAt := history.Now()
		require.NoError(t, ha.g.Downgrade(t.Context()))
		w.rec.Add(history.Op{Kind: history.Downgraded, At: downAt, Key: w.key, Client: a.name, Token: ha.token})
		var hr []*holding
		for _, wt := range readers {
			h := <-wt.got
			require.NotNil(t, h, "a reader at the head was not granted at the downgrade")
			hr = append(hr, h)
		}
		for _, h := range append([]*holding{ha}, hr...) {
			// Each says Acquired now, with the others granted.
			assert.Equal(t, distlock.Acquired, h.sample(), "%s after the downgrade", h.c.name)
		}
		a.waitRenewals(t, ha, 1)

		l := a.cutOff(t, ha)
		for _, h := range hr {
			w.releaseHeld(t, h)
		}
		hx := <-x.got
		require.NotNil(t, hx, "x never acquired")
		assert.False(t, hx.granted.Before(ha.expiry(l)), "x acquired %v before a's lease could expire",
			ha.expiry(l).Sub(hx.granted))
		assert.Greater(t, hx.token, max(hr[0].token, hr[1].token))

		a.heal(t, ha)
		assert.Zero(t, ha.regainCount(), "a regained a lease that x holds")
		ha.mustRelease(t, distlock.Lost)
		assert.Equal(t, distlock.Acquired, hx.g.State(), "x after a's release")
		w.releaseHeld(t, hx)
		r := w.checkWith("rw-2", w.rwConfig())
		assert.Equal(t, 3, r.Readers, "the downgraded writer and the two readers did not share the lock")
		figure(t, "rw-2", "lost_lead_ms", ha.lead(l), "x_after_expiry_ms", hx.granted.Sub(ha.expiry(l)))
	})
}

// TestSafetyRWRedisRestarted: Redis is killed while a writer holds the
// lock and two readers wait, and restarted without persistence once the
// writer has reported Lost (by its deadline). The readers then share the
// lock, with tokens above the writer's (they come from the server clock),
// and no writer reports Acquired with anyone.
func TestSafetyRWRedisRestarted(t *testing.T) {
	t.Parallel()
	repeat(t, runs(t, 1), func(t *testing.T) {
		w := newWorld(t, permitTTL)
		a, ha, waits := w.writerAndReaders(t)
		a.waitRenewals(t, ha, 1)
		killed := time.Now()
		w.srv.Kill()
		l := ha.waitLost(t, w.ttl+slack)
		a.lostInTime(t, ha, l)
		w.srv.Restart()
		restarted := time.Now()
		var got []*holding
		for i, wt := range waits {
			h := <-wt.got
			require.NotNil(t, h, "r%d never acquired", i+1)
			assert.Greater(t, h.token, ha.token, "a token went back after the restart")
			got = append(got, h)
		}
		for _, h := range got {
			assert.Equal(t, distlock.Acquired, h.sample(), "%s with the other reader granted", h.c.name)
		}
		ha.mustRelease(t, distlock.Lost)
		for _, h := range got {
			w.releaseHeld(t, h)
		}
		r := w.checkWith("rw-8", w.rwConfig())
		assert.Equal(t, 2, r.Readers)
		figure(t, "rw-8", "down_ms", restarted.Sub(killed),
			"r1_after_restart_ms", got[0].granted.Sub(restarted), "r2_after_restart_ms", got[1].granted.Sub(restarted))
	})
}

// TestSafetyRWWriterPartition: the writer is cut off (blackhole both ways)
// with two readers in line. It reports Lost by its deadline, before Redis
// can expire its lease; the readers get the lock together only after that
// expiry, with larger tokens; after the heal the old writer stays Lost and
// its Release leaves the readers alone.
func TestSafetyRWWriterPartition(t *testing.T) {
	t.Parallel()
	repeat(t, runs(t, 1), func(t *testing.T) {
		w := newWorld(t, permitTTL)
		a, ha, readers := w.writerAndReaders(t)
		a.waitRenewals(t, ha, 1)
		l := a.cutOff(t, ha)
		var hr []*holding
		for _, wt := range readers {
			h := <-wt.got
			require.NotNil(t, h, "a reader never acquired")
			assert.False(t, h.granted.Before(ha.expiry(l)), "%s acquired %v before the writer's lease could expire",
				h.c.name, ha.expiry(l).Sub(h.granted))
			assert.Greater(t, h.token, ha.token)
			hr = append(hr, h)
		}
		for _, h := range hr {
			assert.Equal(t, distlock.Acquired, h.sample(), "%s with the other reader granted", h.c.name)
		}
		a.heal(t, ha)
		assert.Zero(t, ha.regainCount(), "the writer regained a lease the readers hold")
		ha.mustRelease(t, distlock.Lost)
		for _, h := range hr {
			w.releaseHeld(t, h)
		}
		r := w.checkWith("rw-2w", w.rwConfig())
		assert.Equal(t, 2, r.Readers)
		figure(t, "rw-2w", "lost_lead_ms", ha.lead(l), "r1_after_expiry_ms", hr[0].granted.Sub(ha.expiry(l)))
	})
}
