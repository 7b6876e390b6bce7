// Package distlock is a distributed mutual-exclusion lock over Redis, for
// work that many machines could do but only one should do at a time: a cron
// job, leader duties, a critical section per customer or per order.
//
// A lock is a lease: a Redis key that names the holder and expires after a
// TTL unless it is renewed. distlock renews it in the background, tells the
// holder the moment its ownership is in doubt, hands out fencing tokens, and
// releases the key when the holder is done or its context is cancelled.
//
// # Usage
//
// Build one [Mutex] per lock name and call [Mutex.Lock]. The returned [Guard]
// is the acquisition; run the critical section under [Guard.Context] and end
// it with [Guard.Release]:
//
//	m, err := distlock.NewMutex(client, "nightly-report", distlock.WithTTL(10*time.Second))
//	if err != nil {
//		return err
//	}
//	g, err := m.Lock(ctx)
//	if err != nil {
//		return err // ctx ended, max wait ran out, or Redis failed
//	}
//	defer g.Release(context.WithoutCancel(ctx))
//	return buildReport(g.Context(), g.Token())
//
// [Mutex.Lock] waits; [Mutex.TryLock] tries once and returns an error
// matching [ErrNotAcquired] if someone else holds the lock;
// [Mutex.TryLockFor] waits up to a timeout. All of them take the context that
// bounds the wait and also the hold: cancelling it after the lock was
// acquired releases the lock. This makes the usual Go shape work:
//
//	ctx, cancel := context.WithCancel(ctx)
//	defer cancel() // releases the lock
//	g, err := m.Lock(ctx)
//
// Because of that, do not pass Lock a context with a short timeout meant for
// the wait alone; use [WithMaxWait] or [Mutex.TryLockFor] to bound the wait.
//
// # What the lock guarantees, and what it cannot
//
// A lease is not a mutex. Redis expires the key by its own clock whether or
// not the holder is still working, and no library can stop a holder that was
// paused (a long GC pause, a stopped VM, a swapped-out process) from waking up
// after its lease ended and carrying on. What distlock guarantees is its side
// of the contract:
//
//   - A guard reports [Acquired] only while its lease is certainly still
//     valid. It counts the lease from the moment it sent the last write that
//     Redis confirmed, on the monotonic clock, and gives it up a safety margin
//     (1% of the TTL plus 30ms) before Redis could expire it. [Guard.State]
//     checks the clock each time it is called, so a late timer cannot make it
//     vouch for a lapsed lease.
//   - Every Redis call made for a held lock has a deadline no later than that
//     point, so a hanging call cannot keep the guard believing it holds the
//     lock.
//   - Every acquisition gets a fencing token ([Guard.Token]) strictly greater
//     than every token issued before for the same lock.
//   - Renewals and releases only ever touch the key while it holds this
//     acquisition's own value; a renewal never re-creates an expired key.
//
// The fencing token is what closes the gap: pass it along with every write the
// lock protects, and let the storage reject a write whose token is lower than
// the highest it has seen. Without that, the lock is an efficiency measure
// (it makes duplicate work rare), not a correctness guarantee.
//
// The guarantees also rest on Redis: one primary (or replicas that
// acknowledge writes before a failover can promote them), the noeviction
// memory policy, and clocks that do not jump. A Redis restart without
// persistence forgets every lease; holders find out at their next renewal.
//
// # Redis Cluster and Sentinel
//
// [NewMutex] takes any rueidis client: one built for a single Redis, for Redis
// Cluster (InitAddress lists some of its nodes) or for Sentinel
// (rueidis.SentinelOption names the monitored primary). The lock works the
// same on all three, but what a failure of Redis does to it differs:
//
//   - A single primary is the single point of failure. If it restarts
//     without its data, every lease is forgotten and a waiter can acquire
//     while the previous holder still reports [Acquired] until its next
//     renewal.
//   - On Redis Cluster, all keys of one lock share a hash slot, so every
//     script runs on one primary, and different locks spread over the
//     primaries. Resharding (ASK, then MOVED) and a manual failover (CLUSTER
//     FAILOVER, which waits for the replica to catch up) do not disturb a held
//     lock.
//   - With replicas (Sentinel, or Cluster after a primary crashes),
//     replication is asynchronous: a failover can promote a replica that
//     never received a lease, and the lock is then granted a second time
//     while the first holder still reports Acquired.
//
// [WithReplicaAck] narrows that window: every acquisition and renewal waits
// (Redis WAIT, on the connection that made the write, on the primary that
// serves the lock's slot) until the given number of replicas have the
// write. Lock then returns a lock only once the replicas hold it, and
// reports an error matching [ErrNotReplicated] otherwise; a renewal that is
// not acknowledged makes the guard [Lost]. A lock whose lease the promoted
// replica acknowledged survives the failover. WAIT is not consensus: a
// replica that did not acknowledge can still be promoted, and after a
// failover that leaves too few replicas nothing can be acknowledged. Neither
// option, nor any Redis deployment, stops a paused holder from outliving
// its lease: fencing tokens are still needed end to end. TOPOLOGIES.md in
// the repository has the details.
//
// # Renewal and loss
//
// Each [Guard] runs one goroutine, its actor, that renews the lease every TTL/3.
// The guard becomes [Lost] when a renewal is refused (the key expired, was
// deleted or now holds someone else's value), when a renewal fails (Redis
// unreachable or erroring), or when the lease deadline passes without a
// confirmed renewal, even while a renewal call is still waiting for its
// answer. After a failure it retries every TTL/9, and if a renewal then proves
// the key still holds this acquisition's value, the guard returns to
// [Acquired]: a brief network blip heals itself. A lease that really expired
// cannot come back.
//
// # Waiting
//
// [Mutex.Lock] does not poll, and waiters are served first come, first
// served across processes. Every lock has one line in Redis. A Lock call that
// finds the lock held stands in that line, and the release script itself, in
// the same atomic step that deletes the holder's value, passes the lock to
// the first waiter in line (with a new fencing token) and tells it: on the
// sharded pub/sub channel of the waiter's process, or, when the releasing
// guard is in the same process, straight from the release's reply. So a
// release wakes exactly one waiter, wherever it is, and the lock is never
// raced for.
//
// A waiter that is passed the lock may have died meanwhile. The lease it is
// handed therefore lasts only the claim window ([WithClaimWindow], half a
// second by default) until the new holder renews it to the full TTL, and a
// waiter that has not refreshed its place for a claim window (it refreshes
// every half window) is skipped. A dead waiter thus costs the others at most
// a claim window. The first waiter in line also watches the holder's lease,
// so a holder that died without releasing is replaced the moment Redis
// expires it.
//
// Waiting costs one subscription per lock and process, no CPU, the first
// call and a refresh every half claim window (four commands a second). A
// contended acquisition takes two commands in all: the call that stands in
// line and the release that passes the lock on. A waiter whose ctx ends
// returns at once; its place (and a lock passed to it meanwhile) is
// cancelled in the background, and the next waiter gets the lock at once.
// When the server refuses pub/sub, waiters poll every [DefaultRetryInterval]
// instead. [WithRetryInterval] and [Mutex.TryLockFor] give plain polling, and
// [Mutex.TryLock] a single attempt; none of them stands in line, and none of
// them takes a free lock from the waiter first in line.
//
// The protocol, its invariants and what happens on each fault are written
// down in the documentation of the lease package.
//
// # Events
//
// There are three ways to learn about a loss, from coarse to fine:
//
//   - [Guard.Context] is cancelled at the first loss, with a cause matching
//     [ErrLost] (read it with [context.Cause]). Run the critical section under
//     it and it stops when the lock is in doubt.
//   - [Guard.State] answers "do I hold it right now?" without a round trip.
//   - [Guard.Subscribe] delivers every transition, with its time and reason,
//     for logging, metrics or code that wants to pause and resume.
//
// [Guard.Done] is closed once the guard has been released.
//
// # Goroutines
//
// A held lock costs one goroutine, plus one short-lived goroutine per renewal
// in flight. The actor exits when the guard is released, and nothing it
// started outlives it. A lock that has waiters in this process also has one
// goroutine that keeps its room's subscription; it ends a quarter of a
// second after the last waiter leaves. A waiter that gives up leaves a
// short-lived goroutine that cancels its place in line. Subscribers never slow it down: their channels are
// buffered and drop their oldest event rather than block. A guard that is
// neither released nor cancelled keeps its lock, and its goroutine, until the
// process exits, just as a forgotten Unlock would.
//
// # Keys
//
// A lock named "job" in the default namespace lives at "distlock:{job}", with
// its fencing counter at "distlock:{job}:fence" (kept a day after the last
// acquisition) and, while anyone waits, its line at "distlock:{job}:queue"
// and "distlock:{job}:waiters"; waiting rooms listen on the channels
// "distlock:{job}:wake:<room>". When Lock gives up on an
// attempt whose reply it did not see, it also writes
// "distlock:{job}:void:<value>" for one TTL, which makes that attempt
// harmless if it reaches Redis late. The braces are a Redis Cluster hash
// tag: all keys of one lock share a slot, and different locks spread over
// the cluster. Lock names and namespaces are printable UTF-8 and must not
// contain braces; see [NewMutex].
package distlock
