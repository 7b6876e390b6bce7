package distlock_test

// The fault-injection suite: the scenarios of SAFETY.md, each against real
// redis-server processes, each checked with history.Check. Every test logs
// its figures as "SAFETY scenario=..." lines (see figure); run
// scripts/safety-figures to collect them, and set DISTLOCK_SOAK=N to run
// every case N times.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/history"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// TestSafety01Contention: many clients acquire, increment the fenced counter
// and release in a loop. Each client has two workers, which queue for the
// lock locally and get it handed over; one client polls instead of waiting
// for release announcements. No two hold at once, tokens increase, and no
// increment is lost or refused.
func TestSafety01Contention(t *testing.T) {
	t.Parallel()
	const clients, workers = 4, 2
	w := newWorld(t, safetyTTL)
	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(runs(t, 1))*2*time.Second)
	defer cancel()
	var (
		wg        sync.WaitGroup
		accepted  atomic.Int64
		lockFails atomic.Int64
		all       []*client
	)
	start := time.Now()
	for i := range clients {
		var opts []distlock.Option
		if i == 0 {
			opts = append(opts, distlock.WithRetryInterval(2*time.Millisecond)) // polls
		}
		c := w.newClient(fmt.Sprintf("c%d", i), opts...)
		all = append(all, c)
		for range workers {
			wg.Go(func() {
				for ctx.Err() == nil {
					h, err := c.lock(ctx)
					if err != nil {
						if ctx.Err() == nil {
							lockFails.Add(1)
							t.Errorf("%s: Lock: %v", c.name, err)
						}
						return
					}
					for range 2 {
						if h.increment() {
							accepted.Add(1)
						}
						time.Sleep(time.Millisecond)
						h.sample()
					}
					left, start := time.Until(h.g.Deadline()), time.Now()
					if _, err := h.release(); err != nil {
						// The final delete gives up when the lease ends (a
						// passed lease's deadline is its claim window): a
						// process kept from running for longer than the lease
						// had left cannot send it, or read its answer, in time.
						// No breach: the lease expires on its own, and
						// requireClean checks the history for overlaps.
						if late := w.delayed(start, time.Now()); late >= left {
							t.Logf("%s: Release: %v, with %v of the lease left when it began and a scheduling delay of %v meanwhile: the machine's doing",
								c.name, err, left.Round(time.Millisecond), late.Round(time.Millisecond))
						} else {
							t.Errorf("%s: Release: %v, with %v of the lease left when it began and a scheduling delay of only %v meanwhile",
								c.name, err, left.Round(time.Millisecond), late.Round(time.Millisecond))
						}
					}
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	r := w.requireClean("1")
	assert.Zero(t, r.Refused, "a counter call refused without any fault: tokens of two holders interleaved")
	assert.Equal(t, int(accepted.Load()), r.Writes)
	assert.Equal(t, int64(r.Writes), w.counter.Value())
	assert.Greater(t, r.Acquisitions, clients*workers, "too few acquisitions to mean anything")
	passes := 0
	for _, c := range all {
		passes += len(c.wire.find(func(c wireCall) bool { return c.kind == releaseCall && c.passed != "" }))
	}
	assert.Positive(t, passes, "no release passed the lock to a waiter in line")
	figure(t, "1", "clients", clients, "workers", clients*workers, "acquisitions", r.Acquisitions,
		"increments", r.Writes, "passes", passes, "duration_ms", elapsed, "lock_errors", lockFails.Load())
}

// TestSafety02PartitionLongerThanTTL: the holder is cut off (both directions
// dropped) for longer than the TTL. It reports Lost by its deadline, before
// Redis can expire the key; another client acquires only after that, with a
// larger token; after the partition heals the old holder stays Lost, its
// fenced write is refused, and its Release leaves the new holder's key
// alone.
func TestSafety02PartitionLongerThanTTL(t *testing.T) {
	t.Parallel()
	repeat(t, runs(t, 3), func(t *testing.T) {
		w, a, b, ha := pair(t, safetyTTL)
		require.True(t, ha.increment())
		bw := b.lockInBackground(t.Context())
		ha.waitRenewals(t, 1)

		a.proxy.SetBoth(faultproxy.Blackhole)
		l := ha.waitLost(t, w.ttl+slack)
		assert.Equal(t, distlock.LostDeadline, l.reason, "reason: %v", l.err)
		lostBeforeExpiry(t, ha, l)

		hb := <-bw.got
		require.NotNil(t, hb, "b never acquired")
		assert.False(t, hb.granted.Before(ha.expiry(l)), "b acquired %v before a's lease could expire",
			ha.expiry(l).Sub(hb.granted))
		assert.Greater(t, hb.token, ha.token)
		require.True(t, hb.increment())

		a.proxy.Heal()
		healed := time.Now()
		w.waitFor(t, w.ttl+eventually, "a refused renewal of a after the heal", func() bool {
			for _, c := range a.wire.callsSince(ha.token, healed) {
				if c.kind == renewCall && c.done && c.err == nil && !c.ok {
					return true
				}
			}
			return false
		})
		assert.Equal(t, distlock.Lost, ha.g.State(), "a after the heal")
		assert.Equal(t, 0, ha.regainCount(), "a regained a lease that b holds")
		assert.False(t, ha.increment(), "a's stale write was accepted")
		ha.mustRelease(t, distlock.Lost)
		v, ok := w.leaseValue()
		require.True(t, ok, "a's release deleted b's key")
		assert.True(t, strings.HasPrefix(v, "b#"), "lease value %q after a's release", v)
		assert.Equal(t, distlock.Acquired, hb.g.State())
		hb.mustRelease(t, distlock.Released)

		r := w.requireClean("2")
		assert.Equal(t, 1, r.Refused)
		figure(t, "2", "lost_lead_ms", ha.lead(l), "lost_lead_wire_ms", wireLead(t, ha, l),
			"lost_seen_lead_ms", ha.expiry(l).Sub(l.seen), "b_after_expiry_ms", hb.granted.Sub(ha.expiry(l)),
			"b_lock_errors", bw.failed)
	})
}

// lostBeforeExpiry checks the loss against L1: its deadline is counted
// from no later than the send of the last confirmed write as the wire saw
// it (so a deadline counted from the reply, or from any time after the
// send, fails here), and the Lost event came at the deadline D, before
// t_s + T, as the library counts it and as the wire does. The event comes
// from the guard's actor, which may run late on a busy machine: it may come
// later by what the scheduling delay then explains. (State does not wait
// for the actor: it reports Lost from D on, which the history checks.)
func lostBeforeExpiry(t *testing.T, h *holding, l loss) {
	t.Helper()
	sent, ok := h.c.wire.lastConfirmBefore(h.token, l.at)
	require.True(t, ok, "no confirmed write of %s before its loss", h.c.name)
	assert.False(t, h.expiry(l).After(sent.Add(h.c.w.ttl)),
		"the guard's deadline is counted from %v after the send of its last confirmed write",
		h.expiry(l).Sub(sent.Add(h.c.w.ttl)))
	late := h.c.w.delayed(l.deadline, l.at)
	assert.True(t, l.at.Before(h.expiry(l).Add(late)), "Lost %v after t_s+T, of which %v is explained by scheduling",
		l.at.Sub(h.expiry(l)), late)
	assert.True(t, l.at.Before(sent.Add(h.c.w.ttl).Add(late)),
		"Lost %v after the wire's t_s+T, of which %v is explained by scheduling", l.at.Sub(sent.Add(h.c.w.ttl)), late)
}

// wireLead returns how long before t_s + T, with t_s as the wire saw it,
// the loss was reported.
func wireLead(t *testing.T, h *holding, l loss) time.Duration {
	t.Helper()
	sent, ok := h.c.wire.lastConfirmBefore(h.token, l.at)
	require.True(t, ok)
	return sent.Add(h.c.w.ttl).Sub(l.at)
}

// TestSafety03ShortPartition: the holder is cut off (both directions, or
// only Redis's replies) while a renewal is in flight. A cut shorter than
// what the deadline leaves costs nothing (L1b): the failed renewal is
// reported and retried, the guard stays Acquired and its context alive. A
// cut that holds the replies past the deadline makes the guard Lost by D;
// once the path is back, a renewal proves the key is still its own and it
// is Acquired again. Nobody else acquires, and the token does not change.
func TestSafety03ShortPartition(t *testing.T) {
	t.Parallel()
	ttl := safetyTTL
	cases := []struct {
		name string
		cut  func(p *faultproxy.Proxy)
		heal func(p *faultproxy.Proxy)
		// hold is how long the cut lasts once a renewal is caught in it;
		// 0 means until the guard has reported Lost.
		hold time.Duration
	}{
		{"both directions dropped",
			func(p *faultproxy.Proxy) { p.SetBoth(faultproxy.Blackhole) }, (*faultproxy.Proxy).Heal,
			ttl / 10},
		{"replies dropped",
			func(p *faultproxy.Proxy) { p.Set(faultproxy.Down, faultproxy.Blackhole) }, (*faultproxy.Proxy).Heal,
			ttl / 10},
		{"replies held past the deadline",
			func(p *faultproxy.Proxy) { p.Set(faultproxy.Down, faultproxy.Pause) },
			func(p *faultproxy.Proxy) { p.Set(faultproxy.Down, faultproxy.Pass) },
			0},
	}
	for _, tc := range cases {
		subtest(t, tc.name, 1, func(t *testing.T) {
			w, a, b, ha := pair(t, ttl)
			bw := b.lockInBackground(t.Context())
			ha.waitRenewals(t, 1)

			tc.cut(a.proxy)
			cut := time.Now()
			w.waitFor(t, ttl, "a renewal caught in the cut", a.wire.renewalInFlight)
			if tc.hold > 0 {
				deadline := distlock.LeaseDeadline(ha.g)
				time.Sleep(tc.hold)
				tc.heal(a.proxy) // resets the connections: the renewal in flight fails
				healed := time.Now()
				w.waitFor(t, ttl, "a renewal confirmed after the heal", func() bool {
					return distlock.LeaseDeadline(ha.g).After(deadline)
				})
				renewed := time.Now()
				assert.Zero(t, ha.lossCount(), "a cut shorter than the deadline lost the lease")
				assert.NoError(t, ha.g.Context().Err(), "the guard's context must live through the cut")
				assert.Equal(t, distlock.Acquired, ha.g.State())
				assert.NotEmpty(t, ha.renewFailuresSince(cut), "the failed renewal was not reported")
				assert.True(t, ha.increment(), "the holder's write was refused")
				hb := bw.stop()
				assert.Nil(t, hb, "b acquired while a's lease was alive")
				ha.mustRelease(t, distlock.Released)
				w.requireClean(label("3", slug(tc.name)))
				figure(t, label("3", slug(tc.name)), "renewed_after_heal_ms", renewed.Sub(healed),
					"failures_reported", len(ha.renewFailuresSince(cut)), "losses", ha.lossCount(), "b_acquired", hb != nil)
				return
			}
			l := ha.waitLost(t, ttl+slack)
			tc.heal(a.proxy)
			healed := time.Now()
			assert.Equal(t, distlock.LostDeadline, l.reason, "reason: %v", l.err)
			lostBeforeExpiry(t, ha, l)
			assert.False(t, l.at.Before(l.deadline), "Lost %v before its deadline", l.deadline.Sub(l.at))
			w.waitFor(t, ttl, "a regains its lease", func() bool {
				return ha.regainCount() > 0 && ha.g.State() == distlock.Acquired
			})
			regained := time.Now()
			assert.Equal(t, ha.token, ha.g.Token())
			assert.ErrorIs(t, context.Cause(ha.g.Context()), distlock.ErrLost, "the context stays cancelled")
			assert.True(t, ha.increment(), "the regained holder's write was refused")

			hb := bw.stop()
			assert.Nil(t, hb, "b acquired while a's lease was alive")
			ha.mustRelease(t, distlock.Released)
			w.requireClean(label("3", slug(tc.name)))
			figure(t, label("3", slug(tc.name)),
				"lost_after_cut_ms", l.at.Sub(cut), "lost_lead_ms", ha.lead(l),
				"regained_after_heal_ms", regained.Sub(healed), "losses", ha.lossCount(), "b_acquired", hb != nil)
		})
	}
}

// TestSafety04ResetAndClosedPort: the holder's connections are reset while
// a renewal is in flight, or its Redis port is closed. The failure is
// reported at once and the renewal retried with back-off (L1b): a reset
// that heals keeps the guard Acquired; a port that stays closed makes it
// Lost by its deadline, not before, with a handful of retries rather than a
// storm; once the port is back it regains the lease. A storm of resets,
// with another client contending, breaks nothing, and nothing panics or
// leaks.
func TestSafety04ResetAndClosedPort(t *testing.T) {
	t.Parallel()
	ttl := safetyTTL
	subtest(t, "reset during a renewal", 1, func(t *testing.T) {
		w := newWorld(t, ttl)
		a := w.newClient("a")
		ha, err := a.lock(t.Context())
		require.NoError(t, err)
		ha.waitRenewals(t, 1)
		a.proxy.Set(faultproxy.Up, faultproxy.Pause) // hold the next renewal in the proxy
		w.waitFor(t, ttl, "a renewal in flight", a.wire.renewalInFlight)
		deadline := distlock.LeaseDeadline(ha.g)
		reset := time.Now()
		a.proxy.Heal() // resets every connection
		w.waitFor(t, ttl, "the failure reported", func() bool { return len(ha.renewFailuresSince(reset)) > 0 })
		reported := ha.renewFailuresSince(reset)[0]
		late := w.delayed(reset, reported)
		assert.Less(t, reported.Sub(reset), slack+late,
			"the failed renewal was reported %v after the reset (%v explained by scheduling)", reported.Sub(reset), late)
		w.waitFor(t, ttl, "a renewal confirmed after the reset", func() bool {
			return distlock.LeaseDeadline(ha.g).After(deadline)
		})
		renewed := time.Now()
		assert.Zero(t, ha.lossCount(), "a reset lost the lease")
		assert.NoError(t, ha.g.Context().Err(), "the guard's context must live through a reset")
		ha.mustRelease(t, distlock.Released)
		w.requireClean(label("4", "reset"))
		figure(t, label("4", "reset"), "reported_after_reset_ms", reported.Sub(reset),
			"renewed_after_reset_ms", renewed.Sub(reset), "losses", ha.lossCount())
	})
	subtest(t, "port closed briefly", 1, func(t *testing.T) {
		// The blip of a proxy restart or a failover: the port is closed
		// (dials refused, connections reset) for 300 ms around a renewal,
		// with most of the lease left.
		w, a, b, ha := pair(t, ttl)
		bw := b.lockInBackground(t.Context())
		ha.waitRenewals(t, 1)
		deadline := distlock.LeaseDeadline(ha.g)
		// Close the port shortly before the next renewal is due.
		due := deadline.Add(-ttl + distlock.Margin(ttl) + ttl/3)
		time.Sleep(time.Until(due.Add(-100 * time.Millisecond)))
		refused := time.Now()
		a.proxy.Refuse()
		time.Sleep(300 * time.Millisecond)
		a.proxy.Heal()
		healed := time.Now()
		w.waitFor(t, ttl, "a renewal confirmed after the port reopened", func() bool {
			return distlock.LeaseDeadline(ha.g).After(deadline)
		})
		renewed := time.Now()
		assert.Zero(t, ha.lossCount(), "300 ms of a closed port lost a lease that had %v left", deadline.Sub(refused))
		assert.NoError(t, ha.g.Context().Err(), "the guard's context must live through the blip")
		failures := ha.renewFailuresSince(refused)
		if len(failures) == 0 {
			// The scenario needs the renewal due 100 ms after the close to
			// be sent while the port is closed. A renewal may go a
			// twentieth of its period early (to share a batch).
			if sent := due.Add(-ttl / 3 / 20); !refused.Before(sent) {
				require.NoError(t, history.Check(w.rec.Ops()).Err())
				t.Skipf("no renewal failed, but the port closed %v after the renewal could be sent (the sleep overslept by %v): "+
					"it went out before the close", refused.Sub(sent), refused.Sub(due.Add(-100*time.Millisecond)))
			}
			w.skipIfStarved(t, due, healed.Sub(due), fmt.Sprintf("no renewal failed: the renewal due %v after the port closed "+
				"was not sent before it reopened, %v after it was due", due.Sub(refused), healed.Sub(due)))
		}
		assert.NotEmpty(t, failures, "the failed renewals were not reported (closed %v before the renewal was due, reopened %v after; renewed %v after the reopening)",
			due.Sub(refused), healed.Sub(due), renewed.Sub(healed))
		assert.Nil(t, bw.stop(), "b acquired while a's lease was alive")
		ha.mustRelease(t, distlock.Released)
		w.requireClean(label("4", "port-closed-briefly"))
		figure(t, label("4", "port-closed-briefly"), "renewed_after_reopen_ms", renewed.Sub(healed),
			"failures_reported", len(failures), "losses", ha.lossCount())
	})
	subtest(t, "release while the port is closed briefly", 1, func(t *testing.T) {
		// Release during a 300 ms blip, with a long lease left: the delete
		// is retried within Release's bound, Release reports Released with
		// no error, and the waiter gets the lock at the heal, not at the
		// end of the lease.
		const long = 3 * time.Second
		w, a, b, ha := pair(t, long)
		bw := b.lockInBackground(t.Context())
		w.waitFor(t, long, "b in line", func() bool { return w.lineLength() == 1 })
		a.proxy.Refuse()
		healAt := time.Now().Add(300 * time.Millisecond)
		healed := make(chan time.Time, 1)
		go func() {
			time.Sleep(time.Until(healAt))
			a.proxy.Heal()
			healed <- time.Now()
		}()
		start := time.Now()
		st, err := ha.releaseWith(context.WithoutCancel(t.Context()))
		took := time.Since(start)
		heal := <-healed
		require.NoError(t, err, "Release during a blip")
		assert.Equal(t, distlock.Released, st)
		assert.Less(t, took, distlock.ReleaseTimeout, "Release waited past its bound")
		hb := <-bw.got
		require.NotNil(t, hb, "b never acquired")
		afterHeal := hb.granted.Sub(heal)
		assert.Less(t, afterHeal, long/3, "b got the lock %v after the heal: the release was not retried", afterHeal)
		hb.mustRelease(t, distlock.Released)
		w.requireClean(label("4", "release-port-closed-briefly"))
		figure(t, label("4", "release-port-closed-briefly"), "release_ms", took, "b_after_heal_ms", afterHeal)
	})
	subtest(t, "port closed", 1, func(t *testing.T) {
		w, a, b, ha := pair(t, ttl)
		bw := b.lockInBackground(t.Context())
		ha.waitRenewals(t, 1)
		refused := time.Now()
		a.proxy.Refuse()
		l := ha.waitLost(t, ttl)
		assert.Equal(t, distlock.LostRenewFailed, l.reason, "reason: %v", l.err)
		lostBeforeExpiry(t, ha, l)
		assert.False(t, l.at.Before(l.deadline), "Lost %v before its deadline, with the lease still good", l.deadline.Sub(l.at))
		failures := ha.renewFailuresSince(refused)
		require.NotEmpty(t, failures, "the failed renewals were not reported")
		// The next renewal, due a third of the TTL after the last one,
		// fails as soon as it is tried; its retries back off up to TTL/9
		// apart until the deadline: a handful, not a storm.
		late := w.delayed(refused, failures[0])
		assert.Less(t, failures[0].Sub(refused), ttl/3+slack+late, "the first failure came late")
		assert.LessOrEqual(t, len(failures), 20, "a storm of retries: %d before the deadline", len(failures))

		// The lease expires in Redis; b, waiting, takes it; a, cut off,
		// stays Lost, and once the port is back its release leaves b's
		// lease alone.
		hb := <-bw.got
		require.NotNil(t, hb, "b never acquired")
		assert.False(t, hb.granted.Before(ha.expiry(l)), "b acquired %v before a's lease could expire",
			ha.expiry(l).Sub(hb.granted))
		assert.Greater(t, hb.token, ha.token)
		a.proxy.Heal()
		ha.mustRelease(t, distlock.Lost)
		v, ok := w.leaseValue()
		require.True(t, ok, "a's release deleted b's key")
		assert.True(t, strings.HasPrefix(v, "b#"), "lease value %q after a's release", v)
		hb.mustRelease(t, distlock.Released)
		w.requireClean(label("4", "port-closed"))
		figure(t, label("4", "port-closed"), "lost_lead_ms", ha.lead(l), "lost_after_deadline_ms", l.at.Sub(l.deadline),
			"retries_before_deadline", len(failures), "b_after_expiry_ms", hb.granted.Sub(ha.expiry(l)))
	})
	subtest(t, "reset storm", 1, func(t *testing.T) {
		w, a, b, ha := pair(t, ttl)
		bw := b.lockInBackground(t.Context())
		storm := time.Now()
		for time.Since(storm) < ttl+ttl/2 {
			a.proxy.Reset()
			ha.increment()
			time.Sleep(20 * time.Millisecond)
		}
		// However the renewals fared, the path is clean now: a either
		// still holds (and keeps holding) or has lost for good to b.
		hb := bw.stop()
		if hb != nil {
			hb.mustRelease(t, distlock.Released)
		}
		_, err := ha.release()
		require.NoError(t, err)
		w.requireClean(label("4", "reset-storm"))
		figure(t, label("4", "reset-storm"), "losses", ha.lossCount(), "regains", ha.regainCount(),
			"failures_reported", len(ha.renewFailuresSince(storm)), "b_acquired", hb != nil)
	})
}

// TestSafety05RedisStopped: Redis is stopped (SIGSTOP) for twice the TTL.
// The holder reports Lost by its deadline although its renewal is still in
// flight; another client acquires only after Redis resumes and the old
// lease has expired; the old holder stays Lost and its fenced write is
// refused.
func TestSafety05RedisStopped(t *testing.T) {
	t.Parallel()
	repeat(t, runs(t, 3), func(t *testing.T) {
		w, _, b, ha := pair(t, safetyTTL)
		require.True(t, ha.increment())
		bw := b.lockInBackground(t.Context())
		ha.waitRenewals(t, 1)

		w.srv.Pause()
		paused := time.Now()
		l := ha.waitLost(t, w.ttl+slack)
		assert.Equal(t, distlock.LostDeadline, l.reason, "reason: %v", l.err)
		lostBeforeExpiry(t, ha, l)
		time.Sleep(time.Until(paused.Add(2 * w.ttl)))
		// Read before the signal: Redis may answer b before this goroutine
		// runs again.
		resumed := time.Now()
		w.srv.Resume()
		// b's own attempts made while Redis was stopped may have left an
		// orphan (their clean-up is best effort): it is seen here.
		v, _ := w.leaseValue()
		ownOrphan := strings.HasPrefix(v, "b#")

		hb := <-bw.got
		require.NotNil(t, hb, "b never acquired")
		assert.True(t, hb.granted.After(resumed), "b acquired while Redis was stopped")
		assert.Greater(t, hb.token, ha.token)
		require.True(t, hb.increment())
		assert.Equal(t, distlock.Lost, ha.g.State())
		assert.False(t, ha.increment(), "a's stale write was accepted")
		ha.mustRelease(t, distlock.Lost)
		assert.Equal(t, distlock.Acquired, hb.g.State())
		hb.mustRelease(t, distlock.Released)
		r := w.requireClean("5")
		assert.Equal(t, 1, r.Refused)
		figure(t, "5", "lost_lead_ms", ha.lead(l), "lost_lead_wire_ms", wireLead(t, ha, l),
			"lost_after_stop_ms", l.at.Sub(paused), "b_after_resume_ms", hb.granted.Sub(resumed),
			"b_lock_errors", bw.failed, "b_own_orphan", ownOrphan)
	})
}

// TestSafety06RedisStoppedBriefly: Redis is stopped for a quarter of the
// TTL, three times, at different points of the renewal cycle. Nobody else
// acquires; the holder still holds at the end (it may flap to Lost and
// back if a stop straddles its deadline).
func TestSafety06RedisStoppedBriefly(t *testing.T) {
	t.Parallel()
	repeat(t, runs(t, 1), func(t *testing.T) {
		ttl := safetyTTL
		w, a, b, ha := pair(t, ttl)
		started := time.Now()
		bw := b.lockInBackground(t.Context())
		for i, phase := range []time.Duration{ttl / 10, ttl * 3 / 10, ttl * 6 / 10} {
			ha.waitRenewals(t, i+1)
			time.Sleep(phase)
			w.srv.Pause()
			time.Sleep(ttl / 4)
			w.srv.Resume()
		}
		ha.waitRenewals(t, 4)
		if st := ha.g.State(); st != distlock.Acquired {
			w.skipIfStarved(t, started, renewalBudget(ttl)-ttl/4, fmt.Sprintf("a was %v after the stops", st))
			t.Errorf("a was %v after the stops, want %v", st, distlock.Acquired)
		}
		assert.True(t, ha.increment())
		if bw.stop() != nil {
			w.skipIfStarved(t, started, renewalBudget(ttl)-ttl/4, "b acquired")
			t.Error("b acquired while a's lease was alive")
		}
		ha.mustRelease(t, distlock.Released)
		w.requireClean("6")
		var worst time.Duration
		for _, c := range a.wire.renewals(ha.token) {
			worst = max(worst, c.end.Sub(c.start))
		}
		figure(t, "6", "losses", ha.lossCount(), "regains", ha.regainCount(), "worst_renewal_ms", worst)
	})
}

// heldByHelper starts a world whose lock is held by a helper process that
// has written to the counter and renewed its lease, and a client b waiting
// for the lock. It returns the helper's grant.
func heldByHelper(t *testing.T) (*world, *helperHolder, history.Op, *waiter) {
	t.Helper()
	w := newWorld(t, safetyTTL)
	child := w.startHolder()
	granted := child.waitOp("the helper's grant", false, func(op history.Op) bool { return op.Kind == history.Granted })
	child.waitOp("a write by the helper", true, func(op history.Op) bool { return op.Kind == history.Write && op.OK })
	w.waitFor(t, 2*w.ttl, "a renewal by the helper", func() bool { return child.confirmations() >= 2 })
	return w, child, granted, w.newClient("b").lockInBackground(t.Context())
}

// TestSafety07HolderPaused: the holder is a process of its own, stopped with
// SIGSTOP while it holds the lock, for longer than the TTL. Another client
// acquires once the lease has expired and writes under its larger token.
// When the holder resumes, the first State it reads says Lost, and the
// fenced write it goes on to make (it does not check) is refused. A holder
// killed with SIGKILL leaves a lease that frees itself at its expiry, and a
// waiter gets it soon after.
func TestSafety07HolderPaused(t *testing.T) {
	t.Parallel()
	subtest(t, "stopped", 2, func(t *testing.T) {
		w, child, granted, bw := heldByHelper(t)
		child.proc.Pause()
		paused := history.Now()
		hb := <-bw.got
		require.NotNil(t, hb, "b never acquired")
		expiry := child.lastExpiry()
		assert.GreaterOrEqual(t, history.At(hb.granted), expiry, "b acquired before the helper's lease could expire")
		assert.Greater(t, hb.token, granted.Token)
		require.True(t, hb.increment())

		resumed := history.Now()
		child.proc.Resume()
		first := child.waitOp("a State sample after the resume", false, func(op history.Op) bool {
			return op.Kind == history.Sample && op.At >= resumed
		})
		assert.False(t, first.Held, "the first State after the resume said Acquired")
		child.waitOp("a counter call after the resume", true, func(op history.Op) bool { return op.At >= resumed })
		rel := child.release()
		assert.False(t, rel.Held, "the helper's Release said Released, not Lost")

		after := child.find(false, func(op history.Op) bool { return op.Kind == history.Sample && op.At >= resumed })
		for _, s := range after {
			assert.False(t, s.Held, "State said Acquired at %v after the resume", s.At.Sub(resumed))
		}
		calls := child.find(true, func(op history.Op) bool { return op.At >= resumed })
		for _, c := range calls {
			assert.False(t, c.OK, "the helper's %v after the resume was accepted", c)
		}
		v, ok := w.leaseValue()
		if !ok && hb.lossCount() > 0 {
			// b's own lease may have ended under starvation: the history
			// is checked first, and the test skips only if it is clean and
			// the scheduling delay was at least a renewal's budget.
			w.skipIfStarved(t, hb.granted, renewalBudget(w.ttl), "b's lease key is gone after b lost its lease")
		}
		require.True(t, ok, "SAFETY BREACH (L5) unless b's lease lapsed: b's lease key is gone after the helper's release (b's losses: %d)", hb.lossCount())
		assert.True(t, strings.HasPrefix(v, "b#"), "lease value %q", v)
		hb.mustRelease(t, distlock.Released)
		r := w.requireClean(label("7", "stopped"))
		assert.Zero(t, r.Unchecked, "L1 unchecked for some samples")
		figure(t, label("7", "stopped"), "stopped_ms", resumed.Sub(paused),
			"b_after_expiry_ms", history.At(hb.granted).Sub(expiry),
			"first_state_after_resume", map[bool]string{true: "acquired", false: "lost"}[first.Held],
			"samples_after_resume", len(after), "calls_after_resume", len(calls))
	})
	subtest(t, "killed", 1, func(t *testing.T) {
		w, child, _, bw := heldByHelper(t)
		child.proc.Kill()
		killed := history.Now()
		hb := <-bw.got
		require.NotNil(t, hb, "b never acquired")
		expiry := child.lastExpiry()
		assert.GreaterOrEqual(t, history.At(hb.granted), expiry, "b acquired before the dead holder's lease could expire")
		late := w.delayed(monoTime(expiry), hb.granted)
		assert.Less(t, history.At(hb.granted).Sub(expiry), slack+late,
			"b acquired long after the lease expired (%v explained by scheduling)", late)
		hb.mustRelease(t, distlock.Released)
		w.requireClean(label("7", "killed"))
		figure(t, label("7", "killed"), "b_after_kill_ms", history.At(hb.granted).Sub(killed),
			"b_after_expiry_ms", history.At(hb.granted).Sub(expiry))
	})
}

// maxOverlap returns the longest overlap in r, or 0.
func maxOverlap(r history.Report) time.Duration {
	var d time.Duration
	for _, o := range r.Overlaps {
		d = max(d, o.By)
	}
	return d
}

// requireSafeExceptOverlap fails the test on any breach but L2 overlaps,
// which the scenarios outside the deployment requirements (a restart
// without persistence, an operator deleting the key, an eviction, a
// failover) may show: there the fencing token is what protects the data.
func requireSafeExceptOverlap(t *testing.T, r history.Report) {
	t.Helper()
	r.Overlaps = nil
	require.NoError(t, r.Err())
}

// TestSafety08RedisRestarted: Redis is killed (SIGKILL) and restarted
// without persistence, so the lease is gone. The holder reports Lost once
// the server answers again (its client's connection comes back and the
// guard renews at once), and tokens still increase, since they come from
// the server clock. Restarted at once, the server lets another client
// acquire while the old holder still reports Acquired until then (the documented
// reason for persistence or a delayed restart), and fencing refuses the old
// holder's write; restarted after a TTL, nothing overlaps.
func TestSafety08RedisRestarted(t *testing.T) {
	t.Parallel()
	for _, delayed := range []bool{false, true} {
		name := map[bool]string{false: "at once", true: "after a TTL"}[delayed]
		kase := map[bool]string{false: "at-once", true: "delayed"}[delayed]
		subtest(t, name, 1, func(t *testing.T) {
			ttl := safetyTTL
			w, a, b, ha := pair(t, ttl)
			require.True(t, ha.increment())
			ha.waitRenewals(t, 1)
			bw := b.lockInBackground(t.Context())
			killed := time.Now()
			if delayed {
				w.srv.Kill()
				time.Sleep(ttl)
			}
			w.srv.Restart()
			restarted := time.Now()

			l := ha.waitLost(t, ttl)
			if !delayed {
				late := w.delayed(restarted, l.at)
				assert.Less(t, l.at.Sub(restarted), ttl/3+slack+late,
					"Lost long after the restart (%v explained by scheduling)", late)
			}
			lostBeforeExpiry(t, ha, l)
			hb := <-bw.got
			require.NotNil(t, hb, "b never acquired")
			assert.Greater(t, hb.token, ha.token, "token went back after the restart")
			require.True(t, hb.increment())
			assert.False(t, ha.increment(), "a's stale write was accepted")
			w.waitFor(t, ttl, "a refused renewal", func() bool {
				for _, c := range a.wire.renewals(ha.token) {
					if c.err == nil && !c.ok {
						return true
					}
				}
				return false
			})
			ha.mustRelease(t, distlock.Lost)
			hb.mustRelease(t, distlock.Released)

			r := w.check(label("8", kase))
			if delayed {
				require.NoError(t, r.Err())
			} else {
				requireSafeExceptOverlap(t, r)
			}
			figure(t, label("8", kase),
				"lost_after_kill_ms", l.at.Sub(killed), "overlap_ms", maxOverlap(r),
				"overlaps", len(r.Overlaps), "stale_accepted", len(r.Stale), "b_lock_errors", bw.failed)
		})
	}
}

// TestSafety09OperatorTouchesKey: an operator deletes the lease, expires it
// early or overwrites it. The holder reports Lost at its next renewal (a
// third of the TTL at most); a renewal never re-creates the key; the old
// holder's Release leaves an overwritten value alone. Until that renewal a
// new holder may overlap (a waiter that polls, or that tries just then,
// finds the key gone; a queued waiter sleeps until the old lease would have
// ended), and fencing refuses the old holder's write.
func TestSafety09OperatorTouchesKey(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
	}{
		{"deleted", []string{"DEL", "distlock:{safety}"}},
		{"expired early", []string{"PEXPIRE", "distlock:{safety}", "1"}},
		{"overwritten", []string{"SET", "distlock:{safety}", "intruder#1", "PX", "60000"}},
	}
	for _, tc := range cases {
		subtest(t, tc.name, 1, func(t *testing.T) {
			ttl := safetyTTL
			w := newWorld(t, ttl)
			// b polls, so it finds the key gone as soon as it is.
			a, b := w.newClient("a"), w.newClient("b", distlock.WithRetryInterval(waitEvery))
			ha, err := a.lock(t.Context())
			require.NoError(t, err)
			require.True(t, ha.increment())
			ha.waitRenewals(t, 1)
			bw := b.lockInBackground(t.Context())
			w.srv.MustDo(tc.args...)
			// Read once the command is done, not before: MustDo first
			// connects a client of its own, which takes a while on a busy
			// machine.
			acted := time.Now()

			l := ha.waitLost(t, ttl)
			assert.Equal(t, distlock.LostRefused, l.reason, "reason: %v", l.err)
			late := w.delayed(acted, l.at)
			assert.Less(t, l.at.Sub(acted), ttl/3+slack+late,
				"Lost long after the key was touched (%v explained by scheduling)", late)
			var hb *holding
			if tc.name == "overwritten" {
				time.Sleep(ttl / 2) // more renewals: none may touch the intruder's key
				hb = bw.stop()
				assert.Nil(t, hb, "b acquired a key the intruder holds")
				ha.mustRelease(t, distlock.Lost)
				v, _ := w.leaseValue()
				assert.Equal(t, "intruder#1", v, "the old holder's renewals or release touched the intruder's key")
			} else {
				hb = <-bw.got
				require.NotNil(t, hb, "b never acquired the freed lock")
				require.True(t, hb.increment())
				assert.False(t, ha.increment(), "a's stale write was accepted")
				ha.mustRelease(t, distlock.Lost)
				assert.Equal(t, distlock.Acquired, hb.g.State())
				hb.mustRelease(t, distlock.Released)
			}
			r := w.check(label("9", slug(tc.name)))
			requireSafeExceptOverlap(t, r)
			bAfter := time.Duration(0)
			if hb != nil {
				bAfter = hb.granted.Sub(acted)
			}
			figure(t, label("9", slug(tc.name)), "lost_after_action_ms", l.at.Sub(acted),
				"b_after_action_ms", bAfter, "overlap_ms", maxOverlap(r), "overlaps", len(r.Overlaps),
				"stale_accepted", len(r.Stale))
		})
	}
}

// TestSafety10SlowReplies: the holder's replies are delayed. Its deadline is
// counted from the send time of each renewal, not from the reply, so when
// its requests are then cut off it reports Lost before the server-side
// expiry. With replies slower than the lease itself, no renewal ever counts:
// the holder reports Lost and stays Lost, and if its renewals still reach
// Redis nobody else gets the lock until it releases.
func TestSafety10SlowReplies(t *testing.T) {
	t.Parallel()
	ttl := safetyTTL
	subtest(t, "delayed a third of the TTL", 3, func(t *testing.T) {
		w, a, b, ha := pair(t, ttl)
		require.True(t, ha.increment())
		ha.waitRenewals(t, 1) // the server has the renewal script: one round trip per renewal
		delay := ttl * 3 / 10
		a.proxy.SetDelay(faultproxy.Down, delay)
		a.proxy.Set(faultproxy.Down, faultproxy.Delay)
		slowFrom := time.Now()
		ha.waitRenewals(t, 3)
		if st := ha.g.State(); st != distlock.Acquired {
			w.skipIfStarved(t, slowFrom, renewalBudget(ttl)-delay, fmt.Sprintf("a was %v after slow replies", st))
			t.Fatalf("slow but timely replies must keep the lease: a was %v", st)
		}
		for _, c := range a.wire.renewals(ha.token) {
			// A call that ended without an answer (its deadline passed
			// first, on a machine that starved the guard) proves nothing
			// about the delay; one that Redis answered must have waited
			// for it.
			if c.start.After(slowFrom) && c.done && c.err == nil {
				assert.GreaterOrEqual(t, c.end.Sub(c.start), delay, "renewal answered faster than the delay (sent %v after the replies slowed, extended: %v)",
					c.start.Sub(slowFrom), c.ok)
			}
		}
		bw := b.lockInBackground(t.Context())
		a.proxy.Set(faultproxy.Up, faultproxy.Blackhole)
		l := ha.waitLost(t, ttl+slack)
		assert.Equal(t, distlock.LostDeadline, l.reason, "reason: %v", l.err)
		lostBeforeExpiry(t, ha, l)
		hb := <-bw.got
		require.NotNil(t, hb)
		assert.False(t, hb.granted.Before(ha.expiry(l)), "b acquired before a's lease could expire")
		require.True(t, hb.increment())
		assert.False(t, ha.increment(), "a's stale write was accepted")
		st, _ := ha.release() // a's path is cut: the delete fails, or finds b's key
		assert.Equal(t, distlock.Lost, st)
		hb.mustRelease(t, distlock.Released)
		w.requireClean(label("10", "delay-0.3T"))
		figure(t, label("10", "delay-0.3T"), "lost_lead_ms", ha.lead(l), "lost_lead_wire_ms", wireLead(t, ha, l),
			"reply_delay_ms", delay)
	})
	subtest(t, "delayed longer than the TTL", 1, func(t *testing.T) {
		w, a, b, ha := pair(t, ttl)
		require.True(t, ha.increment())
		ha.waitRenewals(t, 1)
		a.proxy.SetDelay(faultproxy.Down, ttl+ttl/10)
		a.proxy.Set(faultproxy.Down, faultproxy.Delay)
		l := ha.waitLost(t, ttl+slack)
		assert.Equal(t, distlock.LostDeadline, l.reason, "reason: %v", l.err)
		lostBeforeExpiry(t, ha, l)
		// Whether a's renewals still reach Redis depends on rueidis: it
		// keeps a pipelined connection whose replies are overdue, but it
		// drops one used synchronously, and a new one cannot finish its
		// handshake through the slow path. Either way b may acquire only
		// once a's lease has really expired, which the history checks.
		bctx, stopB := context.WithTimeout(t.Context(), ttl+ttl/2)
		defer stopB()
		hb, _ := b.lockRetrying(bctx)
		assert.Equal(t, distlock.Lost, ha.g.State(), "a regained with replies slower than the lease")
		assert.Zero(t, ha.regainCount())
		blocked := hb == nil
		if !blocked {
			require.True(t, hb.increment())
			assert.False(t, ha.increment(), "a's stale write was accepted")
		}
		_, _ = ha.release() // its delete goes up; the reply is late
		if blocked {
			var err error
			hb, err = b.lock(t.Context())
			require.NoError(t, err)
		}
		hb.mustRelease(t, distlock.Released)
		w.requireClean(label("10", "delay-1.1T"))
		figure(t, label("10", "delay-1.1T"), "lost_lead_ms", ha.lead(l), "lost_lead_wire_ms", wireLead(t, ha, l),
			"b_blocked_until_release", blocked)
	})
}

// The lock of the cases whose passing release's reply is lost. b uses a
// grant at once only while a third of its claim window is left, counted
// from its last answered call in line: a long window leaves room for a slow
// machine.
const (
	lostReplyTTL   = 3 * time.Second
	lostReplyClaim = 2 * time.Second
)

// lostReplySetUp starts the world of those cases: a holds the lock, and b
// stands in line and listens for grants.
func lostReplySetUp(t *testing.T) (w *world, a, b *client, ha *holding, bw *waiter) {
	t.Helper()
	w = newWorld(t, lostReplyTTL)
	a, b = w.newClient("a"), w.newClient("b", distlock.WithClaimWindow(lostReplyClaim))
	warm(t, a) // the server has the release script now
	ha, err := a.lock(t.Context())
	require.NoError(t, err)
	bw = b.lockInBackground(t.Context())
	w.waitFor(t, eventually, "b in line and listening", func() bool {
		return queued(t, w) == 1 && len(wakeChannels(t, w.srv, w.key)) == 1
	})
	return w, a, b, ha, bw
}

// releaseUnheard cuts a's downlink and releases ha in the background: Redis
// runs the release, and a never hears back. The channel receives what
// Release returned, once a's proxy heals or Release gives up.
func releaseUnheard(a *client, ha *holding) <-chan error {
	a.proxy.Set(faultproxy.Down, faultproxy.Blackhole)
	released := make(chan error, 1)
	go func() { _, err := ha.release(); released <- err }()
	return released
}

// warm has c acquire and release once, so that the server has the
// scripts and a call is a single command (otherwise the first call of each
// script is refused with NOSCRIPT, writing nothing, and sent again).
func warm(t *testing.T, c *client) {
	t.Helper()
	h, err := c.lock(t.Context())
	require.NoError(t, err)
	h.mustRelease(t, distlock.Released)
}

// TestSafety11AcquireReplyLost: an acquire is applied by Redis but its reply
// is lost. Lock gives up on the attempt and deletes whatever it may have
// written, and when that delete cannot get through either, the orphaned
// lease blocks others for at most its TTL.
func TestSafety11AcquireReplyLost(t *testing.T) {
	t.Parallel()
	ttl := safetyTTL
	// appliedThen waits until a's acquire has written the lease and then
	// applies fault to a's proxy.
	appliedThen := func(t *testing.T, w *world, fault func()) time.Time {
		w.waitFor(t, ttl, "a's acquire applied", func() bool { _, ok := w.leaseValue(); return ok })
		fault()
		return time.Now()
	}
	subtest(t, "path stays down", 1, func(t *testing.T) {
		w := newWorld(t, ttl)
		a, b := w.newClient("a"), w.newClient("b")
		warm(t, a)
		a.proxy.Set(faultproxy.Down, faultproxy.Blackhole)
		errc := make(chan error, 1)
		go func() { _, err := a.m.TryLock(t.Context()); errc <- err }()
		appliedThen(t, w, func() { a.proxy.Set(faultproxy.Up, faultproxy.Blackhole) })
		bw := b.lockInBackground(t.Context())
		err := <-errc
		require.Error(t, err, "TryLock without a reply")
		assert.NotErrorIs(t, err, distlock.ErrNotAcquired)
		assert.ErrorIs(t, err, distlock.ErrNoReply, "TryLock without a reply says so")
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "no deadline of the caller's passed")
		hb := <-bw.got
		require.NotNil(t, hb)
		calls := a.wire.find(func(c wireCall) bool { return c.kind == acquireCall })
		sent := calls[len(calls)-1].start
		blocked := hb.granted.Sub(sent)
		assert.GreaterOrEqual(t, blocked, ttl, "the orphan expired before its TTL")
		late := w.delayed(sent, hb.granted)
		assert.Less(t, blocked, ttl+slack+late, "the orphan blocked b for longer than its TTL (%v explained by scheduling)", late)
		hb.mustRelease(t, distlock.Released)
		w.requireClean(label("11", "path-down"))
		figure(t, label("11", "path-down"), "orphan_blocked_ms", blocked, "lock_error", strings.ReplaceAll(err.Error(), " ", "_"))
	})
	subtest(t, "path heals", 1, func(t *testing.T) {
		w := newWorld(t, ttl)
		a, b := w.newClient("a"), w.newClient("b")
		warm(t, a)
		a.proxy.Set(faultproxy.Down, faultproxy.Blackhole)
		errc := make(chan error, 1)
		go func() { _, err := a.m.TryLock(t.Context()); errc <- err }()
		healed := appliedThen(t, w, a.proxy.Heal)
		require.Error(t, <-errc, "TryLock whose connection was reset")
		hb, err := b.lock(t.Context())
		require.NoError(t, err)
		late := w.delayed(healed, hb.granted)
		assert.Less(t, hb.granted.Sub(healed), ttl/2+late, "the orphan was not cleaned up (%v explained by scheduling)", late)
		// The clean-up's reply may reach a after b got the lock it freed.
		deletes := func() []wireCall {
			return a.wire.find(func(c wireCall) bool { return c.kind == releaseCall && c.ok })
		}
		w.waitFor(t, eventually, "the clean-up's reply", func() bool { return len(deletes()) >= 2 })
		assert.Len(t, deletes(), 2, "deletes: the warm-up's release and the clean-up")
		hb.mustRelease(t, distlock.Released)
		w.requireClean(label("11", "path-heals"))
		figure(t, label("11", "path-heals"), "orphan_blocked_ms", hb.granted.Sub(healed))
	})
	t.Run("Redis stopped during the attempt", func(t *testing.T) {
		// The attempt waits in a stopped Redis and gets no reply in time;
		// Lock asks again, with the same value, and is granted once Redis
		// resumes and runs them.
		t.Parallel()
		repeat(t, runs(t, 3), func(t *testing.T) {
			w := newWorld(t, ttl)
			a, b := w.newClient("a"), w.newClient("b")
			h, err := a.lock(t.Context())
			require.NoError(t, err) // the server has the scripts now
			h.mustRelease(t, distlock.Released)

			w.srv.Pause()
			type result struct {
				h   *holding
				err error
			}
			res := make(chan result, 1)
			go func() { h, err := a.lock(t.Context()); res <- result{h, err} }()
			var attempt []wireCall
			w.waitFor(t, ttl, "a's attempt sent", func() bool {
				attempt = a.wire.find(func(c wireCall) bool { return c.kind == acquireCall && !c.done })
				return len(attempt) > 0
			})
			// The attempt gets no reply before its own deadline (the lease
			// deadline of its send time). A Lock whose context cannot end
			// never returns that internal deadline: it asks again, with the
			// same value, until Redis answers.
			select {
			case r := <-res:
				t.Fatalf("Lock returned while Redis was stopped: %v", r.err)
			case <-time.After(ttl + ttl/2):
			}
			w.srv.Resume()
			resumed := time.Now()
			var r result
			select {
			case r = <-res:
			case <-time.After(ttl + eventually):
				t.Fatal("Lock did not return once Redis resumed")
			}
			require.NoError(t, r.err)
			took := r.h.granted.Sub(resumed)
			late := w.delayed(resumed, r.h.granted)
			assert.Less(t, took, ttl/2+late,
				"a got the lock %v after Redis resumed (%v explained by scheduling)", took, late)
			assert.Greater(t, len(a.wire.find(func(c wireCall) bool { return c.kind == acquireCall && c.value == attempt[0].value })), 1,
				"the attempt without a reply was not sent again")
			r.h.mustRelease(t, distlock.Released)
			hb, err := b.lock(t.Context())
			require.NoError(t, err)
			hb.mustRelease(t, distlock.Released)
			w.requireClean(label("11", "redis-stopped"))
			figure(t, label("11", "redis-stopped"), "lock_after_resume_ms", took)
		})
	})
	subtest(t, "request held while the caller gives up", 1, func(t *testing.T) {
		w := newWorld(t, ttl)
		a, b := w.newClient("a"), w.newClient("b")
		warm(t, a)
		a.proxy.Set(faultproxy.Up, faultproxy.Pause)
		ctx, cancel := context.WithTimeout(t.Context(), ttl/10)
		defer cancel()
		_, err := a.m.Lock(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		// The acquire and the clean-up are both held in the proxy, on
		// the same or on different pooled connections; let through,
		// they reach Redis in either order. Either way the lock must be
		// free at once: the clean-up voids the attempt's value.
		a.proxy.Set(faultproxy.Up, faultproxy.Pass)
		passed := time.Now()
		hb, err := b.lock(t.Context())
		require.NoError(t, err)
		blocked := hb.granted.Sub(passed)
		late := w.delayed(passed, hb.granted)
		assert.Less(t, blocked, ttl/2+late, "the attempt left an orphan after its clean-up (%v explained by scheduling)", late)
		hb.mustRelease(t, distlock.Released)
		w.requireClean(label("11", "request-held"))
		figure(t, label("11", "request-held"), "orphan_blocked_ms", blocked)
	})
}

// TestSafety12ReleaseRaces: Release while a renewal is in flight, twice,
// after Lost, by cancelling the Lock context, and with a context that ends
// first. Release never deletes or extends another holder's key, nothing is
// sent for the guard after Release returns, and a second Release reports
// the same outcome.
func TestSafety12ReleaseRaces(t *testing.T) {
	t.Parallel()
	ttl := safetyTTL
	subtest(t, "during a renewal", 1, func(t *testing.T) {
		w, a, b, ha := pair(t, ttl)
		a.proxy.SetDelay(faultproxy.Down, ttl/5)
		a.proxy.Set(faultproxy.Down, faultproxy.Delay)
		w.waitFor(t, ttl, "a renewal in flight", a.wire.renewalInFlight)
		start := time.Now()
		ha.mustRelease(t, distlock.Released)
		returned := time.Now()
		select {
		case <-ha.g.Done():
		default:
			t.Fatal("Done not closed when Release returned")
		}
		_, ok := w.leaseValue()
		assert.False(t, ok, "the key survived the release")
		hb, err := b.m.TryLock(t.Context())
		require.NoError(t, err, "the lock was not free after the release")
		hbw := b.watch(hb)
		time.Sleep(ttl / 2) // a late renewal of a's would be refused, never re-create or extend b's key
		assert.Empty(t, a.wire.callsSince(ha.token, returned), "calls for a after its Release returned")
		v, _ := w.leaseValue()
		assert.True(t, strings.HasPrefix(v, "b#"), "lease value %q", v)
		st, err := ha.g.Release(t.Context())
		assert.NoError(t, err)
		assert.Equal(t, distlock.Released, st, "second Release")
		hbw.mustRelease(t, distlock.Released)
		w.requireClean(label("12", "during-renewal"))
		figure(t, label("12", "during-renewal"), "release_ms", returned.Sub(start))
	})
	subtest(t, "after lost", 1, func(t *testing.T) {
		w, a, b, ha := pair(t, ttl)
		a.proxy.SetBoth(faultproxy.Blackhole)
		ha.waitLost(t, ttl+slack)
		hb, err := b.lock(t.Context())
		require.NoError(t, err)
		a.proxy.Heal()
		for range 2 {
			ha.mustRelease(t, distlock.Lost)
		}
		v, _ := w.leaseValue()
		assert.True(t, strings.HasPrefix(v, "b#"), "a's release touched b's key: %q", v)
		hb.mustRelease(t, distlock.Released)
		w.requireClean(label("12", "after-lost"))
	})
	subtest(t, "lock context cancelled", 1, func(t *testing.T) {
		w := newWorld(t, ttl)
		a, b := w.newClient("a"), w.newClient("b")
		ctx, cancel := context.WithCancel(t.Context())
		ha, err := a.lock(ctx)
		require.NoError(t, err)
		bw := b.lockInBackground(t.Context())
		cancel()
		select {
		case <-ha.g.Done():
		case <-time.After(eventually):
			t.Fatal("cancelling the Lock context did not release the guard")
		}
		hb := <-bw.got
		require.NotNil(t, hb)
		ha.mustRelease(t, distlock.Released)
		hb.mustRelease(t, distlock.Released)
		w.requireClean(label("12", "lock-context-cancelled"))
	})
	subtest(t, "release context ends first", 1, func(t *testing.T) {
		w, a, b, ha := pair(t, ttl)
		a.proxy.SetDelay(faultproxy.Down, ttl/5)
		a.proxy.Set(faultproxy.Down, faultproxy.Delay)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
		defer cancel()
		_, err := ha.g.Release(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.NotEqual(t, distlock.Acquired, ha.g.State(), "Acquired after the release began")
		select {
		case <-ha.g.Done():
		case <-time.After(eventually):
			t.Fatal("the release did not finish in the background")
		}
		hb, err := b.m.TryLock(t.Context())
		require.NoError(t, err, "the background release did not free the lock")
		b.watch(hb).mustRelease(t, distlock.Released)
		ha.mustRelease(t, distlock.Released)
		w.requireClean(label("12", "release-context-ends-first"))
	})
	subtest(t, "reply of a passing release lost", 1, func(t *testing.T) {
		// Redis passes the lease to b, but the reply never reaches a: the
		// history learns of the pass only from c's refused call, which names
		// b as the holder, long after b's first samples and renewals. (CI
		// caught the history blaming the library for this once.)
		const ttl, claim = lostReplyTTL, lostReplyClaim
		w, a, b, ha, bw := lostReplySetUp(t)
		c := w.newClient("c")
		released := releaseUnheard(a, ha)
		hb := <-bw.got
		require.NotNil(t, hb)
		// b renews meanwhile, before the history knows its token, and holds
		// on past its claim window: only those renewals justify its samples
		// from then until c's call.
		time.Sleep(claim * 3 / 2)
		require.Empty(t, b.wire.find(func(c wireCall) bool { return c.kind == acquireCall && c.ok }),
			"b claimed its grant by a call instead of using it at once")
		_, err := c.m.TryLock(t.Context())
		require.ErrorIs(t, err, distlock.ErrNotAcquired)
		time.Sleep(ttl / 4)
		hb.mustRelease(t, distlock.Released)
		a.proxy.Heal()
		<-released // whatever a's Release says: it cannot know
		r := w.requireClean(label("12", "passing-release-reply-lost"))
		assert.Zero(t, r.Unchecked, "b's samples without a write to check them against")
	})
	subtest(t, "reply of a passing release lost, a refresh in flight", 1, func(t *testing.T) {
		// As above, but b hears of its grant while a refresh of its place is
		// held on the way to Redis: b uses the grant at once, and the
		// refresh, arriving after the grant, finds b's value in the lease
		// and returns the grant's token, which is how the history learns it.
		const claim = lostReplyClaim
		w, a, b, ha, bw := lostReplySetUp(t)
		b.proxy.Set(faultproxy.Up, faultproxy.Pause)
		paused := time.Now()
		// A call sent after the pause is held in the proxy; b sent it after
		// the reply to the one before, which left it in line.
		held := func() (wireCall, bool) {
			calls := b.wire.find(func(c wireCall) bool { return c.kind == acquireCall })
			n := len(calls)
			if n < 2 || !leftInLine(calls[n-2]) || calls[n-1].start.Before(paused) {
				return wireCall{}, false
			}
			return calls[n-1], true
		}
		w.waitFor(t, eventually, "a refresh of b's place held", func() bool { _, ok := held(); return ok })
		released := releaseUnheard(a, ha)
		var hb *holding
		select {
		case hb = <-bw.got:
			time.Sleep(50 * time.Millisecond)
			b.proxy.Set(faultproxy.Up, faultproxy.Pass)
			w.waitFor(t, eventually, "the held refresh answered", func() bool { c, _ := held(); return c.done })
			c, _ := held()
			require.True(t, c.ok, "the held refresh did not find b holding the lease: %v", c.err)
		case <-time.After(claim / 2):
			// b found too little of its window left and claims the grant by
			// a call, which waits for the uplink: not the case under test,
			// but the history must hold all the same.
			t.Logf("b did not use the grant at once; it claims it")
			b.proxy.Set(faultproxy.Up, faultproxy.Pass)
			hb = <-bw.got
		}
		require.NotNil(t, hb)
		time.Sleep(claim / 2) // past b's first renewal
		hb.mustRelease(t, distlock.Released)
		a.proxy.Heal()
		<-released
		r := w.requireClean(label("12", "passing-release-reply-lost-refresh-in-flight"))
		assert.Zero(t, r.Unchecked, "b's samples without a write to check them against")
	})
}

// fillMemory writes keys of 8 KiB (with EX ex seconds when ex > 0) until
// stop says so or a write fails, and reports the keys written and the
// error that ended it, if any.
func fillMemory(t *testing.T, w *world, ex int64, stop func() bool) (int, error) {
	t.Helper()
	rc := w.srv.Client()
	value := strings.Repeat("x", 8<<10)
	for i := 0; i < 100_000; i++ {
		cmd := rc.B().Set().Key(fmt.Sprintf("junk:%d", i)).Value(value)
		var err error
		if ex > 0 {
			err = rc.Do(t.Context(), cmd.ExSeconds(ex).Build()).Error()
		} else {
			err = rc.Do(t.Context(), cmd.Build()).Error()
		}
		if err != nil {
			return i, err
		}
		if i%20 == 0 && stop() {
			return i + 1, nil
		}
	}
	t.Fatal("memory never filled up")
	return 0, nil
}

// limitMemory sets maxmemory to what the server uses now plus extra.
func limitMemory(t *testing.T, w *world, extra int64) {
	t.Helper()
	info, err := w.srv.MustDo("INFO", "memory").ToString()
	require.NoError(t, err)
	var used int64
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			_, err := fmt.Sscan(v, &used)
			require.NoError(t, err)
		}
	}
	require.Positive(t, used)
	w.srv.MustDo("CONFIG", "SET", "maxmemory", fmt.Sprint(used+extra))
}

// TestSafety13Eviction: Redis runs out of memory. Under a volatile policy
// the lease, having the shortest TTL, is the first key evicted: the holder
// reports Lost at its next renewal, and as with an operator's delete a new
// holder may overlap until then, with fencing refusing the old holder's
// write. Under noeviction nothing is evicted: renewals and releases still
// work (they do not allocate), and an acquire of a free lock fails with
// Redis's clear OOM error and writes nothing.
func TestSafety13Eviction(t *testing.T) {
	t.Parallel()
	ttl := safetyTTL
	subtest(t, "volatile-ttl", 1, func(t *testing.T) {
		w := newWorld(t, ttl, "--maxmemory-policy", "volatile-ttl")
		limitMemory(t, w, 4<<20)
		a, b := w.newClient("a"), w.newClient("b")
		ha, err := a.lock(t.Context())
		require.NoError(t, err)
		require.True(t, ha.increment())
		ha.waitRenewals(t, 1)
		n, err := fillMemory(t, w, 3600, func() bool { _, ok := w.leaseValue(); return !ok })
		require.NoError(t, err, "under volatile-ttl a write must evict, not fail")
		evicted := time.Now()
		l := ha.waitLost(t, ttl)
		assert.Equal(t, distlock.LostRefused, l.reason, "reason: %v", l.err)
		late := w.delayed(evicted, l.at)
		assert.Less(t, l.at.Sub(evicted), ttl/3+slack+late, "Lost long after the eviction (%v explained by scheduling)", late)
		w.srv.MustDo("FLUSHDB") // the pressure is over (and the fencing key gone too)
		hb, err := b.lock(t.Context())
		require.NoError(t, err)
		assert.Greater(t, hb.token, ha.token, "token went back after the fencing key was evicted")
		require.True(t, hb.increment())
		assert.False(t, ha.increment(), "a's stale write was accepted")
		ha.mustRelease(t, distlock.Lost)
		hb.mustRelease(t, distlock.Released)
		r := w.check(label("13", "volatile-ttl"))
		requireSafeExceptOverlap(t, r)
		figure(t, label("13", "volatile-ttl"), "junk_keys", n, "lost_after_eviction_ms", l.at.Sub(evicted),
			"overlaps", len(r.Overlaps), "stale_accepted", len(r.Stale))
	})
	subtest(t, "noeviction", 1, func(t *testing.T) {
		w := newWorld(t, ttl, "--maxmemory-policy", "noeviction")
		limitMemory(t, w, 4<<20)
		a, b := w.newClient("a"), w.newClient("b")
		ha, err := a.lock(t.Context())
		require.NoError(t, err)
		ha.waitRenewals(t, 1)
		n, err := fillMemory(t, w, 0, func() bool { return false })
		require.ErrorContains(t, err, "OOM", "filling memory under noeviction")
		full := time.Now()
		ha.waitRenewals(t, ha.c.wire.confirmedRenewals(ha.token)+3)
		if st, losses := ha.g.State(), ha.lossCount(); st != distlock.Acquired || losses > 0 {
			w.skipIfStarved(t, full, renewalBudget(ttl), fmt.Sprintf("at maxmemory, a was %v after %d losses", st, losses))
			t.Errorf("renewals must work at maxmemory: a was %v after %d losses", st, losses)
		}
		ha.mustRelease(t, distlock.Released)
		// The delete freed a little memory; make sure the server is over
		// its limit for the next write.
		limitMemory(t, w, -1<<20)
		g, oomErr := b.m.TryLock(t.Context())
		if oomErr == nil {
			b.watch(g).mustRelease(t, distlock.Released)
		}
		require.Error(t, oomErr, "acquire at maxmemory")
		assert.ErrorContains(t, oomErr, "OOM")
		assert.NotErrorIs(t, oomErr, distlock.ErrNotAcquired)
		_, ok := w.leaseValue()
		assert.False(t, ok, "a failed acquire left a lease")
		w.srv.MustDo("FLUSHDB")
		hb, err := b.lock(t.Context())
		require.NoError(t, err, "acquire after memory was freed")
		hb.mustRelease(t, distlock.Released)
		w.requireClean(label("13", "noeviction"))
		figure(t, label("13", "noeviction"), "junk_keys", n, "held_at_maxmemory_ms", time.Since(full),
			"acquire_error", strings.ReplaceAll(strings.SplitN(oomErr.Error(), ".", 2)[0], " ", "_"))
	})
}

// scriptCalls returns how many scripts the server has run or been asked to
// run (EVAL and EVALSHA, including refused ones).
func scriptCalls(t *testing.T, w *world) int64 {
	t.Helper()
	info, err := w.srv.MustDo("INFO", "commandstats").ToString()
	require.NoError(t, err)
	var n int64
	for _, line := range strings.Split(info, "\r\n") {
		for _, cmd := range []string{"cmdstat_eval:", "cmdstat_evalsha:"} {
			if rest, ok := strings.CutPrefix(line, cmd); ok {
				for _, field := range strings.Split(rest, ",") {
					k, v, _ := strings.Cut(field, "=")
					if k == "calls" || k == "rejected_calls" {
						var calls int64
						_, err := fmt.Sscan(v, &calls)
						require.NoError(t, err, "commandstats %q", line)
						n += calls
					}
				}
			}
		}
	}
	return n
}

// TestSafety14BadInput: input that is wrong by itself (a cancelled or nil
// context, a negative wait) gets a typed error and sends nothing to Redis;
// keys of the wrong Redis type or content get Redis's error, not "held",
// and nothing is written next to them. Option and key validation is
// covered by TestInvalidInput and FuzzNewMutex.
func TestSafety14BadInput(t *testing.T) {
	t.Parallel()
	w := newWorld(t, safetyTTL)
	c := w.newClient("a")
	m := c.m
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	before := scriptCalls(t, w)
	inputOnly := []struct {
		name string
		call func() error
		want error
	}{
		{"Lock, cancelled ctx", func() error { _, err := m.Lock(cancelled); return err }, context.Canceled},
		{"TryLock, cancelled ctx", func() error { _, err := m.TryLock(cancelled); return err }, context.Canceled},
		{"TryLockFor, cancelled ctx", func() error { _, err := m.TryLockFor(cancelled, time.Second, 0); return err }, context.Canceled},
		//lint:ignore SA1012 a nil context on purpose
		{"Lock, nil ctx", func() error { _, err := m.Lock(nil); return err }, distlock.ErrInvalidOption},
		//lint:ignore SA1012 a nil context on purpose
		{"TryLock, nil ctx", func() error { _, err := m.TryLock(nil); return err }, distlock.ErrInvalidOption},
		{"TryLockFor, negative timeout", func() error { _, err := m.TryLockFor(t.Context(), -1, 0); return err }, distlock.ErrInvalidOption},
		{"TryLockFor, negative interval", func() error { _, err := m.TryLockFor(t.Context(), time.Second, -1); return err }, distlock.ErrInvalidOption},
	}
	for _, tc := range inputOnly {
		err := tc.call()
		assert.ErrorIs(t, err, tc.want, tc.name)
	}
	sent := scriptCalls(t, w) - before
	assert.Zero(t, sent, "scripts sent for input that was wrong by itself")
	n, err := w.srv.MustDo("DBSIZE").ToInt64()
	require.NoError(t, err)
	assert.Zero(t, n, "keys written for bad input")

	// A guard given a nil context: Release still releases (and says the
	// context was bad), Subscribe sends one event that says so and closes.
	h, err := c.lock(t.Context())
	require.NoError(t, err)
	//lint:ignore SA1012 a nil context on purpose
	_, err = h.g.Release(nil)
	assert.ErrorIs(t, err, distlock.ErrInvalidOption)
	//lint:ignore SA1012 a nil context on purpose
	sub := h.g.Subscribe(nil)
	ev, open := <-sub
	assert.True(t, open, "Subscribe(nil) sent no event")
	assert.ErrorIs(t, ev.Err, distlock.ErrInvalidArgument, "Subscribe(nil)'s event")
	_, open = <-sub
	assert.False(t, open, "Subscribe(nil) left its channel open after the refusal")
	h.mustRelease(t, distlock.Released)

	wrong := []struct {
		name string
		key  string
		set  []string
	}{
		{"lease is a hash", w.key, []string{"HSET", w.key, "f", "v"}},
		{"lease is a list", w.key, []string{"RPUSH", w.key, "v"}},
		{"lease is a stream", w.key, []string{"XADD", w.key, "*", "f", "v"}},
		{"fence is a set", w.key + ":fence", []string{"SADD", w.key + ":fence", "1"}},
		{"fence is text", w.key + ":fence", []string{"SET", w.key + ":fence", "twelve"}},
		{"fence is negative", w.key + ":fence", []string{"SET", w.key + ":fence", "-5"}},
		{"fence is a float", w.key + ":fence", []string{"SET", w.key + ":fence", "1.5e3"}},
		{"fence is past 2^53", w.key + ":fence", []string{"SET", w.key + ":fence", "9007199254740993"}},
	}
	for _, tc := range wrong {
		w.srv.MustDo("FLUSHDB")
		w.srv.MustDo(tc.set...)
		dump := w.srv.MustDo("DUMP", tc.key)
		g, err := m.TryLock(t.Context())
		if err == nil {
			c.watch(g).mustRelease(t, distlock.Released)
		}
		require.Error(t, err, tc.name)
		assert.NotErrorIs(t, err, distlock.ErrNotAcquired, tc.name)
		n, err := w.srv.MustDo("DBSIZE").ToInt64()
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "%s: keys written next to it", tc.name)
		assert.Equal(t, dump, w.srv.MustDo("DUMP", tc.key), "%s: the key was changed", tc.name)
	}
	w.requireClean("14")
	figure(t, "14", "input_only_cases", len(inputOnly), "wrong_key_cases", len(wrong), "scripts_sent_for_input_only", sent)
}

// starveObserver counts what a thousand guards report. Renewals are only
// counted, without a lock: a lock that a thousand actors share would delay
// them when its holder is preempted, which the probe does not see.
type starveObserver struct {
	renewals, failed atomic.Int64

	mu    sync.Mutex
	lost  []starveLoss // every Lost transition, when it was observed
	cause error        // of the last Lost
}

// starveLoss is a guard seen without its lease: by a Lost transition
// (observed at once: from = to), or by the first of a run of State calls
// that did not return Acquired (from before the call to after it).
type starveLoss struct {
	token    int64
	from, to time.Time
}

func (o *starveObserver) ObserveAcquire(distlock.AcquireInfo) {}

func (o *starveObserver) ObserveRenew(i distlock.RenewInfo) {
	o.renewals.Add(1)
	if i.Err != nil {
		o.failed.Add(1)
	}
}

func (o *starveObserver) ObserveTransition(i distlock.TransitionInfo) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if i.To == distlock.Lost {
		o.lost = append(o.lost, starveLoss{token: i.Token, from: now, to: now})
		o.cause = i.Err
	}
}

