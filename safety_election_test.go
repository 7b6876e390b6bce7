package distlock_test

// The fault suite for elections: the leader stopped, killed and cut off,
// and Redis restarted. The history is checked for one leader per instant
// (an election is a lock: history.Check's L2) and for what an observer in
// the test process saw: terms in token order, each under the value of the
// candidate that was granted it. The harness is that of
// safety_semaphore_test.go.

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/history"
	"github.com/distkit-go/distlock/internal/redistest"
)

// electionOf makes a contender a candidate of the world's election, which
// campaigns with its name as its value.
func electionOf(t *testing.T, ttl time.Duration) func(rueidis.Client, string) func(context.Context) (*distlock.Guard, error) {
	return func(rc rueidis.Client, name string) func(context.Context) (*distlock.Guard, error) {
		e, err := distlock.NewElection(rc, "safety", distlock.WithTTL(ttl))
		require.NoError(t, err)
		return func(ctx context.Context) (*distlock.Guard, error) { return e.Campaign(ctx, name) }
	}
}

// observer follows the world's election through a client of its own
// (straight to Redis, not through a fault proxy) and records every Leader
// that Observe delivers as an Observed op.
type observer struct {
	w    *world
	name string
	done chan struct{} // closed when the reader has returned

	mu   sync.Mutex
	seen []history.Op
	news chan struct{} // closed and replaced at every Leader
}

// observe starts an observer that runs until the test ends.
func (w *world) observe(name string) *observer {
	t := w.t
	t.Helper()
	rc := redistest.NewClient(t, rueidis.ClientOption{InitAddress: []string{w.srv.Addr()}, DisableCache: true})
	e, err := distlock.NewElection(rc, "safety", distlock.WithTTL(w.ttl))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	o := &observer{w: w, name: name, done: make(chan struct{}), news: make(chan struct{})}
	ch := e.Observe(ctx)
	go func() {
		defer close(o.done)
		for l := range ch {
			op := history.Op{Kind: history.Observed, At: history.Now(), Key: e.Key(), Client: name,
				Leader: l.Value, Token: l.Token}
			w.rec.Add(op)
			o.mu.Lock()
			o.seen = append(o.seen, op)
			close(o.news)
			o.news = make(chan struct{})
			o.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-o.done
	})
	return o
}

// waitLeader waits until the observer has received leader with token (""
// and 0: nobody leads), for within plus what the scheduling delay
// meanwhile explains, and returns when it received it.
func (o *observer) waitLeader(t *testing.T, leader string, token int64, within time.Duration) history.Mono {
	t.Helper()
	var at history.Mono
	o.w.waitFor(t, within, "observer "+o.name+" to see "+leader, func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		for _, op := range o.seen {
			if op.Leader == leader && op.Token == token {
				at = op.At
				return true
			}
		}
		return false
	})
	return at
}

// leaderValue returns the owner of the value in the election's lease key,
// or "" if there is none.
func (w *world) leaderValue() string {
	w.t.Helper()
	v, ok := w.leaseValue()
	if !ok {
		return ""
	}
	owner, _, _ := strings.Cut(v, "#")
	return owner
}

// checkElection checks the world's history as that of a lock (one leader
// per instant) with its observers, and the counts that show the check saw
// something: every term an observer saw was recorded, and nobody led
// beside anybody else.
func (w *world) checkElection(t *testing.T, scenario string, minObserved int) history.Report {
	t.Helper()
	r := w.requireClean(scenario)
	assert.Zero(t, r.UnknownTerms, "observers saw terms nobody was granted")
	assert.GreaterOrEqual(t, r.Observations, minObserved)
	assert.Equal(t, 1, r.Peak)
	return r
}

// electionWorld is a world whose election is led by a helper process "l",
// with a candidate "c2" of the test in line and an observer.
type electionWorld struct {
	*world
	child   *helperHolder
	granted history.Op
	wait    *waiter
	obs     *observer
}

func newElectionWorld(t *testing.T) *electionWorld {
	t.Helper()
	w := newWorld(t, permitTTL)
	e := &electionWorld{world: w, obs: w.observe("o")}
	e.child, e.granted = w.startPermitHelper("l", "election")
	e.wait = w.newContender("c2", electionOf(t, w.ttl)).takeInBackground(t.Context())
	w.waitFor(t, eventually, "c2 in line", func() bool {
		n, err := w.srv.MustDo("ZCARD", w.key+":queue").AsInt64()
		return err == nil && n == 1
	})
	w.waitFor(t, 2*w.ttl, "a renewal by the helper", func() bool { return e.child.confirmations() >= 2 })
	e.obs.waitLeader(t, "l", e.granted.Token, eventually)
	return e
}

// newLeader checks the candidate that took over from a leader whose lease
// could expire at expiry: not before then, with a larger token, and that
// the observer saw it within slack of its grant (and what the scheduling
// delay explains). It returns how long after expiry it was granted.
func (e *electionWorld) newLeader(t *testing.T, h *holding, expiry history.Mono, old int64) time.Duration {
	t.Helper()
	assert.GreaterOrEqual(t, history.At(h.granted), expiry, "c2 led before the old leader's lease could expire")
	assert.Greater(t, h.token, old, "c2's term token")
	seen := e.obs.waitLeader(t, "c2", h.token, slack)
	late := e.delayed(h.granted, monoTime(seen))
	assert.Less(t, seen.Sub(history.At(h.granted)), slack+late, "the observer saw c2 long after its grant")
	return history.At(h.granted).Sub(expiry)
}

// resign releases the new leader's guard and waits for the observer to see
// that nobody leads.
func (e *electionWorld) resign(t *testing.T, h *holding) {
	t.Helper()
	e.releaseHeld(t, h)
	e.obs.waitLeader(t, "", 0, eventually)
}

