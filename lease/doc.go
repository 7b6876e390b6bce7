// Package lease is distlock's Redis protocol: the scripts that acquire,
// renew and release a lease, the line that waiters stand in, the layout of a
// lock's keys, and the format of the value a holder writes. This comment is
// the protocol's written form; the code is meant to be checked against it.
//
// Every operation is a single Lua script, so it takes one round trip and
// cannot interleave with another client's. Every script that touches a held
// lease first checks that the key still holds the caller's value; none of
// them ever re-creates a lease that has expired.
//
// # Keys
//
// A lock named name in namespace ns has these keys, all with the hash tag
// "{name}" so that in Redis Cluster they share one slot (see [Keys]):
//
//   - ns:{name}: the lease. For a lock its value is the holder's value
//     (see [NewValue]), its TTL the lease; a read-write lock's holders are
//     a hash (see "Read-write locks", below); a semaphore's a sorted set.
//   - ns:{name}:fence: the last fencing token issued, kept
//     [FenceRetention] after the last grant.
//   - ns:{name}:queue: the line, a sorted set of waiter values scored by
//     ticket. A ticket is the server clock in µs when the waiter first stood
//     in line, raised past the last ticket if needed, so the line is first
//     come, first served, across processes.
//   - ns:{name}:waiters: a hash from each waiter value in line to
//     "<lapse> <claim> <room>": the server time (ms) at which its place
//     lapses unless the waiter calls again, its claim window (ms), and its
//     room.
//   - ns:{name}:wake:<room>: the sharded pub/sub channel of one waiting
//     room. A room is one process's side of one lock for one Redis client;
//     all its waiters share the subscription.
//   - ns:{name}:void:<value>: a marker that value was given up (see
//     [Client.Cancel]), kept one TTL.
//
// The line and its hash expire on their own when no waiter has called for a
// claim window, so the waiters of a process that died leave nothing behind.
//
// # Scripts
//
// acquire (Client.Acquire, Client.AcquireOrQueue) grants the lease to the
// caller with the full TTL when the lease holds the caller's value already
// (a grant passed to it while it waited, or an attempt whose reply was
// lost), keeping that grant's token, or, with a new token, when the lease
// is free and nobody alive stands in line ahead of the caller. (A
// semaphore's holder that asks again gets a new token: the fencing key
// holds only the last of its holders' tokens.) When the lease is free and someone
// alive is ahead, the script passes the lease to the first of them (exactly
// as release does) and the caller waits. A caller that waits stands in line
// (AcquireOrQueue only): a new place at the end, or the place of the ticket
// it gives, or the place it has; the call sets the place's lapse to now plus
// its claim window. The reply says who holds the lease, for how much longer,
// the caller's rank and ticket, and the last token issued.
//
// release (Client.Release, Client.Cancel) deletes the lease if it holds the
// caller's value, takes the caller out of line, and passes a free lease to
// the first waiter whose place has not lapsed (lapsed places ahead of it are
// dropped): it writes the waiter's value with the waiter's claim window as
// TTL and a new token, takes the waiter out of line, and publishes
// "<token>\n<value>" on the waiter's room channel. Cancel also marks the
// value void, so that an acquire with it that arrives later is refused.
//
// renew (Client.Renew) extends the lease to the TTL if it holds the caller's
// value, and never re-creates it.
//
// Each script starts with its common case (acquire: a free lease with
// nobody in line, and for a caller that does not stand in line a lease held
// by another with nobody in line; release: nobody in line, for an election
// too) in the fewest Redis calls, and
// hands anything else to its full logic, with the outcome the full logic
// alone would have had. What each path costs Redis is in COSTS.md.
//
// # A waiter's states
//
// A Lock call (distlock's acquire.go) goes through these states:
//
//  1. Asking: it sends acquire (AcquireOrQueue). Granted: it holds the lock,
//     with a deadline counted from that call's send time.
//  2. In line: not granted, it stands in line. It sleeps until one of: a
//     grant for its value reaches its room (the announcement, or the reply
//     of a release that a guard of the same process made); its place is due
//     for a refresh (every half claim window, or at the polling interval
//     while its room has no confirmed subscription); it is first in line and
//     the holder's lease would end (the holder may have died); the room's
//     subscription came up or broke (a grant may have gone unheard). Then it
//     asks again (1), except for a grant, below.
//  3. Passed: the lease holds its value for its claim window, counted from
//     the release that passed it. The waiter did not send that release, so
//     its lease deadline counts from the send time of a call known to come
//     before the grant: the release itself, when a guard of the same process
//     sent it, or the waiter's last call that found it in line, when the
//     grant's token is above the last token that call saw. If the deadline
//     counted from there leaves at least a third of the claim window, it
//     holds the lock at once and its guard renews the lease to the TTL a
//     third of the window in (at once if that is past); otherwise, and
//     always when it must see a write acknowledged by replicas, it claims the
//     grant by asking again (1): the lease holds its value, so acquire
//     grants it the full TTL, with the grant's token.
//  4. Gone: the call gave up (ctx, max wait). It returns at once; in the
//     background, Cancel voids its value, takes it out of line and, if the
//     lease had been passed to it, deletes it and passes it on.
//
// # Invariants
//
//   - At most one value holds the lease; every grant (to a caller or passed
//     to a waiter) issues a token above every earlier one.
//   - A value in line does not hold the lease: every grant takes it out of
//     line.
//   - The lease is free only while nobody alive stands in line, or for a
//     moment: a release passes it in the same step, and a grant that lapses
//     (the waiter died) is noticed by the first in line at the lapse, or by
//     any waiter at its next refresh.
//   - A guard's deadline always counts from the send time of a command that
//     reached Redis no later than the write that set the lease's current
//     expiry.
//
// # Faults
//
//   - A waiter dies (crash, SIGKILL, partition): its place lapses a claim
//     window after its last call and is skipped; if the lease is passed to it
//     first, the grant lapses after the claim window and the next waiter,
//     first in line and watching the lease's TTL, takes it.
//   - A holder dies: its lease expires after the TTL; the first in line
//     wakes at that moment and takes it.
//   - An announcement is lost (the subscription broke, or was not up yet):
//     the room wakes its waiters when the subscription is back, and every
//     waiter asks again within half a claim window anyway.
//   - Pub/sub is refused (an ACL, a proxy): announcements are skipped and
//     the waiters poll at the polling interval.
//   - Redis restarts without its data, or fails over to a replica that
//     missed writes: the line is gone or stale; each waiter stands in line
//     again at its next call, with its old ticket, so the order among those
//     that wait holds (if the lease was lost too, the first to call takes
//     the free lock).
//   - A call's reply is lost: the call may still run later. An acquire that
//     runs after its caller gave up is refused by the void marker; a guard
//     whose acquisition had such a call outstanding releases with Cancel, so
//     that the late call cannot put its value back in line.
//
// # A grant is its acquisition's
//
// A path can hold a request and deliver it later, in order, while replies
// still flow the other way: a stalled uplink, a proxy that buffers. So a
// waiter's refresh of its place can reach Redis after a release passed the
// lock to that waiter, after the waiter used the grant, lost it (its
// renewals were held too) and someone else held the lock and let it go.
// The refresh then finds its value neither holding the lock nor in line.
// Granting it the free lock would make a lease that no guard holds (the
// guard has moved on), or let that guard's own delayed renewal find "its"
// value again and say it holds the lock after another holder, which SAFETY.md
// L4 forbids; putting it back in line would let the next release pass it
// the lock, with the same result.
//
// Every call of an acquisition after its first therefore brings the
// largest token that acquisition has learnt of (ARGV[6], [Place.Seen]: the
// Fence of its last reply, or the token of a grant announced to it). A
// call whose value neither holds the lock nor stands in line, while the
// fencing key holds a token above the one it brings, is stale: a grant
// was made since it was sent, and if that grant was this value's, the
// call belongs to an acquisition that is over. It is refused and writes
// nothing (the reply has rank -1 and the fencing key's token). A live
// waiter can get that reply too, when its place lapsed while the lock
// changed hands (or the line was lost with a restart and the lock granted
// again since): it calls again at once with the reply's token, and stands
// in line again with its ticket. The refusal costs nothing on the common
// paths, which read the fencing key anyway; the token is one argument more
// on a refresh, and the check one ZSCORE on the full path.
//
// Other ways were weighed. The token in the lease value, checked by every
// renewal, would change the format that every script and every older
// binary reads, and a semaphore's holder would need its token to find its
// own permit. A renewal that checks the fencing key costs a read per
// renewal, the most frequent call of all, and a semaphore keeps only the
// last of its holders' tokens there. A mark per value passed on costs a
// write per contended grant and lasts only as long as it is kept. Waiting
// for the abandoned call's answer assumes one connection, in order; rueidis
// keeps several. The token a call brings needs none of these: a grant
// always raises the fencing key, for every face, so a call sent before a
// grant carries a smaller token than any check made after it. Since the
// keys' format does not change, binaries of both versions share a lock
// during an upgrade; only the new ones' calls are checked.
//
// What it does not cover: a call sent before its acquisition learnt any
// token (its first call, or a repeat of that call after it got no reply)
// brings none. Such a call can only be late behind a call of the same
// acquisition sent on another connection; the acquisition then knows it
// has a call whose outcome it did not see. Its guard never regains the
// lock after a loss (finding its value proves nothing then: the loss is
// final), and it voids its value when it ends or its loss is final
// ([Client.Cancel]), which deletes a lease that call granted or refuses
// the call if it comes later (for the void marker's life, one TTL).
//
// # Semaphores
//
// A semaphore of n permits ([Keys.Semaphore]) keeps its holders in a sorted
// set at the lease key, each value scored by the server time (ms) at which
// its lease ends; the set is kept as long as its last lease. It uses the
// same fencing key, line, rooms and void markers as a lock, and the same
// scripts in their semaphore form:
//
//   - acquire first drops the holders whose lease has ended, so a crashed
//     holder's permit is free the moment its lease ends, whoever calls
//     next. It grants a permit when the caller holds one already, or when
//     fewer than n (the caller's n) remain and nobody alive is ahead of it
//     in line; free permits go to those ahead first, and those left after
//     the caller's to those behind. Otherwise the caller stands in line. A
//     waiter's reply names the holder whose lease ends first and how long
//     it has left: the first in line asks again at that moment.
//   - release drops the caller's permit and passes free permits, while
//     fewer than the releaser's n are held, to the first live waiters in
//     line, each with its claim window, a token and an announcement in its
//     room; the reply lists every pass.
//   - renew extends a holder whose lease has not ended, and never adds one.
//
// The number of permits is an argument of each call, not a setting kept in
// Redis (the key "ns:{name}:permits" records the number of the last grant,
// for operators only): a caller never grants beyond its own number, and
// holders beyond a number that was lowered keep their permits until they
// give them up or lose them.
//
// The invariants of a lock hold for each permit, with "at most n values
// hold the lease" in place of "at most one" for callers that agree on n.
//
// # Read-write locks, and one lock per name
//
// A lock ([Keys]), an election ([Keys.Election]) and a read-write lock
// ([Keys.RW]) of one name are one lock: any exclusive hold (a lock's, an
// election's, a read-write lock's writer) excludes every other hold, and
// readers share only with each other. They have one line, in arrival
// order, and one fencing sequence. A semaphore of the same name is another
// kind: its scripts and theirs refuse each other's lease key
// ([WrongKindError]).
//
// The lease key holds the lock in one of two formats, and every script of
// the lock reads both:
//
//   - a string: a lock's or an election's exclusive hold, the holder's
//     value with the lease's TTL, exactly as a lock wrote it before
//     read-write locks shared its name;
//   - a hash: a read-write lock's holders, a field per holder from its
//     value to "<end> <token>" (the server time in ms at which its lease
//     ends, and its grant's token), "~w" naming the writer while one
//     holds, and "~" holding "rw", the mark (a hash without it is not
//     distlock's). The hash lasts at least as long as its longest lease,
//     and as long as anyone stands in line behind its holders.
//
// Which format a grant writes depends on the face of the grantee, never
// on who grants it: a lock's or an election's waiter is passed a string, a
// read-write lock's writer the hash with "~w", a reader its field. (A
// writer keeps the hash so that the scripts of the version before one lock
// per name, which read only their own format, keep working beside the new
// ones during an upgrade; see below.)
//
// The line is a lock's; a waiter's entry in the waiters hash carries its
// mode: a read-write lock's is "<lapse> <claim> <r|w> <room>", a lock's or
// an election's "<lapse> <claim> <room>", with no mode, which stands for an
// exclusive hold (a room is hex, so the two cannot be mistaken for each
// other). The scripts (scripts.go) share their full paths
// (lineLua, lockAcquireLua, lockReleaseLua), so each face takes the same
// decisions:
//
//   - acquire drops the holders of the hash whose lease has ended, so a
//     dead reader or writer stops counting when its own lease ends (a
//     string expires on its own), then serves the head of the line: a
//     reader is granted while nobody holds alone, with the run of readers
//     behind it; an exclusive waiter when nobody holds; the first waiter
//     that cannot be granted stops the run. The caller is granted when
//     nobody alive is ahead of it and its mode allows (a reader: nobody
//     holds alone; an exclusive hold: nobody holds); otherwise it stands in
//     line. A holder that asks again, through any face, is granted the full
//     TTL in the format it holds, with its own token.
//   - release drops the caller's hold, in either format, and serves the
//     head of the line the same way: an exclusive hold's release grants
//     the run of readers at the head (or the exclusive waiter first in
//     line), the last reader's the exclusive waiter first in line; the
//     reply lists every pass. A waiter that gives up (Cancel) serves the
//     line too, so a lock's waiter that leaves lets the readers behind it
//     join those that hold.
//   - renew (one script for every face) extends the caller's hold in
//     either format, and never adds one; a hold in the hash is extended
//     only while its lease has not ended, in either mode (so a renewal in
//     flight across a downgrade is not refused).
//   - downgrade turns the writer's hold into a reader's (same token, a
//     full TTL from now) and serves the head of the line.
//
// Each starts with its common case in the calls of a lock's: acquire with a
// free lock and nobody in line, or for a reader one that only readers hold;
// release with nobody in line. The lock's common cases are those it had
// before read-write locks shared its name, call for call: a lock's script
// meets the hash only on its full path.
//
// An election's scripts announce exclusive holds only: a release of an
// election that passes the lock to readers announces that nobody leads. A
// release by another face (a lock's, a read-write lock's) announces
// nothing, as a lock's release never has.
//
// The invariants of a lock hold for each hold, with "one exclusive holder,
// or any number of readers" in place of "at most one value holds the
// lease", and arrival order for the line: nobody is granted ahead of a
// live waiter that stood in line before it.
//
// # Upgrading to one lock per name
//
// The scripts read every key that the version before wrote, in which a
// lock and a read-write lock of one name refused each other: a lock's
// string, a read-write lock's hash with its writer or readers, and lines
// of either kind. A lock's binaries of either version share a name as
// before, and so do a read-write lock's, since neither format nor entry
// changed. Across faces, the old scripts refuse what they cannot read (an
// old read-write lock's scripts a string or an entry without a mode, an
// old lock's scripts the hash) with a wrong-kind error and write nothing,
// so an old and a new binary never both hold. An old lock's release that
// meets a read-write lock's entry reads it as a lock's and passes that
// waiter a string in a room nobody listens to; the new scripts take the
// string as that waiter's exclusive hold (it claims it at its next call;
// renew, release and downgrade read it). An old read-write lock's release
// that meets a lock's entry stops without passing; the waiter takes the
// free lock at its next call, within half a claim window.
//
// # Sets of locks
//
// A set ([Client.AcquireAll], [Client.ReleaseAll], [Client.CancelAll])
// holds several locks as one: distlock's MultiMutex. Its scripts run, for
// each lock of the set in turn, the body of the lock's own acquire or
// release script, as a Lua function of that lock's keys (acquireAllScript,
// releaseAllScript). Each lock of a set is therefore the same lock as a
// Mutex of its name: the same string in the lease key, the same line,
// fencing sequence, rooms and void markers, and the same decisions, call
// for call; only the command around them is shared.
//
// Order. A set takes its locks in one order that every caller agrees on,
// whatever order they were named in: by the Redis Cluster slot of the
// lease key, then by the key ([SortSet]). One script serves the locks of
// one group (every lock on one server; one slot on a Cluster; see
// [Client.BatchGroup]); a set over several groups takes one script per
// group, in order, the next only once the last is held whole.
//
// acquireAll grants the locks in order and stops at the first that is not
// granted. Standing in line (a Place), the caller keeps the locks before
// that one, each shortened to the claim window (PEXPIRE), and stands in
// that lock's line; it renews them (a call again, or a batch renewal for
// earlier groups) at least every half claim window while it waits, and a
// pass of the lock it waits for is claimed by calling again, which
// grants the locks it holds anew and goes on to the next (a pass of the
// set's last lock needs no call: the set is held). A single
// attempt (no Place) deletes again the locks it granted when it stops, so
// it leaves every lock as it found it, but for the fencing tokens it
// issued. Every group is granted the TTL; a request that then stands in
// line for a later group shortens the groups it holds to the claim window
// (a batch renewal with that TTL) before it waits, and its guard's first
// renewal extends them to the TTL again once it holds them all.
//
// Tickets. The caller stands in every line with one ticket: the one the
// first line it stood in gave it (the server clock when it first waited),
// passed as the Place's ticket to every later line. A lock's line is
// ordered by ticket, so every line orders the requests in it alike. (On a
// Cluster the ticket is one node's clock, placed in lines of other nodes:
// a skew between their clocks moves the request by that much among the
// waiters that stood in line on the other node's clock. It changes the
// order of service by the skew, never its consistency.)
//
// Why it cannot deadlock. A request holds only locks that come before the
// one it waits for in the set's order; a holder of a single lock waits for
// nothing; a waiter in a line waits for the holder and for the waiters
// ahead of it, which wait for that holder too. Every wait therefore goes
// from a request to one holding a later lock, or to one ahead of it in
// the same line: no chain of waits can return to where it began.
//
// Faults. A waiter that dies leaves locks that lapse within its claim
// window, and a place that lapses likewise. A waiter that finds a lock it
// held lost (its lease lapsed) gives every lock back and starts again
// with its ticket, so that it never holds a lock while it waits for an
// earlier one. A holder's renewal (one batch per group) that is refused
// for any lock makes the whole set lost, and the holder gives the other
// locks back at once.
//
// Late calls. A set's call brings a seen token for each of its locks
// ([Place.SetSeen]), and each lock's body runs a Mutex's grant check with
// it (see "A grant is its acquisition's"): for the lock it waits at, the
// largest token it learnt of; for a lock it holds, that grant's token less
// one, so that a call finding the set's value no longer holding that lock
// is refused (rank -1, nothing written) whatever was granted since: the
// set lost it, or the call lands after the set was released, and only the
// set's own next call, after it gave everything back, may take it again
// (with the refusal's token as its seen token). Without that, a refresh
// held on a stalled path and delivered after the set's Release would
// grant the set's first lock anew to nobody.
//
// # Elections
//
// An election ([Keys.Election]) is a lock whose scripts also announce each
// change of holder on the channel "ns:{name}:leader": every grant and pass
// publishes "<token>\n<value>", and a release that frees the lease without
// passing it publishes "<token>\n" with the token of the holder that left.
// A lease that expires announces nothing; whoever follows the leader reads
// the lease ([Client.Read]) when its TTL would run out. The fencing key
// holds the current holder's token whenever the lease is held, since every
// grant sets both.
//
// # Fencing tokens
//
// A token is the Redis server's clock in microseconds at the grant, raised
// to one more than the previous token if the clock has not moved past it.
// Tokens of one lock therefore strictly increase as long as the fencing key
// survives, and, when it does not (a restart without persistence, an
// eviction, a failover to a replica that missed the last writes, or simply
// [FenceRetention] without any grant), they still increase unless the
// server's clock has stepped back by more than the time that passed. Tokens
// stay below 2^53, so they are exact in Lua, in JSON and in float64: a grant
// fails rather than issue a larger one, and it fails as well when the
// fencing key holds anything but a token (something other than distlock
// wrote it).
package lease