// starveJudge tells a false Lost from one that the machine caused, from
// the lease scripts the guards sent (as the wire recorded them) and the
// scheduling delay the probe measured meanwhile.
//
// In this scenario a guard has two things to do in time: send each renewal
// when it is due (a third of the TTL after the write before it was sent,
// or at once if the answer to that write came later), and take in a
// confirmation before the deadline that the write before it allows. How
// long the client and Redis take to answer is not up to the guard: on a
// busy 2-core machine, a thousand renewals at once can take longer than
// the whole lease, and then Lost is the right answer. So a renewal is late
// if it was sent after it was due by more than hop allows; and a loss is
// false if a confirmed write should have kept the guard Acquired: its
// answer came back more than hop before the loss, and its lease, counted
// from the earliest moment the guard can have sent it, ran past the loss.
// hop is stepHops times the worst delay the probe saw at the time (a step
// of the guard is a few wake-ups of its goroutines, each of which waits for
// a CPU as the probe's do; in a burst of a thousand, the probe's sampled
// view of the waits misses some of the worst), and at least two probe
// periods.
type starveJudge struct {
	ttl   time.Duration
	probe *probe
	calls map[int64][]wireCall // acquires and renewals of each token, by start
}

func newStarveJudge(ttl time.Duration, p *probe, wires []*wire) *starveJudge {
	j := &starveJudge{ttl: ttl, probe: p, calls: make(map[int64][]wireCall)}
	for _, wr := range wires {
		for _, c := range wr.find(func(c wireCall) bool { return c.kind == acquireCall || c.kind == renewCall }) {
			j.calls[c.token] = append(j.calls[c.token], c)
		}
	}
	for _, list := range j.calls {
		slices.SortFunc(list, func(a, b wireCall) int { return a.start.Compare(b.start) })
	}
	return j
}

