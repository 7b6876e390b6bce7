package lease

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// Client runs the lease scripts through a Redis client (see [Redis]). It holds no state
// of its own and is safe for concurrent use.
//
// While a Redis Cluster slot is being migrated, Redis answers TRYAGAIN to a
// script that names several keys of the slot when only some of them have
// moved (the release script counts its channel as a key, and a channel is
// never present): the script did not run. Every method retries it, with
// short pauses, until its context ends.
type Client struct {
	r   Redis
	ack Ack // Replicas 0: do not wait for replicas; see NewWithAck
}

// New returns a Client that talks to Redis through the rueidis client rc.
func New(rc rueidis.Client) *Client { return &Client{r: FromRueidis(rc)} }

// Grant is the outcome of [Client.Acquire] and [Client.AcquireOrQueue].
type Grant struct {
	// Acquired reports whether the lease is now held by the caller's value.
	Acquired bool
	// Token is the fencing token, when Acquired.
	Token int64
	// Holder is the value that holds the lease, when not Acquired; empty
	// when nobody does (the caller's value was voided).
	Holder string
	// HolderTTL is the holder's remaining lease, when not Acquired; it is
	// negative when the key has no expiry or does not exist.
	HolderTTL time.Duration
	// Rank is the caller's place in line when it stands in line (0: first),
	// and -1 otherwise.
	Rank int
	// Ticket identifies the caller's place in line, when it stands in line:
	// pass it to the next AcquireOrQueue to keep that place even if the line
	// was lost meanwhile (a restart, a failover) or the place lapsed.
	Ticket int64
	// Fence is the last fencing token issued when the call ran, when not
	// Acquired. A grant announced with a larger token was made after the
	// call, so the call's send time precedes it.
	Fence int64
}

// Place describes how a caller stands in line; see [Client.AcquireOrQueue].
type Place struct {
	// Claim is the claim window: how long a grant made to this caller while
	// it waits lasts unless the caller renews it, and how long its place
	// lasts after each call unless it calls again. At least a millisecond.
	Claim time.Duration
	// Room is the id of the waiting room that is told of grants to the
	// caller, on the channel [Keys.WakeChannel](Room). It must not be empty
	// nor hold a space.
	Room string
	// Ticket is the ticket of an earlier place to keep, or 0 for a new place
	// at the end of the line.
	Ticket int64
	// Seen is the largest token the caller's acquisition has learnt of (a
	// reply's Fence, a grant announced to it), or 0 before it has learnt
	// any. A call that brings it and finds its value neither holding the
	// lease nor in line, while a later token has been issued, is stale: it
	// was sent before a grant to this value that has since been used and
	// ended, and it reaches Redis late (a stalled path). It is refused:
	// it writes nothing, and the reply has Rank -1 and the fencing key's
	// token in Fence. A live waiter whose place merely lapsed meanwhile
	// gets that reply too; it calls again with Seen set to that Fence, and
	// stands in line again with its ticket. See doc.go ("A grant is its
	// acquisition's"). [Client.AcquireAll] reads SetSeen instead.
	Seen int64
	// SetSeen is, for [Client.AcquireAll] only, what Seen is for a single
	// lock, given for each lock of the set in its order (missing, or 0:
	// none learnt yet). For a lock the set holds, it is that grant's token
	// less one: a call that then finds the set's value not holding that
	// lock, and not in its line, is refused (rank -1) whatever was granted
	// since, so that a call that lands after the set was released, or lost
	// the lock, does not grant it anew. A set's other calls give the
	// largest token they learnt of the lock, as Seen.
	SetSeen []int64
}

