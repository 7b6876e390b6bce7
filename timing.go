package distlock

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/distkit-go/distlock/lease"
)

// The timing of a lease, in one place. Every figure derives from the TTL T
// (or, for a lease passed to a waiter, its claim window) and from the
// clock-rate and scheduling bounds below; SAFETY.md states the contract
// they implement.

const (
	// driftDivisor bounds the relative rate error between our clock and
	// Redis's: 1/100 of the TTL.
	driftDivisor = 100
	// schedulingSlack is added to the margin so that a timer that fires
	// late on a busy machine still reports Lost before Redis can expire the
	// key: a 2-core machine under load delays timers by 10 to 30 ms.
	schedulingSlack = 30 * time.Millisecond
)

// margin returns how long before the end of the lease (counted from the
// send time of the last confirmed write) the guard stops reporting
// Acquired: the clock-rate error over the TTL plus the scheduling slack.
func margin(ttl time.Duration) time.Duration {
	return ttl/driftDivisor + schedulingSlack
}

// leaseDeadline returns the deadline D of a lease of ttl whose last
// confirmed write was sent at sent: the guard vouches for the lease only
// before it. Redis cannot expire the key before sent + ttl.
func leaseDeadline(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - margin(ttl))
}

// renewAfter is how long after the send time of the last confirmed write
// the next renewal is sent: a third of the lease, so that two renewals in a
// row can fail before the deadline and the third still lands in time. For a
// lease passed to a waiter (its claim window), the first renewal, which
// extends it to the full TTL, comes a third of the window in.
func renewAfter(ttl time.Duration) time.Duration { return ttl / 3 }

// renewSlack is how much earlier than due a renewal of a lease renewed
// every period may be sent, so that the renewals of many guards of one
// client share a batch (batcher.go): a twentieth of the period, at most
// maxRenewSlack. A renewal sent early is as safe as one sent on time (its
// lease is counted from its send time); it only comes a little more
// often: at most 5% more renewals. A lone guard's renewal is still sent
// when it is due: the slack lets it wait for company, never longer.
func renewSlack(period time.Duration) time.Duration {
	return min(max(period, 0)/20, maxRenewSlack)
}

// maxRenewSlack bounds renewSlack: the fraction of a guard's life that its
// renewal child spends waiting for its batch (a goroutine each).
const maxRenewSlack = 250 * time.Millisecond

// lostRetry is how long a Lost guard waits between renewals: a ninth of the
// TTL, so that a short outage heals quickly without a storm of calls.
func lostRetry(ttl time.Duration) time.Duration { return ttl / 9 }

// refreshAfter is how often a waiter in line refreshes its place: half the
// claim window, so that one refresh can be late or lost and the place still
// does not lapse.
func refreshAfter(claim time.Duration) time.Duration { return claim / 2 }

// usableGrant reports whether a lease passed to a waiter, whose deadline is
// d, leaves enough of its claim window to hold it at once: a third of the
// window, the time until its first renewal. Otherwise the waiter claims it
// with a call of its own, which grants it the full TTL.
func usableGrant(d time.Time, claim time.Duration) bool {
	return time.Until(d) >= renewAfter(claim)
}

const (
	// expiryGrace is added to the holder's remaining TTL (which Redis
	// rounds down to the millisecond) before the first waiter in line asks
	// again, so that it asks just after a holder that died without
	// releasing has expired.
	expiryGrace = time.Millisecond

	// cleanupTimeout bounds the cancel that an acquire call sends, before
	// it asks again, for an orphan of its own engine that an earlier
	// clean-up could not remove (see engine.cleanup).
	cleanupTimeout = 250 * time.Millisecond

	// minReleaseWait is the least time the final delete is given, even when
	// the lease has already lapsed: a lease lost to a failed renewal may
	// still hold our value in Redis, and deleting it frees the lock for the
	// next holder.
	minReleaseWait = 100 * time.Millisecond
)

// backoff paces the retries of something that failed: each pause doubles
// from first up to most, and is drawn between half of it and all of it, so
// that clients that failed together (a Redis restart, a proxy that reset
// every connection) do not all retry together. The zero pause count starts
// at first; reset starts over after a success. It is used by one goroutine.
type backoff struct {
	first, most time.Duration
	step        time.Duration // the current pause before jitter; 0 before the first
}

// next returns the pause before the next retry.
func (b *backoff) next() time.Duration {
	if b.step == 0 {
		b.step = b.first
	} else {
		b.step = min(2*b.step, b.most)
	}
	half := b.step / 2
	return half + rand.N(b.step-half+1)
}

// reset makes the next pause the first again.
func (b *backoff) reset() { b.step = 0 }

// Back-off bounds.
const (
	// A renewal or a release that got no reply is retried after 10 ms at
	// first: a reset connection is usually replaced at the first retry,
	// and a proxy that restarts or a Sentinel failover takes a few hundred
	// milliseconds. Retries stay at most a ninth of the TTL apart (and
	// never past the lease deadline), so a blip costs a few calls.
	firstRetry = 10 * time.Millisecond
	// A subscription that broke is set up again after 20 ms at first, and
	// at most a second apart.
	minResubscribe = 20 * time.Millisecond
	maxResubscribe = time.Second
)

// tries is what the tries of a call sent again until Redis answers it
// have learnt (see untilAnswered).
type tries struct {
	answered   bool    // Redis answered the last try: a reply, or an error reply
	unanswered bool    // some try got no reply, so it may have run
	err        error   // the last try's error: nil or an error reply once answered
	cause      error   // the last failure other than a try's own deadline
	pause      backoff // the pause before the next try
}

// untilAnswered calls try until Redis answers it (a reply or an error
// reply: the call ran, or did not run at all), until dl passes or until
// ctx ends, and records what it learnt in t. A try that fails without a
// reply (a reset connection, a refused dial, a timeout) may or may not
// have run, so it is sent again after a pause that grows from firstRetry
// to maxReleaseRetry; the call must be one that can be repeated (the
// final delete, a Downgrade). Each try's context ends at dl. t may carry
// the tries of an earlier call of the same request, which this one goes
// on from.
//
// The lease client's Release sends its script again at once, a few times,
// when a call fails on a broken pooled connection (lease.releaseTries):
// rueidis finds such a connection dead only when a command fails on it,
// although Redis is reachable, and that failure says nothing about Redis.
// That loop stays below this one: a pause here means Redis itself did not
// answer, and is worth its back-off.
func untilAnswered(ctx context.Context, dl time.Time, t *tries, try func(ctx context.Context) error) {
	if t.pause.first == 0 {
		t.pause = backoff{first: firstRetry, most: maxReleaseRetry}
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		cctx, cancel := context.WithDeadline(ctx, dl)
		err := try(cctx)
		cancel()
		t.err = err
		if err == nil || lease.IsReply(err) {
			t.answered = true
			return
		}
		t.unanswered = true
		if !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			t.cause = err
		}
		wait := t.pause.next()
		if ctx.Err() != nil || !time.Now().Add(wait).Before(dl) {
			return
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return
		}
	}
}