// hop is how long a step of a guard due in [from, to] may have waited for
// the scheduler.
func (j *starveJudge) hop(from, to time.Time) time.Duration {
	return max(2*probeEvery, stepHops*j.probe.delay(from.Add(-probeEvery), to))
}

// heldBy returns a confirmed write that should have kept the guard of l's
// token Acquired throughout l, if there is one.
func (j *starveJudge) heldBy(l starveLoss) (wireCall, bool) {
	for _, c := range j.calls[l.token] {
		// The guard's goroutine that takes in the answer may have waited
		// for a CPU until after the loss: look that far for its wait.
		if !c.done || !c.ok || c.end.Add(j.hop(c.end, l.to.Add(j.ttl/3))).After(l.from) {
			continue
		}
		// The guard reads its send time just before it starts the
		// goroutine in which the wire reads its own.
		sent := c.start.Add(-j.hop(c.start.Add(-j.ttl/3), c.start))
		if sent.Add(j.ttl - distlock.Margin(j.ttl)).After(l.to) {
			return c, true
		}
	}
	return wireCall{}, false
}

// lateRenewals describes the renewals due by until that were sent late, or
// not at all.
func (j *starveJudge) lateRenewals(until time.Time) []string {
	var late []string
	for token, list := range j.calls {
		for i, p := range list {
			if !p.done || !p.ok {
				continue
			}
			due := p.start.Add(j.ttl / 3)
			if p.end.After(due) {
				due = p.end
			}
			if due.After(until) {
				continue
			}
			sent := until
			if i+1 < len(list) {
				sent = list[i+1].start
			}
			if by, allowed := sent.Sub(due), j.hop(due, sent); by > allowed {
				late = append(late, fmt.Sprintf("token %d: renewal due %v after the write before was sent %v late "+
					"(allowed %v)", token, due.Sub(p.start), by, allowed))
			}
		}
	}
	return late
}