// IsTimeout reports whether err says that the client stopped waiting for a
// reply by a timeout of its own, not of the caller's context: a read or
// write deadline of the connection passed (rueidis's ConnWriteTimeout,
// go-redis's ReadTimeout and WriteTimeout), which the client reports as a
// network error ("i/o timeout") that matches [os.ErrDeadlineExceeded] or
// says Timeout. Like a context's deadline, it leaves the outcome of the
// call unknown. An error reply of Redis is never one, nor is a context's
// error (context.DeadlineExceeded also says Timeout).
func IsTimeout(err error) bool {
	if err == nil || IsReply(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// DeadlineKeeper is implemented by a [Redis] that ends a call when the
// deadline of its context passes, even while the call waits for its reply
// on a connection (rueidis does). A Redis without it may go on waiting
// until its own timeouts end the call (go-redis, unless its
// ContextTimeoutEnabled is set, waits for its ReadTimeout, and retries),
// so a caller that must return by a deadline waits for it beside the call.
type DeadlineKeeper interface {
	KeepsDeadlines() bool
}

// KeepsDeadlines reports whether c's Redis ends a call at its context's
// deadline by itself (see [DeadlineKeeper]).
func (c *Client) KeepsDeadlines() bool {
	k, ok := c.r.(DeadlineKeeper)
	return ok && k.KeepsDeadlines()
}

// ErrBadPlace is returned by [Client.AcquireOrQueue] for a Place it cannot
// use.
var ErrBadPlace = errors.New("lease: invalid place in line")

// Acquire writes value to the lease with the given TTL if the lease is free
// (or already holds value) and nobody alive stands in line, and issues a
// fencing token. It makes one round trip and never stands in line. When the
// lease is free but someone waits in line, it passes the lease to the first
// of them, as a release does, and reports the lease held by that waiter.
//
// A Redis error, including a key of the wrong type, is returned as the
// rueidis error and leaves nothing written. A TTL under a millisecond is
// refused with ErrBadTTL before anything is sent.
//
// A Client made by [NewWithAck] also waits for replicas, in the same round
// trip. If the lease was granted but not acknowledged in time, Acquire
// deletes it again (only if it still holds value) and returns an
// [*AckError]; a lease that was not granted is reported as usual.
func (c *Client) Acquire(ctx context.Context, k Keys, value string, ttl time.Duration) (Grant, error) {
	return c.acquire(ctx, k, value, ttl, nil)
}

// AcquireOrQueue is Acquire for a caller that waits: when the lease is not
// granted, the caller stands in the lock's line (or, if it already does,
// refreshes its place), and the reply says its rank. The line is first come,
// first served: a release passes the lease to the first waiter whose place
// has not lapsed, for that waiter's claim window, and announces the grant
// (value and token) on the channel of the waiter's room. The waiter then
// either renews the lease to its TTL, or calls AcquireOrQueue again, which
// grants it the full TTL, with the grant's token, since the lease holds its
// value.
// A waiter must call AcquireOrQueue again before its claim window has passed
// since the last call, or its place lapses and the line skips it. See
// doc.go for the whole protocol.
func (c *Client) AcquireOrQueue(ctx context.Context, k Keys, value string, ttl time.Duration, p Place) (Grant, error) {
	switch {
	case p.Claim < time.Millisecond:
		return Grant{}, fmt.Errorf("%w: claim window %v is under one millisecond", ErrBadPlace, p.Claim)
	case p.Room == "":
		return Grant{}, fmt.Errorf("%w: no room", ErrBadPlace)
	case strings.ContainsRune(p.Room, ' '):
		// A read-write lock's entry puts its mode before the room, after a
		// space: a room with one would read as another entry.
		return Grant{}, fmt.Errorf("%w: room %q has a space", ErrBadPlace, p.Room)
	case p.Ticket < 0:
		return Grant{}, fmt.Errorf("%w: ticket %d is negative", ErrBadPlace, p.Ticket)
	case p.Seen < 0:
		return Grant{}, fmt.Errorf("%w: seen token %d is negative", ErrBadPlace, p.Seen)
	}
	return c.acquire(ctx, k, value, ttl, &p)
}

// acquire runs the acquire script of k's kind; p nil: do not stand in line.
func (c *Client) acquire(ctx context.Context, k Keys, value string, ttl time.Duration, p *Place) (Grant, error) {
	if ttl < time.Millisecond {
		return Grant{}, ErrBadTTL
	}
	if err := k.check(); err != nil {
		return Grant{}, err
	}
	s := k.scriptOf(acquireScript, semAcquireScript, rwAcquireScript)
	// Each argument costs Redis about 1,600 instructions, so the defaults
	// at the end are left out (and the value is in its void key).
	args := []string{ms(ttl)}
	if kind := k.kindArg(); kind != "" || p != nil {
		args = append(args, kind)
	}
	if p != nil {
		args = append(args, ms(p.Claim), p.Room)
		if p.Ticket != 0 || p.Seen != 0 {
			args = append(args, strconv.FormatInt(p.Ticket, 10))
		}
		if p.Seen != 0 {
			args = append(args, strconv.FormatInt(p.Seen, 10))
		}
	}
	res, w := c.exec(ctx, s, k.all(value), args)
	token, arr, err := scriptReply(res)
	if err != nil {
		return Grant{}, kindError(k, err)
	}
	if arr == nil {
		if err := c.ackError("acquire", k.Lease, w); err != nil {
			if uerr := c.undo(ctx, k, value); uerr != nil {
				return Grant{}, fmt.Errorf("%w; deleting the lease again failed, it expires on its own: %v", err, uerr)
			}
			return Grant{}, err
		}
		return Grant{Acquired: true, Token: token}, nil
	}
	if len(arr) < 6 {
		return Grant{}, fmt.Errorf("%w to acquire: %d elements", ErrProtocol, len(arr))
	}
	pttl, err := arr[1].AsInt64()
	if err != nil {
		return Grant{}, fmt.Errorf("%w to acquire: %w", ErrProtocol, err)
	}
	g := Grant{HolderTTL: time.Duration(pttl) * time.Millisecond}
	g.Holder, _ = arr[2].ToString()
	rank, err3 := arr[3].AsInt64()
	ticket, err4 := arr[4].AsInt64()
	fence, err5 := arr[5].AsInt64()
	if err := errors.Join(err3, err4, err5); err != nil {
		return Grant{}, fmt.Errorf("%w to acquire: %w", ErrProtocol, err)
	}
	g.Rank, g.Ticket, g.Fence = int(rank), ticket, fence
	return g, nil
}

// scriptOf returns the script of k's kind: lock's (a Mutex's, an
// Election's), sem (a semaphore's) or rw (a read-write lock's).
func (k Keys) scriptOf(lock, sem, rw *Script) *Script {
	switch {
	case k.Permits > 0:
		return sem
	case k.Mode != 0:
		return rw
	}
	return lock
}

// all returns the keys of the acquire and release scripts, in their order,
// with value's void key last.
func (k Keys) all(value string) []string {
	return []string{k.Lease, k.Fence, k.Queue, k.Waiters, k.Void(value)}
}

// ErrBadPermits is returned for a semaphore's [Keys] whose Permits is
// negative, or which also asks for announcements (only a lock announces).
var ErrBadPermits = errors.New("lease: invalid permits")

func (k Keys) check() error {
	switch {
	case k.Permits < 0:
		return fmt.Errorf("%w: %d", ErrBadPermits, k.Permits)
	case k.Permits > 0 && k.Announce:
		return fmt.Errorf("%w: a semaphore does not announce its holders", ErrBadPermits)
	}
	return k.checkMode()
}

// kindArg is the scripts' argument that says what kind of lock k is: a
// semaphore's permits, "1" for an election, a read-write lock's mode ("r"
// or "w"), and "" for a lock.
func (k Keys) kindArg() string {
	switch {
	case k.Permits > 0:
		return strconv.Itoa(k.Permits)
	case k.Announce:
		return "1"
	case k.Mode != 0:
		return string(k.Mode)
	}
	return ""
}

// Renewal is the outcome of [Client.Renew].
type Renewal struct {
	// OK reports whether the lease held the caller's value and was extended.
	OK bool
	// Holder is the value found instead when not OK; empty if the key was
	// missing (expired or deleted).
	Holder string
}

// Renew extends the lease to the given TTL, counted from when Redis runs the
// script, if it still holds value. It never re-creates a missing lease.
//
// A Client made by [NewWithAck] also waits for replicas, in the same round
// trip. A renewal that was applied but not acknowledged in time returns an
// [*AckError] and no Renewal: it is not confirmed, although the primary has
// extended the lease.
func (c *Client) Renew(ctx context.Context, k Keys, value string, ttl time.Duration) (Renewal, error) {
	if ttl < time.Millisecond {
		// PEXPIRE with 0 or less would delete the lease.
		return Renewal{}, ErrBadTTL
	}
	s := k.scriptOf(renewScript, semRenewScript, rwRenewScript)
	res, w := c.exec(ctx, s, []string{k.Lease}, []string{value, ms(ttl)})
	ok, arr, err := scriptReply(res)
	if err != nil {
		return Renewal{}, err
	}
	r := Renewal{OK: arr == nil && ok == 1}
	if len(arr) > 1 {
		r.Holder, _ = arr[1].ToString()
	}
	if r.OK {
		if err := c.ackError("renew", k.Lease, w); err != nil {
			return Renewal{}, err
		}
	}
	return r, nil
}

// Release is the outcome of [Client.Release] and [Client.Cancel].
type Release struct {
	// Deleted reports whether the lease held the caller's value until the
	// call deleted it.
	Deleted bool
	// Passed names the waiter the lease was passed to, if it was.
	Passed Pass
	// More names the other waiters that a semaphore's release passed a
	// free permit to, after Passed, in the order of the line.
	More []Pass
}

// Passes returns every pass the release made, in order.
func (r Release) Passes() []Pass {
	if r.Passed.Value == "" {
		return nil
	}
	return append([]Pass{r.Passed}, r.More...)
}

// Pass is a grant that a release made to a waiter in line. Its Value is
// empty when the release passed the lease to nobody.
type Pass struct {
	Value string // the waiter's value, which the lease now holds
	Token int64  // the grant's fencing token
	Room  string // the waiter's room, which was told on its channel
}

// releaseTries bounds how many times Release sends its script when calls
// fail without a reply from Redis. It is more than the number of
// connections rueidis keeps to one node by default (two, or four with four
// or more CPUs), since each dead one can fail one call.
const releaseTries = 8

// Release deletes the lease if it still holds value and, in the same step,
// passes it to the first live waiter in line, if any (see
// [Client.AcquireOrQueue]). It never
// touches a lease held by another value.
//
// The delete is idempotent, so when a call fails without a reply from Redis
// Release sends it again, up to releaseTries calls in all and while ctx
// allows. rueidis keeps a pooled connection that broke while it was idle
// until a command fails on it, so after a network blip the first call on
// each connection fails although Redis is reachable; without a retry the
// lease would outlive its release by up to a TTL. The result is that of the
// last call: in the rare case that a call broken in flight had deleted the
// lease, a retry reports it as no longer holding value (and the grant that
// call made is announced on the waiter's channel only).
func (c *Client) Release(ctx context.Context, k Keys, value string) (Release, error) {
	return c.release(ctx, k, []string{k.Lease, k.Fence, k.Queue, k.Waiters}, value, "", c.run)
}

// Cancel gives value up for good, after an acquire with it whose outcome
// the caller did not see, or when a waiter stops waiting: it marks value
// void for ttl (an acquire with value that reaches Redis later, for
// instance on another connection than this call's, is refused), takes it
// out of line, and deletes the lease if it holds value, passing it on, as
// Release does. It retries as Release does. A TTL under a millisecond is
// refused with ErrBadTTL before anything is sent.
func (c *Client) Cancel(ctx context.Context, k Keys, value string, ttl time.Duration) (Release, error) {
	if ttl < time.Millisecond {
		return Release{}, ErrBadTTL
	}
	return c.release(ctx, k, k.all(value), value, ms(ttl), c.run)
}

// CancelDedicated is Cancel sent on a connection of its own, borrowed from
// rueidis's pool of dedicated connections and handed back after (see
// runDedicated). It is for a clean-up that runs in the background after its
// caller has returned, and so may still run while the client's owner closes
// the client. It costs a connection of the pool, dialed the first time;
// when Redis does not answer the dial's handshake in time (it is stopped),
// the clean-up fails where Cancel would have waited on a shared
// connection.
func (c *Client) CancelDedicated(ctx context.Context, k Keys, value string, ttl time.Duration) (Release, error) {
	if ttl < time.Millisecond {
		return Release{}, ErrBadTTL
	}
	return c.release(ctx, k, k.all(value), value, ms(ttl), c.runDedicated)
}

// release runs the release script of k's kind for Release and Cancel (void
// the void key's TTL in ms, "" for Release) through run.
func (c *Client) release(ctx context.Context, k Keys, keys []string, value, void string,
	run func(context.Context, *Script, []string, []string) Reply) (Release, error) {
	if err := k.check(); err != nil {
		return Release{}, err
	}
	s, kind := k.scriptOf(releaseScript, semReleaseScript, rwReleaseScript), k.kindArg()
	if k.Mode != 0 {
		kind = "" // a read-write lock's release drops a hold in either mode
	}
	// As for acquire, the defaults at the end are left out.
	args := []string{value}
	if kind != "" || void != "" {
		args = append(args, kind)
	}
	if void != "" {
		args = append(args, void)
	}
	var err error
	for range releaseTries {
		var deleted int64
		var arr []Reply
		deleted, arr, err = scriptReply(run(ctx, s, keys, args))
		switch {
		case err == nil && arr == nil:
			return Release{Deleted: deleted == 1}, nil
		case err == nil:
			return parseRelease(arr)
		}
		if IsReply(err) || ctx.Err() != nil {
			break
		}
	}
	return Release{}, err
}

// scriptReply reads the reply of a lease script: a number alone, the reply
// of the common cases (a grant's token; 1 for a release or renewal that did
// what it was asked, 0 for a release that found nothing to delete), or an
// array, whose first element says whether the script did it (which Redis
// builds at a cost of about 4,500 instructions, so the common cases do
// without).
//
// It looks at the reply's kind first, so that an array (a release that
// passed the lock on, a place in line) costs no error value.
func scriptReply(res Reply) (n int64, arr []Reply, err error) {
	if res.kind != replyArray {
		n, err = res.AsInt64()
		return n, nil, err
	}
	if len(res.arr) == 0 {
		return 0, nil, fmt.Errorf("%w: an empty array", ErrProtocol)
	}
	return 0, res.arr, nil
}

func parseRelease(arr []Reply) (Release, error) {
	if len(arr)%3 != 1 {
		return Release{}, fmt.Errorf("%w to release: %d elements", ErrProtocol, len(arr))
	}
	deleted, err := arr[0].AsInt64()
	if err != nil {
		return Release{}, fmt.Errorf("%w to release: %w", ErrProtocol, err)
	}
	r := Release{Deleted: deleted == 1}
	if err := r.addPasses(arr[1:]); err != nil {
		return Release{}, err
	}
	return r, nil
}

// addPasses reads the {token, value, room} triples of a release's reply
// into r's passes: the first is Passed, the others More.
func (r *Release) addPasses(triples []Reply) error {
	for i := 0; i+2 < len(triples); i += 3 {
		var p Pass
		var err1, err2, err3 error
		p.Token, err1 = triples[i].AsInt64()
		p.Value, err2 = triples[i+1].ToString()
		p.Room, err3 = triples[i+2].ToString()
		if err := errors.Join(err1, err2, err3); err != nil {
			return fmt.Errorf("%w to release: %w", ErrProtocol, err)
		}
		if i == 0 {
			r.Passed = p
		} else {
			r.More = append(r.More, p)
		}
	}
	return nil
}

// ms formats d in whole milliseconds, the unit of Redis's PX and PEXPIRE.
func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// Holding is one holder of a lease, as [Client.Read] found it.
type Holding struct {
	Value string        // the holder's value
	TTL   time.Duration // how long its lease has left; negative for a lock's key without expiry
}

// Snapshot is what [Client.Read] found in Redis.
type Snapshot struct {
	// Type is the lease key's Redis type: "none" when nobody holds it,
	// "string" for a lock or election, "zset" for a semaphore, anything
	// else for a key that distlock did not write.
	Type string
	// Holders are the lease's holders, in the order their leases end.
	Holders []Holding
	// Fence is the last fencing token issued; 0 when none is kept. While
	// a lock or election is held, it is its holder's token.
	Fence int64
	// Limit is the permits that a semaphore's last grant was made under;
	// 0 when unknown.
	Limit int
}

// Read returns who holds k's lease now, in one round trip that writes
// nothing. It does not care what kind k is: the key's type says.
func (c *Client) Read(ctx context.Context, k Keys) (Snapshot, error) {
	arr, err := c.run(ctx, readScript, []string{k.Lease, k.Fence, k.Limit}, nil).ToArray()
	if err != nil {
		return Snapshot{}, err
	}
	if len(arr) < 3 || len(arr)%2 != 1 {
		return Snapshot{}, fmt.Errorf("%w to read: %d elements", ErrProtocol, len(arr))
	}
	var s Snapshot
	s.Type, _ = arr[0].ToString()
	if f, _ := arr[1].ToString(); f != "" {
		s.Fence, _ = strconv.ParseInt(f, 10, 64)
	}
	if l, _ := arr[2].ToString(); l != "" {
		s.Limit, _ = strconv.Atoi(l)
	}
	if s.Holders, err = holdings(arr[3:]); err != nil {
		return Snapshot{}, fmt.Errorf("%w to read: %w", ErrProtocol, err)
	}
	return s, nil
}

// holdings reads the holders of a read's reply: value, then ms left, for
// each.
func holdings(arr []Reply) ([]Holding, error) {
	var hs []Holding
	for i := 0; i+1 < len(arr); i += 2 {
		v, err1 := arr[i].ToString()
		ttl, err2 := arr[i+1].AsInt64()
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		hs = append(hs, Holding{Value: v, TTL: time.Duration(ttl) * time.Millisecond})
	}
	return hs, nil
}

// Line is what [Client.ReadLine] found of a lock's line.
type Line struct {
	Waiting int      // how many stand in line
	Values  []string // the values of the first ones, first in line first
	// Entries are their entries in the waiters hash as the scripts wrote
	// them ("<lapse> <claim> <room>", or a read-write lock's with its mode
	// before the room), "" for a value without one.
	Entries  []string
	Fence    string // what the fencing key holds, when FenceSet
	FenceSet bool   // whether the fencing key exists
}

// ReadLine returns the line of k's lock (any kind), naming the first n in
// line, and what its fencing key holds, in one round trip that writes
// nothing.
func (c *Client) ReadLine(ctx context.Context, k Keys, n int) (Line, error) {
	arr, err := c.run(ctx, lineScript, []string{k.Queue, k.Fence, k.Waiters}, []string{strconv.Itoa(n)}).ToArray()
	if err != nil {
		return Line{}, err
	}
	if len(arr) != 4 {
		return Line{}, fmt.Errorf("%w to read the line: %d elements", ErrProtocol, len(arr))
	}
	var l Line
	waiting, err := arr[0].AsInt64()
	if err != nil {
		return Line{}, fmt.Errorf("%w to read the line: %w", ErrProtocol, err)
	}
	l.Waiting = int(waiting)
	if l.Values, err = stringsOf(arr[1]); err != nil {
		return Line{}, err
	}
	if l.Entries, err = stringsOf(arr[3]); err != nil {
		return Line{}, err
	}
	if !arr[2].IsNil() {
		if l.Fence, err = arr[2].ToString(); err != nil {
			return Line{}, fmt.Errorf("%w to read the line: %w", ErrProtocol, err)
		}
		l.FenceSet = true
	}
	return l, nil
}

// stringsOf reads an array reply of strings.
func stringsOf(r Reply) ([]string, error) {
	arr, err := r.ToArray()
	if err != nil {
		return nil, fmt.Errorf("%w to read the line: %w", ErrProtocol, err)
	}
	out := make([]string, len(arr))
	for i, e := range arr {
		if out[i], err = e.ToString(); err != nil {
			return nil, fmt.Errorf("%w to read the line: %w", ErrProtocol, err)
		}
	}
	return out, nil
}

// RWHolders is what [Client.ReadRW] found in a read-write lock's hash.
type RWHolders struct {
	Marked  bool      // the hash carries distlock's mark (one without it is not distlock's)
	Writer  string    // the value "~w" names, "" when none
	Holders []Holding // the holders whose lease has not ended, the first to end first
}

// ReadRW returns the holders in the hash at k's lease key, in one round
// trip that writes nothing. For a key that is no hash it returns Redis's
// error.
func (c *Client) ReadRW(ctx context.Context, k Keys) (RWHolders, error) {
	arr, err := c.run(ctx, rwReadScript, []string{k.Lease}, nil).ToArray()
	if err != nil {
		return RWHolders{}, err
	}
	if len(arr) < 2 || len(arr)%2 != 0 {
		return RWHolders{}, fmt.Errorf("%w to read the holders: %d elements", ErrProtocol, len(arr))
	}
	mark, err1 := arr[0].ToString()
	writer, err2 := arr[1].ToString()
	if err := errors.Join(err1, err2); err != nil {
		return RWHolders{}, fmt.Errorf("%w to read the holders: %w", ErrProtocol, err)
	}
	h := RWHolders{Marked: mark == "rw", Writer: writer}
	if h.Holders, err = holdings(arr[2:]); err != nil {
		return RWHolders{}, fmt.Errorf("%w to read the holders: %w", ErrProtocol, err)
	}
	return h, nil
}