// TestSafetyElectionLeaderPaused: the leader is a helper process, stopped
// (SIGSTOP) past its lease; the candidate in line leads only once that
// lease can have expired, the observer sees the new leader at once, and
// the old leader's first State after the resume says it does not lead.
// Killed (SIGKILL) instead, the leader is replaced within its TTL and a
// bound widened only by the measured scheduling delay.
func TestSafetyElectionLeaderPaused(t *testing.T) {
	t.Parallel()
	subtest(t, "stopped", 1, func(t *testing.T) {
		e := newElectionWorld(t)
		h, paused, expiry := faultHelper(t, e.child, false, e.wait, "c2 never led")
		after := e.newLeader(t, h, expiry, e.granted.Token)

		resumed, first := resumeAndStop(t, e.child, "the old leader")
		assert.Equal(t, "c2", e.leaderValue(), "the leader in Redis after the old leader's release")
		e.resign(t, h)
		e.checkElection(t, label("election-7", "stopped"), 3)
		figure(t, label("election-7", "stopped"), "stopped_ms", resumed.Sub(paused), "c2_after_expiry_ms", after,
			"first_state_after_resume", map[bool]string{true: "acquired", false: "lost"}[first.Held])
	})
	subtest(t, "killed", 1, func(t *testing.T) {
		e := newElectionWorld(t)
		h, killed, expiry := faultHelper(t, e.child, true, e.wait, "c2 never led")
		after := e.newLeader(t, h, expiry, e.granted.Token)
		late := e.delayed(monoTime(expiry), h.granted)
		assert.Less(t, after, slack+late, "c2 led long after the dead leader's lease expired (%v explained by scheduling)", late)
		e.resign(t, h)
		e.checkElection(t, label("election-7", "killed"), 3)
		figure(t, label("election-7", "killed"), "c2_after_kill_ms", history.At(h.granted).Sub(killed),
			"c2_after_expiry_ms", after)
	})
}

// newLeaderA starts a world whose election is led by "a", a contender of
// the test (no helper process), with an observer that has seen a lead.
func newLeaderA(t *testing.T) (*electionWorld, *contender, *holding) {
	t.Helper()
	w := newWorld(t, permitTTL)
	e := &electionWorld{world: w, obs: w.observe("o")}
	a := w.newContender("a", electionOf(t, w.ttl))
	ha, err := a.take(t.Context())
	require.NoError(t, err)
	e.obs.waitLeader(t, "a", ha.token, eventually)
	return e, a, ha
}

// TestSafetyElectionPartition: the leader, a client of the test, is cut
// off for longer than the TTL. It reports Lost by its deadline; the
// candidate in line leads only after the old lease can have expired, and
// the observer sees it; after the heal the old leader stays Lost, its
// write under the old term is refused, and its Release leaves the new
// leader's lease alone.
func TestSafetyElectionPartition(t *testing.T) {
	t.Parallel()
	repeat(t, runs(t, 1), func(t *testing.T) {
		e, a, ha := newLeaderA(t)
		w := e.world
		require.True(t, ha.increment())
		wait := w.newContender("c2", electionOf(t, w.ttl)).takeInBackground(t.Context())
		a.waitRenewals(t, ha, 1)

		l := a.cutOff(t, ha)
		h := <-wait.got
		require.NotNil(t, h, "c2 never led")
		after := e.newLeader(t, h, history.At(ha.expiry(l)), ha.token)
		require.True(t, h.increment())

		a.heal(t, ha)
		assert.Zero(t, ha.regainCount(), "a regained the lead that c2 holds")
		assert.False(t, ha.increment(), "a's write under its old term was accepted")
		ha.mustRelease(t, distlock.Lost)
		assert.Equal(t, "c2", w.leaderValue(), "the leader in Redis after a's release")
		e.resign(t, h)
		r := e.checkElection(t, "election-2", 3)
		assert.Equal(t, 1, r.Refused)
		figure(t, "election-2", "lost_lead_ms", ha.lead(l), "c2_after_expiry_ms", after, "c2_errors", wait.failed)
	})
}

// TestSafetyElectionRedisRestarted: Redis is killed under a leader with a
// candidate in line, and restarted without persistence once the leader has
// reported Lost. The candidate then leads with a larger token (tokens come
// from the server clock), the observer, whose subscription broke, sees it,
// and nobody led beside anybody else.
func TestSafetyElectionRedisRestarted(t *testing.T) {
	t.Parallel()
	repeat(t, runs(t, 1), func(t *testing.T) {
		e, a, ha := newLeaderA(t)
		w := e.world
		wait := w.newContender("c2", electionOf(t, w.ttl)).takeInBackground(t.Context())
		a.waitRenewals(t, ha, 1)

		killed := time.Now()
		w.srv.Kill()
		l := ha.waitLost(t, w.ttl+slack)
		a.lostInTime(t, ha, l)
		w.srv.Restart()
		restarted := time.Now()
		h := <-wait.got
		require.NotNil(t, h, "c2 never led")
		assert.Greater(t, h.token, ha.token, "the term token went back after the restart")
		seen := e.obs.waitLeader(t, "c2", h.token, eventually)
		ha.mustRelease(t, distlock.Lost)
		e.resign(t, h)
		e.checkElection(t, "election-8", 3)
		figure(t, "election-8", "down_ms", restarted.Sub(killed), "c2_after_restart_ms", h.granted.Sub(restarted),
			"observer_after_grant_ms", seen.Sub(history.At(h.granted)), "c2_errors", wait.failed)
	})
}
