// Package distlock is a distributed mutual-exclusion lock over Redis, for
// work that many machines could do but only one should do at a time: a cron
// job, leader duties, a critical section per customer or per order. On the
// same engine it offers a counting [Semaphore] (up to N holders at once), a
// leader [Election] and a read-write lock, [RWMutex] (many readers or one
// writer); see the sections "Semaphores and elections" and "Read-write
// locks".
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
//	m, err := distlock.NewMutex(client, "customer-42", distlock.WithTTL(10*time.Second))
//	if err != nil {
//		return err
//	}
//	g, err := m.Lock(ctx)
//	if err != nil {
//		return err // ctx ended, max wait ran out, or Redis failed
//	}
//	defer g.Release(context.WithoutCancel(ctx)) // returns within ReleaseTimeout, even with Redis down
//	return updateBalance(g.Context(), g.Token())
//
// Lock makes every caller run the critical section in turn. For a job that
// each of N replicas is scheduled to run but only one should, use
// [Mutex.TryLock] and skip on [ErrNotAcquired] (see "Ending" below).
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
// # Ending: Release and Leave
//
// [Guard.Release] deletes the lease (only if it still holds this
// acquisition's value), so the next waiter gets the lock at once. From the
// moment it is called the guard reports [Released] and its context is
// cancelled; it never reports [Acquired] again. Its ctx bounds only the
// wait: when ctx has no deadline, Release waits at most [ReleaseTimeout]
// (2 s), and the delete itself never outlives the lease. If the wait ends
// first, Release returns an error while the delete goes on in the
// background, and [Guard.Done] is closed when it is over. The idiom to
// copy is
//
//	defer g.Release(context.WithoutCancel(ctx))
//
// which keeps ctx's values (for tracing), ignores its cancellation (a
// cancelled ctx would make Release return before the delete had its
// answer) and returns within ReleaseTimeout whatever Redis does. To see how
// it ended, check the result:
//
//	defer func() {
//		if st, err := g.Release(context.WithoutCancel(ctx)); err != nil || st != distlock.Released {
//			log.Printf("release of %s: %v, %v (the lease expires on its own within the TTL)", g.Key(), st, err)
//		}
//	}()
//
// [Guard.Leave] ends the guard without deleting the lease: renewals stop and
// the key stays until it expires, one TTL after the last renewal. That
// serves a job that must run at most once per period even though its
// replicas start seconds apart (cron on every machine): each replica calls
// [Mutex.TryLock] with a TTL a little shorter than the period (the key
// expires before the next period begins, if the work takes less than the
// rest), the one that gets the lock does the work and calls Leave, and the
// others, including those that start after the work is done, find the lock
// held and skip:
//
//	m, err := distlock.NewMutex(client, "hourly-digest", distlock.WithTTL(50*time.Minute))
//	...
//	g, err := m.TryLock(ctx)
//	if errors.Is(err, distlock.ErrNotAcquired) {
//		return nil // another replica has it, or had it this period
//	} else if err != nil {
//		return err
//	}
//	if err := sendDigest(g.Context()); err != nil {
//		g.Release(context.WithoutCancel(ctx)) // failed: free the lock for a later try
//		return err
//	}
//	_, err = g.Leave(context.WithoutCancel(ctx)) // done: hold the key until it expires
//	return err
//
// For "exactly one of the replicas that start together runs it, the others
// skip" TryLock and Release are enough; Lock would make the others wait
// and then run the job again, one after the other.
//
// [Guard.Deadline] says until when the guard vouches for the lease: the
// time up to which State reports Acquired unless a renewal moves it on.
// Before a step that must finish under the lock, check that it fits:
//
//	if time.Until(g.Deadline()) < step {
//		return errNoTimeLeft // or wait for the next renewal
//	}
//
// # Semaphores and elections
//
// A [Semaphore] lets up to a fixed number of holders in at once. Each permit
// is a lease of its own, and [Semaphore.Acquire], [Semaphore.TryAcquire]
// and [Semaphore.TryAcquireFor] return the same [Guard] as Lock, renewed and
// released the same way:
//
//	s, err := distlock.NewSemaphore(client, "video-encoders", 4)
//	...
//	g, err := s.Acquire(ctx) // waits in line while all 4 permits are held
//	if err != nil {
//		return err
//	}
//	defer g.Release(context.WithoutCancel(ctx))
//	return encode(g.Context(), g.Token())
//
// A holder that dies gives its permit back when its lease ends, waiters are
// served first come, first served, and every grant has a fencing token. What
// happens when the number of permits changes between deployments is
// written down on [Semaphore].
//
// An [Election] picks one leader among candidates. [Election.Campaign] waits
// until the candidate leads and returns the Guard of its term; resigning is
// [Guard.Release], which hands the lead to the next candidate at once. Anyone
// can follow the leader with [Election.Observe] (a channel that always holds
// the latest [Leader]) or ask once with [Election.Leader]. A term ends under
// the same contract as a lock, and its token orders the writes of
// successive leaders.
//
// # Read-write locks
//
// An [RWMutex] lets many readers in at once, or one writer. [RWMutex.RLock]
// and [RWMutex.Lock] (and their Try forms) return the same [Guard]:
//
//	rw, err := distlock.NewRWMutex(client, "config")
//	...
//	g, err := rw.RLock(ctx) // waits while a writer holds it or stands ahead
//	if err != nil {
//		return err
//	}
//	defer g.Release(context.WithoutCancel(ctx))
//	return readConfig(g.Context(), g.Token())
//
// Readers and writers wait in one line, in arrival order: a reader is
// granted when no writer holds the lock or stands ahead of it, a writer
// when nobody holds it or stands ahead, so neither starves. Every hold has
// its own lease (a crashed reader stops counting when its own lease ends)
// and its own fencing token. [Guard.Downgrade] turns a write hold into a
// read hold in one step; there is no upgrade (release, then Lock).
//
// A [Mutex] or an [Election] of the same name is the same lock, held the
// way [RWMutex.Lock] holds it, in the same line and fencing sequence; so is
// "distlock run" of the name (-x, the default, as Lock; -s as RLock). A
// service that guards a job with a Mutex and a cron line that runs it
// under "distlock run" of the same name therefore never run it at once.
//
// # Several names at once
//
// A [MultiMutex] holds several names as one: [MultiMutex.Lock] returns a
// single [Guard] that holds every name, or an error and none of them.
// Each name is the same lock as a Mutex of that name, so a MultiMutex on
// {"account-17", "account-42"} and a Mutex on "account-42" exclude each
// other, and wait for each other in the name's line:
//
//	m, err := distlock.NewMultiMutex(client, []string{from, to})
//	...
//	g, err := m.Lock(ctx) // all of them, or none
//	if err != nil {
//		return err
//	}
//	defer g.Release(context.WithoutCancel(ctx))
//	return transfer(g.Context(), g.TokenOf(from), g.TokenOf(to))
//
// Callers may give the names in any order: every request takes them in
// one order (by Redis Cluster slot, then by key), which is why two
// requests cannot wait for each other in a circle (as long as nobody who
// holds a lock waits for another outside that order: take names that nest
// in one MultiMutex), and stands in each
// line with one ticket, so every line serves the requests in it in the
// order they began to wait. While a request waits for a name, it holds the
// names that come before it, each for its claim window only. A Lock whose
// context ends returns at once and gives back everything in the
// background; [MultiMutex.TryLock] takes every name or leaves them all as
// it found them. Each name keeps its own fencing sequence:
// [Guard.TokenOf] gives a name's token, [Guard.Token] the first name's.
// On one server, an acquisition and a release cost one script each; on a
// Cluster, one script per slot.
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
// Each [Guard] renews its lease every TTL/3, from a goroutine of its own (its
// actor) that starts when the first renewal is due and runs until the
// guard ends; before then the guard has no goroutine, only a timer. The guard becomes [Lost] only
// when the lease is really in doubt: when a renewal is refused (the key
// expired, was deleted or now holds someone else's value), or when the
// lease deadline passes without a confirmed renewal, even while a renewal
// call is still waiting for its answer.
//
// A renewal that fails without an answer about the key (a reset connection,
// a refused dial, a timeout, an error reply, replicas that did not
// acknowledge it) proves nothing: it can only have extended the lease. The
// guard stays [Acquired], and its context alive, while its deadline holds;
// it reports the failure (an Acquired [Event] whose Err is a [*RenewError],
// the Observer's RenewInfo, and a log line at Warn) and retries at once,
// then after pauses that grow from 10 ms up to TTL/9, with jitter. So a
// connection reset, a proxy restart or a Sentinel failover that takes a
// few hundred milliseconds costs a few retries, not the lock. If no renewal
// is confirmed by the deadline, the guard is Lost then. A Lost guard keeps
// trying every TTL/9, and if a renewal then proves the key still holds this
// acquisition's value, the guard returns to [Acquired] (its context stays
// cancelled: the time in between was not protected). A lease that really
// expired cannot come back: once Redis refuses a renewal, the loss is
// final, the guard's actor exits and sends nothing more, and the guard
// stays Lost until it is released ([Guard.Release] then returns Lost at
// once, without calling Redis).
//
// The guards of one client renew through one script for many leases: each
// guard's renewal may go up to a twentieth of TTL/3 early (250 ms at most),
// so that the renewals due about the same time share a script (up to 500
// leases, of every kind; on a Redis Cluster, those of one hash slot; on
// a go-redis Ring, those of one lock). A
// guard alone is renewed when it is due, as ever; each guard keeps its own
// deadline and its own answer, and a renewal refused for one lease of a
// batch makes that guard alone Lost. 100,000 locks held with a 6 s TTL make
// 50,000 renewals a second and about 100 commands. A client that waits for
// replicas ([WithReplicaAck]) renews one lease at a time.
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
// cancelled in the background, and the next waiter gets the lock at once. A
// program that exits right after can wait for that clean-up with [Settle].
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
//   - [Guard.State] answers "do I hold it right now?" without a round trip,
//     and [Guard.Deadline] says until when that answer holds.
//   - [Guard.Subscribe] delivers every transition, with its time and reason,
//     for logging, metrics or code that wants to pause and resume.
//
// [Guard.Done] is closed once the guard has been released. None of these
// waits on Redis: they answer at once even while a renewal or the final
// delete is in flight.
//
// # How it works
//
// A call goes down four layers: the face (Mutex, Semaphore, RWMutex,
// Election) holds configuration only; its engine (engine.go) makes the
// acquire call (acquire.go) and, for Lock, waits in the lock's line
// (wait.go); each acquisition is a [Guard], an actor that is virtual
// until its first renewal (guardactor.go); and the lease package holds the protocol, its Lua
// scripts and the calls that send them to Redis.
//
// A guard exists from the acquisition, and is a goroutine of its own from
// its first renewal to its end. Until the first renewal is due, a third
// of the TTL in, nobody runs it: the call that ends it (Release, Leave,
// the end of the Lock context) claims it in one atomic step and makes the
// end on its own goroutine, so a short critical section costs no
// goroutine. When the first renewal is due, the renewal timer's goroutine
// becomes the guard's actor, which owns it from then on: the renewal
// timer, the lease deadline and the Lock context are its own, and every
// command (Release, Leave, Downgrade) reaches it on its mailbox with a
// one-slot reply. Its loop never waits on Redis: a renewal goes to the
// client's batcher, which writes the answer into the actor's one renewal
// request (a renewal starts no goroutine). An answer that confirms the
// lease in time moves the deadline that State and Deadline report at
// once, and the actor reads it when it next wakes anyway, to ask for the
// next renewal (so the Observer hears of a renewal a period after it);
// any other answer wakes the actor at once. A call that goes alone (a Downgrade, the final delete, a renewal
// that cannot be batched) runs in a child whose answer comes back the same
// way, so the actor answers at once even while Redis is slow. It exits
// when the guard ends and when Redis refuses a renewal (a loss that can
// never be undone), at no other time. State, Deadline, Context, Done and
// Subscribe read what the guard has published and never wait for it.
//
// What a client's locks share in the process (its waiting rooms, its
// restart watch and its renewal batcher) belongs to one session per
// client, which lives while the client has a live guard, a Lock call
// waiting in a room, or a room or a watch that lingers after its last
// user, and which stops once, when the last of them goes. While any of a
// client's guards is held, the session keeps one subscription per node
// those guards live on (one on a single server; one per hash slot on a
// Redis Cluster), to a channel nobody publishes on: it breaks when the
// connection to the node does, and when it is confirmed again every guard
// on that node renews at once, and once more as soon as the node serves
// commands if it refused them at first (a young guard from its renewal
// timer, fired at once, which brings its first renewal forward). On
// go-redis the subscription is made at the first acquisition. On rueidis,
// where it would share the connection of the commands and move it off
// rueidis's direct path for lone commands (a fifth of the rate of serial
// Lock+Release pairs), it is made once a guard has lived 100 ms, so locks
// held for less never make one, and at its first confirmation every
// guard renews at once (a restart before it broke nothing). So a holder
// whose lease was lost with a Redis restarted without persistence is Lost
// within a round trip of the server answering again (or, after a restart
// in the first 100 ms of its hold, at most 100 ms after that), not at its
// next renewal (SAFETY.md, "What the contract rests on", states the
// window that remains). A subscription
// lingers a quarter of a second after its last guard or waiter, so that
// locks taken one after the other share it; one that breaks while it
// lingers (the client was closed) is not set up again, and the session
// of a closed client goes with it.
//
// A held lock costs its actor's goroutine and the guard's memory. The
// target is at most 6 KiB of heap and stacks per held lock (the 4 KiB
// target, which had the actor exit between renewals, is withdrawn: one
// goroutine per held lock is the design). Measured with 100,000 locks held
// on one client at TTL 6 s (BenchmarkHeld100k): 7.7 KiB per held lock, of
// which 3.7 KiB is heap (the Mutex, the guard, its actor and the goroutine's
// descriptor) and 4.0 KiB the actor's stack; the target is not met. The
// stack is the runtime's 2 KiB minimum grown once: a 2 KiB stack leaves
// its frames about 1,100 bytes; the actor parked in its select uses about
// 740 of them (its entry through the renewal timer and the actor
// runtime's Run, its loop, the select), and a renewal's calls, counted
// by their frames' sizes, just about fit in the rest (not shown by a
// measurement: no actor's stack stays at 2 KiB), but its activation (the
// actor's context and timer, joining the client's batcher) goes deeper
// once, and the runtime does not
// shrink it back while the actor lives (it shrinks a stack only when less
// than a quarter of it is in use, counting 800 bytes of guard: a parked
// actor would need under 224 bytes of frames, and the select alone takes
// 304). A renewal allocates nothing of its own and wakes the actor once
// (its timer; the batcher's answer does not wake it, see above). The CPU,
// commands and Redis figures are in
// BENCHMARKS.md, "Many held locks".
//
// # Goroutines
//
// An uncontended Lock and Release with a context that cannot be cancelled
// (context.Background(), or the context.WithoutCancel(ctx) of the Release
// idiom) run on the caller's goroutine and start none, and so does the
// call with which such a Lock stands in a held lock's line; with a
// cancellable Lock context they start one, and so does each later call of
// a Lock in line (a refresh of its place, which a grant may overtake).
// Every goroutine distlock starts has one owner, a stop and a wait:
//
//	goroutine                        owner           stop                          wait
//	guard's actor (from its first    the guard       its end; a refused renewal    Guard.Done (for its end)
//	  renewal, or a Downgrade, on)                     (a final loss)
//	a lone renewal, Downgrade, final the actor       its deadline (D, the lease    the actor's return
//	  delete (the actor's children)                    end) or the guard's end
//	end of a guard with no actor     the guard       the lease's end bounds it     Guard.Done
//	  (Lock context's watch)
//	acquire call whose caller may    the process     its deadline (the lease       Settle
//	  stop waiting (cancellable ctx,                   deadline of its send time)
//	  WithMaxWait, a grant meanwhile)
//	clean-up after a call gives up   the process     one TTL at most               Settle
//	a room's subscription (a lock    the client's    a linger of 250 ms after      the linger (Settle)
//	  with waiters in this process)    session         its last waiter leaves
//	a keeper's subscription (one     the client's    a linger of 250 ms after      the linger (Settle)
//	  per node the client's guards     session         its last guard ends
//	  live on; on rueidis from a
//	  guard's 100th ms on), and its
//	  probe
//	a client's renewal batcher       the client's    the session's stop            the session's stop
//	  (from its guards' first          session                                       (Settle)
//	  renewal on)
//	the stop of a client's session   the process     every goroutine of the        Settle
//	                                                   session has returned
//	a batch of renewals in flight    the batcher     the latest deadline of its    the batcher's end
//	                                                   leases, or nobody waiting
//	an election's watcher, and its   the Election    its last observer leaves      the observers' channels
//	  subscription and reads                                                         close after it
//
// Nothing keeps running on behalf of a call that has returned, beyond the
// process's background work in that table: a call that gave up leaves its
// clean-up, and a room or a keeper lingers briefly, or a session winds
// down. [Settle] waits for the clean-ups and for what is winding down, not
// for a linger. Nothing a Release or a Lock waits for depends on a
// session: an actor's exit, and a guard's end, never wait for any part of
// one to stop, and a session's stop is acknowledged on the goroutine of
// its linger's timer.
// Subscribers never slow anything down: their channels are buffered and
// drop their oldest event rather than block. A guard that is neither
// released nor cancelled keeps its lock, and its renewals, until the
// process exits, just as a forgotten Unlock would.
//
// # Keys
//
// A lock named "job" in the default namespace lives at "distlock:{job}", with
// its fencing counter at "distlock:{job}:fence", which is kept for 24 hours
// after the last acquisition (so that tokens keep increasing even if the
// server's clock steps back) and then expires; while anyone waits, its line
// is at "distlock:{job}:queue" and "distlock:{job}:waiters", and waiting rooms
// listen on the channels "distlock:{job}:wake:<room>". When Lock gives up on an
// attempt whose reply it did not see, it also writes
// "distlock:{job}:void:<value>" for one TTL, which makes that attempt
// harmless if it reaches Redis late. The braces are a Redis Cluster hash
// tag: all keys of one lock share a slot, and different locks spread over
// the cluster. A semaphore keeps its holders in a sorted set at the lease
// key, a read-write lock's readers and writer in a hash there (a Mutex's
// string and the hash are two forms of one lock). Lock names and namespaces are
// printable UTF-8 and must not contain braces; see [NewMutex].
package distlock
