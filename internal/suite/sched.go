package suite

import (
	"math"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A bound on how soon something happens ("Lock returns at once once its ctx
// is done", "the waiter takes the lock at expiry") holds on an idle machine
// with a wide margin, but a loaded 2-core machine under -race can keep this
// process off the CPU for hundreds of milliseconds. A test that checks such
// a bound measures the scheduling delay of its own run with a schedProbe
// and widens the bound by what the probe saw in the interval, and only by
// that: a bound missed while the probe saw no delay is a bug.

// probeTick is how often a schedProbe wakes up to measure.
const probeTick = 5 * time.Millisecond

// schedProbe measures how late this process's goroutines run, in two
// ways. Its goroutine sleeps probeTick at a time and records how late each
// wake-up came: a process that gets no CPU, or timers that fire late, show
// as late wake-ups. And at each wake-up it reads the runtime's histogram of
// how long runnable goroutines waited for a CPU (/sched/latencies:seconds),
// which shows a goroutine kept waiting behind others while the probe's own
// ran on time.
type schedProbe struct {
	stop     chan struct{} // closed to stop the goroutine
	stopOnce sync.Once
	done     chan struct{} // closed when the goroutine has returned

	mu    sync.Mutex
	wakes []probeWake
	due   time.Time     // when the next wake-up is due; zero once stopped
	woke  chan struct{} // closed and replaced at every wake-up
}

// probeWake is one wake-up: due when it was due, at when it came, and wait
// the longest a goroutine waited for a CPU since the previous wake-up.
type probeWake struct {
	due, at time.Time
	wait    time.Duration
}

// startSchedProbe starts a probe that runs until t ends.
func startSchedProbe(t *testing.T) *schedProbe {
	p := newSchedProbe()
	t.Cleanup(p.close)
	return p
}

// newSchedProbe starts a probe that runs until its close.
func newSchedProbe() *schedProbe {
	p := &schedProbe{stop: make(chan struct{}), done: make(chan struct{}), woke: make(chan struct{})}
	p.due = time.Now().Add(probeTick)
	waits := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	var counts []uint64
	worstWait(waits, &counts) // the baseline: only waits from now on count
	go p.run(waits, counts)
	return p
}

// close stops the probe's goroutine and waits for it; a second close does
// nothing.
func (p *schedProbe) close() {
	p.stopOnce.Do(func() { close(p.stop) })
	<-p.done
}

func (p *schedProbe) run(waits []metrics.Sample, counts []uint64) {
	defer close(p.done)
	timer := time.NewTimer(probeTick)
	defer timer.Stop()
	for {
		select {
		case <-p.stop:
			p.mu.Lock()
			p.due = time.Time{}
			p.mu.Unlock()
			return
		case <-timer.C:
		}
		now := time.Now()
		wait := worstWait(waits, &counts)
		p.mu.Lock()
		p.wakes = append(p.wakes, probeWake{due: p.due, at: now, wait: wait})
		p.due = now.Add(probeTick)
		close(p.woke)
		p.woke = make(chan struct{})
		p.mu.Unlock()
		timer.Reset(probeTick)
	}
}

// probeSettle bounds how long delay waits for the probe's next wake-up.
const probeSettle = 2 * time.Second

// delay returns the worst lateness of the probe's wake-ups that overlap
// [from, to]. It first waits (probeSettle at most) for a wake-up after to,
// so that a starvation that lasted past to counts in full.
func (p *schedProbe) delay(from, to time.Time) time.Duration {
	timeout := time.NewTimer(probeSettle)
	defer timeout.Stop()
	for {
		p.mu.Lock()
		woke := p.woke
		caughtUp := p.due.IsZero() || len(p.wakes) > 0 && p.wakes[len(p.wakes)-1].at.After(to)
		p.mu.Unlock()
		if caughtUp {
			break
		}
		select {
		case <-woke:
		case <-timeout.C:
			return time.Since(to) // the probe has not woken since: it is that late at least
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var worst time.Duration
	for _, w := range p.wakes {
		if w.at.Before(from) || w.due.Add(-probeTick).After(to) {
			continue // it measured nothing of [from, to]
		}
		worst = max(worst, w.wait) // waits since the previous wake-up, which came by to
		if !w.due.After(to) {
			worst = max(worst, w.at.Sub(w.due))
		}
	}
	return worst
}

// worstWait reads the histogram of scheduling latencies into sample and
// returns the upper bound of the highest bucket that gained a count since
// counts, which it then updates: the longest a goroutine waited for a CPU
// meanwhile, rounded up to the histogram's resolution.
func worstWait(sample []metrics.Sample, counts *[]uint64) time.Duration {
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0 // not supported by this runtime
	}
	h := sample[0].Value.Float64Histogram()
	var worst time.Duration
	for i, n := range h.Counts {
		if n == 0 || i < len(*counts) && n == (*counts)[i] {
			continue
		}
		bound := h.Buckets[i+1]
		if math.IsInf(bound, 1) {
			bound = h.Buckets[i]
		}
		worst = max(worst, time.Duration(bound*float64(time.Second)))
	}
	*counts = append((*counts)[:0], h.Counts...)
	return worst
}

// assertSoon checks that took, measured over [from, from+took], stays
// below bound widened by the scheduling delay p saw in that interval, and
// says all three when it does not.
func assertSoon(t *testing.T, p *schedProbe, from time.Time, took, bound time.Duration, what string) bool {
	t.Helper()
	late := p.delay(from, from.Add(took))
	return assert.Less(t, took, bound+late, "%s: took %v; the bound is %v plus the scheduling delay the probe measured meanwhile, %v",
		what, took.Round(time.Millisecond), bound, late.Round(time.Millisecond))
}

// skipIfStarved skips t, saying what it measured, when p saw a scheduling
// delay of at least budget between from and now: a lease lost meanwhile may
// then be the machine's doing (a renewal not sent, or its reply not read,
// in time), so a test whose precondition is that no lease is lost cannot
// judge it. With less delay it returns, and a lost lease is for the test to
// fail.
func skipIfStarved(t *testing.T, p *schedProbe, from time.Time, budget time.Duration, what string) {
	t.Helper()
	now := time.Now()
	if late := p.delay(from, now); late >= budget {
		t.Skipf("%s, but the probe measured a scheduling delay of %v in the %v before, at least the %v the lease had to spare: "+
			"the machine, not the library, may have taken it", what, late.Round(time.Millisecond), now.Sub(from).Round(time.Millisecond), budget)
	}
}

// renewalBudget is how long a guard of a lease of ttl can be kept from
// running without losing it: its deadline comes ttl minus the margin after
// a renewal's send, and the next renewal is due a third of ttl after it.
func renewalBudget(ttl time.Duration) time.Duration { return ttl - ttl/3 - margin(ttl) }

// waitUntil polls cond every pollEvery until it holds. It fails t with
// what() (read then, so that it can say the state at the end) and what
// the probe measured, once cond has not held for within plus the scheduling
// delay a probe measured meanwhile: on a loaded machine the thing awaited
// (a waiter joining the line, a room lingering out) can be late by what
// the machine kept this process from running, and only by that.
func waitUntil(t *testing.T, within time.Duration, cond func() bool, what func() string) {
	t.Helper()
	p := newSchedProbe()
	defer p.close()
	start := time.Now()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for !cond() {
		now := <-tick.C
		if now.Sub(start) < within {
			continue
		}
		if late := p.delay(start, now); time.Since(start) >= within+late {
			if cond() {
				return
			}
			t.Fatalf("%s: not within %v plus the scheduling delay the probe measured meanwhile, %v",
				what(), within, late.Round(time.Millisecond))
		}
	}
}

// SchedProbe is a schedProbe for the tests of other packages (the goredis
// module's own): a bound those tests check is widened by what it measured,
// and only by that.
type SchedProbe struct{ p *schedProbe }

// StartSchedProbe starts a probe that runs until t ends.
func StartSchedProbe(t *testing.T) SchedProbe { return SchedProbe{startSchedProbe(t)} }

// Delay returns the worst scheduling delay the probe saw between from and
// to, once it has woken after to (see schedProbe.delay).
func (p SchedProbe) Delay(from, to time.Time) time.Duration { return p.p.delay(from, to) }

// RenewalBudget is how long a guard of a lease of ttl can be kept from
// running without losing it (see renewalBudget).
func RenewalBudget(ttl time.Duration) time.Duration { return renewalBudget(ttl) }