// worstRenewal returns the slowest renewal round trip the wire saw.
func (j *starveJudge) worstRenewal() time.Duration {
	var worst time.Duration
	for _, list := range j.calls {
		for _, c := range list {
			if c.kind == renewCall && c.done {
				worst = max(worst, c.end.Sub(c.start))
			}
		}
	}
	return worst
}

// TestSafety15StarvedCPU: a thousand locks are held while busy goroutines
// (twice GOMAXPROCS) keep every CPU of the process busy. No guard reports
// Acquired past its deadline (L1, checked on every State sample against the
// writes Redis confirmed), every renewal is sent on time, and no guard
// reports a false Lost: renewals are sent a third of the TTL after the last
// one, and the rest of the lease is ample slack for a starved scheduler.
//
// Ample, that is, when the process has the machine's CPUs to itself. On a
// 2-core machine that other work keeps busy, Redis and the client can take
// longer than the whole budget to answer a thousand renewals, and then Lost
// is the right answer. So the test tells a false Lost from a true one by
// what the guard could know (see starveJudge), with the scheduling delay
// measured by a probe. Losses found after the busy goroutines have stopped
// are counted, not judged. When guards lost their leases and every loss
// was a true one, the test skips, saying why (L1 is still checked). The
// test does not run in parallel with the others in this package, since it
// starves them as well.
func TestSafety15StarvedCPU(t *testing.T) {
	for i := range runs(t, 1) {
		t.Run(fmt.Sprintf("run%d", i), func(t *testing.T) { starveOnce(t) })
	}
}

func starveOnce(t *testing.T) {
	const (
		locks = 1000
		ttl   = 2 * time.Second
		hold  = 2 * ttl
	)
	srv := redistest.Start(t)
	rc := srv.Client()
	// Each guard has a wire and a history of its own, merged at the end:
	// shared ones would make a thousand guards queue for their locks.
	wires := make([]*wire, locks)
	recs := make([]*history.Recorder, locks)
	var ops []history.Op // the test's own: grants and State samples
	obs := &starveObserver{}
	// The probe's round trip goes through the guards' client, as their
	// renewals do: a Redis or a client slowed by the machine delays it too.
	timers := startProbe(t, func(ctx context.Context) error { return rc.Do(ctx, rc.B().Ping().Build()).Error() })

	guards := make([]*distlock.Guard, 0, locks)
	defer func() {
		var wg sync.WaitGroup
		for _, g := range guards {
			wg.Go(func() { _, _ = g.Release(context.Background()) })
		}
		wg.Wait()
	}()
	owner := func(i int) string { return fmt.Sprintf("s%d", i) }
	for i := range locks {
		recs[i] = &history.Recorder{}
		wires[i] = newWire(rc, recs[i], newTokenBook())
		m, err := distlock.NewMutex(wires[i], fmt.Sprintf("starved-%d", i), distlock.WithTTL(ttl),
			distlock.WithObserver(obs), distlock.WithOwner(owner(i)))
		require.NoError(t, err)
		start := time.Now()
		g, err := m.TryLock(t.Context())
		if errors.Is(err, distlock.ErrNoReply) {
			t.Skipf("the machine is too busy for a thousand leases of %v: acquire %d took %v and ran out of "+
				"its lease (the probe saw goroutines wake up to %v late)", ttl, i, time.Since(start), timers.worst())
		}
		require.NoError(t, err)
		ops = append(ops, history.Op{Kind: history.Granted, At: history.Now(), Key: g.Key(), Client: owner(i), Token: g.Token()})
		guards = append(guards, g)
	}
	sample := func(g *distlock.Guard, i int) distlock.State {
		at := history.Now()
		s := g.State()
		ops = append(ops, history.Op{Kind: history.Sample, At: at, End: history.Now(), Key: g.Key(), Client: owner(i),
			Token: g.Token(), Held: s == distlock.Acquired})
		return s
	}

	var (
		stop  atomic.Bool
		spins atomic.Int64
		wg    sync.WaitGroup
	)
	busy := 2 * runtime.GOMAXPROCS(0)
	for range busy {
		wg.Go(func() {
			n := int64(0)
			for !stop.Load() {
				n++
			}
			spins.Add(n)
		})
	}
	start := time.Now()
	var (
		found   []starveLoss // losses found by State
		notHeld int          // State calls that did not return Acquired
		inLoss  = make([]bool, locks)
	)
	for time.Since(start) < hold {
		time.Sleep(ttl / 10)
		for i, g := range guards {
			from := time.Now()
			if sample(g, i) == distlock.Acquired {
				inLoss[i] = false
				continue
			}
			notHeld++
			if !inLoss[i] {
				found = append(found, starveLoss{token: g.Token(), from: from, to: time.Now()})
				inLoss[i] = true
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	starvedUntil := time.Now()

	// The contract first: L1 on every sample; no guard that says Acquired
	// after its lease is gone from Redis (read first: a lease can only go,
	// never come back); and nothing in Redis but a fencing key per lock
	// and leases.
	for _, rec := range recs {
		ops = append(ops, rec.Ops()...)
	}
	r := history.Check(ops)
	t.Logf("SAFETY scenario=15 %s", r.Summary())
	require.NoError(t, r.Err())
	assert.Zero(t, r.Unchecked, "held samples without a confirmed write to check L1 against")
	gets := make(rueidis.Commands, 0, locks)
	for _, g := range guards {
		gets = append(gets, rc.B().Get().Key(g.Key()).Build())
	}
	leases := 0
	for i, res := range rc.DoMulti(t.Context(), gets...) {
		v, err := res.ToString()
		if err != nil && !rueidis.IsRedisNil(err) {
			require.NoError(t, err, "GET lease %d", i)
		}
		ours := err == nil && lease.Owner(v) == owner(i)
		if ours {
			leases++
		}
		if sample(guards[i], i) == distlock.Acquired && !ours {
			t.Errorf("guard %d reports Acquired, but its lease holds %q (present: %v)", i, v, err == nil)
		}
	}
	keys, err := rc.Do(t.Context(), rc.B().Keys().Pattern("*").Build()).AsStrSlice()
	require.NoError(t, err)
	fences := 0
	for _, k := range keys {
		switch {
		case strings.HasPrefix(k, "distlock:{starved-") && strings.HasSuffix(k, "}:fence"):
			fences++
		case strings.HasPrefix(k, "distlock:{starved-") && strings.HasSuffix(k, "}"):
		default:
			t.Errorf("unexpected key in Redis: %q", k)
		}
	}
	assert.Equal(t, locks, fences, "fencing keys in Redis")

	// Then the guards' own part: renewals sent on time, and no Lost that a
	// confirmed write should have prevented (see starveJudge).
	judge := newStarveJudge(ttl, timers, wires)
	// The probe samples the scheduler every probeEvery; in a burst of a
	// thousand renewals, now and then one waits for a CPU longer than any
	// sample saw (beside two busy loops: 2 of 23,902 renewals, 27 and 50 ms
	// late against 22 and 31 ms allowed). So a few in a thousand are said,
	// and more fail: a timer that drifts under load (what this checks) makes
	// many late, not one in ten thousand. A late renewal that cost a lease
	// fails below in any case (false_lost).
	lateRenewals := judge.lateRenewals(starvedUntil)
	if len(lateRenewals) > 0 {
		t.Logf("%d renewals sent late by more than the scheduling delay explains (the first five): %v",
			len(lateRenewals), lateRenewals[:min(len(lateRenewals), 5)])
	}
	obs.mu.Lock()
	lost := append([]starveLoss(nil), obs.lost...)
	renewals, failed, cause := obs.renewals.Load(), obs.failed.Load(), obs.cause
	obs.mu.Unlock()
	falseLost, excused, after := 0, 0, 0
	for _, l := range append(found, lost...) {
		if l.from.After(starvedUntil) {
			// Once the busy goroutines have stopped, what is left is the
			// machine's own load, and the guards that lost their leases
			// retrying: not what this scenario is about.
			after++
			continue
		}
		c, held := judge.heldBy(l)
		if !held {
			excused++
			continue
		}
		falseLost++
		if falseLost <= 5 {
			t.Errorf("token %d not Acquired %v into the hold, although a write sent %v into it was confirmed %v "+
				"before (scheduling delay then: %v)", l.token, l.from.Sub(start), c.start.Sub(start),
				l.from.Sub(c.end), timers.delay(c.end, l.from))
		}
	}
	assert.Zero(t, falseLost, "false Losts; the last Lost's cause: %v", cause)
	late, wait := timers.parts(time.Time{}, time.Now())
	figure(t, "15", "locks", locks, "busy_goroutines", busy, "gomaxprocs", runtime.GOMAXPROCS(0),
		"renewals", renewals, "failed_renewals", failed, "late_renewals", len(lateRenewals),
		"lost_transitions", len(lost), "losses_found_by_state", len(found), "not_held_samples", notHeld,
		"excused", excused, "false_lost", falseLost, "losses_after_the_hold", after,
		"worst_renewal_round_trip_ms", judge.worstRenewal(), "renewal_budget_ms", renewalBudget(ttl),
		"worst_probe_late_ms", late, "worst_sched_wait_ms", wait)
	if falseLost == 0 && excused > 0 {
		// So slow a machine that renewals were answered after their
		// deadlines starves the sending too, in bursts the probe's samples
		// can miss (beside two busy loops: 40 renewals of one burst sent
		// about 90 ms late, while round trips took up to 1.1 s): the late
		// sends are said, and the scenario is not judged on them.
		t.Skipf("the machine was too slow for %d leases of %v: %d losses, each after a renewal answered too late "+
			"for its deadline (worst round trip %v, budget %v); %d renewals sent later than the probe explains; "+
			"no false Lost, and L1 held on all %d samples", locks, ttl, excused, judge.worstRenewal(),
			renewalBudget(ttl), len(lateRenewals), r.Samples)
	}
	assert.LessOrEqual(t, int64(len(lateRenewals))*1000, obs.renewals.Load(),
		"%d renewals sent late by more than the scheduling delay explains, over one in a thousand: %v",
		len(lateRenewals), lateRenewals[:min(len(lateRenewals), 5)])
}

// failoverRig is a primary, a replica that reaches it through a fault
// proxy (so that replication can fall behind on demand), and a world on
// the primary.
type failoverRig struct {
	w                *world
	primary, replica *redistest.Server
	link             *faultproxy.Proxy
}

func newFailoverRig(t *testing.T, ttl time.Duration) *failoverRig {
	t.Helper()
	primary := redistest.Start(t, "--repl-diskless-sync-delay", "0") // sync the replica at once
	link := faultproxy.New(t, primary.Addr())
	_, port, err := net.SplitHostPort(link.Addr())
	require.NoError(t, err)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", port)
	waitFor(t, eventually, "the replica in sync", func() bool {
		info, err := replica.MustDo("INFO", "replication").ToString()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	return &failoverRig{w: newWorldOn(t, primary, ttl), primary: primary, replica: replica, link: link}
}

// failOver kills the primary, drops what the replica had not received yet,
// and promotes the replica.
func (f *failoverRig) failOver() time.Time {
	f.primary.Kill()
	f.link.Refuse()
	f.replica.MustDo("REPLICAOF", "NO", "ONE")
	return time.Now()
}

// TestSafety16ReplicaFailover is a demonstration, not a guarantee: with
// asynchronous replication, a failover can grant the lock twice. The
// primary confirms the lease before its replica has it; the primary dies;
// the replica is promoted without the lease; another client acquires there
// while the first holder still reports Acquired, until its next renewal
// fails. Tokens still increase (they come from the server clock), so the
// fenced counter refuses the first holder's late write. With
// WithReplicaAck, the first Lock is refused instead, since the replica did
// not acknowledge the lease, and nothing overlaps.
func TestSafety16ReplicaFailover(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	subtest(t, "asynchronous", 1, func(t *testing.T) {
		f := newFailoverRig(t, ttl)
		w := f.w
		a := w.newClientOf(f.primary.Addr(), "a")
		f.link.Set(faultproxy.Down, faultproxy.Pause) // the replica falls behind
		ha, err := a.lock(t.Context())
		require.NoError(t, err)
		require.True(t, ha.increment())

		failedOver := f.failOver()
		b := w.newClientOf(f.replica.Addr(), "b")
		hb, err := b.lock(t.Context())
		require.NoError(t, err, "the promoted replica does not have a's lease")
		aHeld := ha.sample() == distlock.Acquired
		assert.Greater(t, hb.token, ha.token, "token went back after the failover")
		require.True(t, hb.increment())

		l := ha.waitLost(t, ttl)
		assert.Equal(t, distlock.LostRenewFailed, l.reason, "reason: %v", l.err)
		assert.False(t, ha.increment(), "a's stale write was accepted")
		_, _ = ha.release() // the primary is gone: the delete fails
		hb.mustRelease(t, distlock.Released)

		r := w.check(label("16", "asynchronous"))
		requireSafeExceptOverlap(t, r)
		assert.True(t, aHeld, "a no longer reported Acquired when b was granted: the demonstration did not happen")
		assert.NotEmpty(t, r.Overlaps, "the history shows no double grant")
		figure(t, label("16", "asynchronous"), "double_grant", len(r.Overlaps) > 0, "overlap_ms", maxOverlap(r),
			"a_lost_after_failover_ms", l.at.Sub(failedOver), "stale_accepted", len(r.Stale), "stale_refused", r.Refused)
	})
	subtest(t, "replica acknowledgement", 1, func(t *testing.T) {
		f := newFailoverRig(t, ttl)
		w := f.w
		a := w.newClientOf(f.primary.Addr(), "a", distlock.WithReplicaAck(1, 100*time.Millisecond))
		f.link.Set(faultproxy.Down, faultproxy.Pause) // the replica falls behind
		_, ackErr := a.m.TryLock(t.Context())
		require.ErrorIs(t, ackErr, distlock.ErrNotReplicated, "a lease the replica never acknowledged")
		v, held := w.leaseValue()
		assert.False(t, held, "the unacknowledged lease was left on the primary: %q", v)

		f.failOver()
		b := w.newClientOf(f.replica.Addr(), "b")
		hb, err := b.lock(t.Context())
		require.NoError(t, err)
		hb.mustRelease(t, distlock.Released)
		r := w.requireClean(label("16", "replica-ack"))
		figure(t, label("16", "replica-ack"), "double_grant", len(r.Overlaps) > 0, "a_error",
			strings.ReplaceAll(ackErr.Error(), " ", "_"))
	})
}
