package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Several locks at once.
//
// A request for several locks (distlock's MultiMutex) takes them one after
// the other in one order that every request agrees on ([SortSet]: by
// Redis Cluster slot, then by lease key), and holds the ones it has while
// it waits in the line of the next. The scripts of a set run, for each of
// its locks in that order, exactly what a lock's own acquire and release
// scripts run (acquireScript's and releaseScript's bodies, called as Lua
// functions with that lock's keys), so each lock of the set is the same
// lock as a Mutex of its name: its holder, line, fencing sequence and
// announcements are the Mutex's. One script serves the locks of one group
// (one slot on a Cluster, every lock on one server; see
// [Client.BatchGroup]); a set spread over groups takes one script per
// group, in order.
//
// Why the order cannot deadlock: a request holds only locks that come
// before the one it waits for, and a single lock's holder waits for
// nothing. So every wait goes from a request to the holder of a later
// lock, or to a request ahead of it in the same line, which waits for that
// holder too; no chain of waits can come back to where it started. The
// request stands in each line with one ticket, taken where it first
// stood in line, so every line orders the requests in it the same way.
//
// What a waiting request costs the others: the locks before the one it
// waits for are held, but only for its claim window at a time (acquireAll
// shortens their lease to it when the request stands in line, and the
// request renews them while it waits), so a waiter that dies frees them a
// claim window after its last call, as a dead waiter's place lapses.

// MaxSet is the most locks one set may hold.
const MaxSet = 64

// ErrBadSet is returned by [Client.AcquireAll], [Client.ReleaseAll] and
// [Client.CancelAll] for a set they cannot serve: empty, longer than
// [MaxSet], holding a lock twice, holding a semaphore, an election or a
// read-write lock's keys, or spread over several groups (see
// [Client.BatchGroup]).
var ErrBadSet = errors.New("lease: invalid set of locks")

// SetGrant is the outcome of [Client.AcquireAll].
type SetGrant struct {
	// Held is how many of the set's locks, from the first, hold the
	// caller's value now: all of them when the set was granted.
	Held int
	// Stopped is the index of the lock that was not granted, at which the
	// call stopped (equal to Held when the caller stands in line; a single
	// attempt holds none), and the set's size when every lock was.
	Stopped int
	// Tokens are the fencing tokens of the locks held, in order.
	Tokens []int64
	// Blocked is, when Held is short of the set, the reply for the lock
	// at index Held, as [Client.AcquireOrQueue] (or [Client.Acquire])
	// would have given it: who holds it, and the caller's place in its
	// line.
	Blocked Grant
}

// SortSet sorts ks into the order in which a set takes its locks: by the
// Redis Cluster slot of the lease key, then by the lease key. Every
// process uses the same order whatever its client, so that requests for
// overlapping sets cannot wait for each other in a circle. It reports the
// first lock that is there twice as an error matching [ErrBadSet].
func SortSet(ks []Keys) error {
	slices.SortFunc(ks, func(a, b Keys) int {
		return cmp.Or(cmp.Compare(keySlot(a.Lease), keySlot(b.Lease)), strings.Compare(a.Lease, b.Lease))
	})
	for i := 1; i < len(ks); i++ {
		if ks[i].Lease == ks[i-1].Lease {
			return fmt.Errorf("%w: %s is in the set twice", ErrBadSet, ks[i].Lease)
		}
	}
	return nil
}

// checkSet checks a set of one group before anything is sent.
func (c *Client) checkSet(ks []Keys) error {
	switch {
	case len(ks) == 0:
		return fmt.Errorf("%w: no locks", ErrBadSet)
	case len(ks) > MaxSet:
		return fmt.Errorf("%w: %d locks, at most %d", ErrBadSet, len(ks), MaxSet)
	}
	group := c.BatchGroup(ks[0])
	for i, k := range ks {
		if k.Permits != 0 || k.Mode != 0 || k.Announce {
			return fmt.Errorf("%w: %s is not a plain lock", ErrBadSet, k.Lease)
		}
		if i > 0 && c.BatchGroup(k) != group {
			return fmt.Errorf("%w: %s and %s are in different groups (%s, %s)", ErrBadSet,
				ks[0].Lease, k.Lease, group, c.BatchGroup(k))
		}
		for _, o := range ks[:i] {
			if o.Lease == k.Lease {
				return fmt.Errorf("%w: %s is in the set twice", ErrBadSet, k.Lease)
			}
		}
	}
	return nil
}

// setKeys lays out the keys of a set's scripts: each lock's five keys, as
// the lock's own scripts take them (see Keys.all).
func setKeys(ks []Keys, value string) []string {
	keys := make([]string, 0, 5*len(ks))
	for _, k := range ks {
		keys = append(keys, k.Lease, k.Fence, k.Queue, k.Waiters, k.Void(value))
	}
	return keys
}

// AcquireAll acquires the locks of ks, which must be of one group (see
// [Client.BatchGroup]), in their order, in one script: it runs
// [Client.AcquireOrQueue] (p not nil) or [Client.Acquire] (p nil) for
// each lock in turn, and stops at the first that is not granted. All the
// locks are then held with ttl, each with its own fencing token, or:
//
//   - with p, the locks before the one it stopped at are held for p.Claim
//     only (their lease is shortened to it), and the caller stands in the
//     line of that lock with p's ticket; it must call again (which grants
//     the locks it holds anew) or renew them within the claim window;
//   - without p (a single attempt), the call leaves each lock as it found
//     it: it tries the locks that are not free (held, with a line, or
//     voided for value) first, and grants a free one only once none of
//     them was refused, so a refused call issues no token and makes no
//     fencing key for a free lock. A lock it granted before the refusal
//     (one that value held already, or whose line held only waiters that
//     died) is deleted again, its token used up.
//
// A lock whose keys hold something else stops the script with an error,
// having deleted the locks that this call granted. With a Client made by
// [NewWithAck], a set granted whole but not acknowledged by the replicas
// is released again and an [*AckError] returned.
//
// The order of ks is the caller's: a MultiMutex sorts them with
// [SortSet] first.
func (c *Client) AcquireAll(ctx context.Context, ks []Keys, value string, ttl time.Duration, p *Place) (SetGrant, error) {
	if ttl < time.Millisecond {
		return SetGrant{}, ErrBadTTL
	}
	if err := c.checkSet(ks); err != nil {
		return SetGrant{}, err
	}
	args := []string{ms(ttl)}
	if p != nil {
		if p.Claim < time.Millisecond || p.Room == "" || strings.ContainsRune(p.Room, ' ') || p.Ticket < 0 {
			return SetGrant{}, fmt.Errorf("%w: %+v", ErrBadPlace, *p)
		}
		if len(p.SetSeen) > len(ks) {
			return SetGrant{}, fmt.Errorf("%w: %d seen tokens for a set of %d", ErrBadPlace, len(p.SetSeen), len(ks))
		}
		args = append(args, ms(p.Claim), p.Room, strconv.FormatInt(p.Ticket, 10))
		for i, seen := range p.SetSeen {
			if seen < 0 {
				return SetGrant{}, fmt.Errorf("%w: seen token %d of lock %d is negative", ErrBadPlace, seen, i)
			}
			args = append(args, strconv.FormatInt(seen, 10))
		}
	}
	res, w := c.exec(ctx, acquireAllScript, setKeys(ks, value), args)
	arr, err := res.ToArray()
	if err != nil {
		return SetGrant{}, setKindError(ks, err)
	}
	g, err := parseSetGrant(arr, len(ks))
	if err != nil {
		return SetGrant{}, err
	}
	if g.Held == len(ks) {
		if err := c.ackError("acquire", ks[0].Lease, w); err != nil {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
			defer cancel()
			if _, uerr := c.ReleaseAll(uctx, ks, value); uerr != nil {
				return SetGrant{}, fmt.Errorf("%w; deleting the locks again failed, they expire on their own: %v", err, uerr)
			}
			return SetGrant{}, err
		}
	}
	return g, nil
}

// setKindError is kindError for the lock of ks that the error reply names
// (a set's scripts stop at the first lock of another kind).
func setKindError(ks []Keys, err error) error {
	rerr, ok := replyError(err)
	if !ok {
		return err
	}
	for _, k := range ks {
		if strings.Contains(rerr.Message, " "+k.Lease+" holds a ") {
			return kindError(k, err)
		}
	}
	return err
}

// parseSetGrant reads acquireAllScript's reply for a set of n locks.
func parseSetGrant(arr []Reply, n int) (SetGrant, error) {
	if len(arr) < 2 {
		return SetGrant{}, fmt.Errorf("%w to acquire a set: %d elements", ErrProtocol, len(arr))
	}
	held, err1 := arr[0].AsInt64()
	stopped, err2 := arr[1].AsInt64()
	if err := errors.Join(err1, err2); err != nil || held < 0 || held > stopped || stopped > int64(n) || len(arr) < int(held)+2 {
		return SetGrant{}, fmt.Errorf("%w to acquire a set: %d held, stopped at %d of %d, %d elements", ErrProtocol, held, stopped, n, len(arr))
	}
	g := SetGrant{Held: int(held), Stopped: int(stopped), Tokens: make([]int64, held)}
	var err error
	for i := range g.Tokens {
		if g.Tokens[i], err = arr[i+2].AsInt64(); err != nil {
			return SetGrant{}, fmt.Errorf("%w to acquire a set: %w", ErrProtocol, err)
		}
	}
	if g.Stopped == n {
		return g, nil
	}
	rest := arr[held+2:]
	if len(rest) < 6 {
		return SetGrant{}, fmt.Errorf("%w to acquire a set: %d elements for the lock it stopped at", ErrProtocol, len(rest))
	}
	pttl, err1 := rest[1].AsInt64()
	rank, err2 := rest[3].AsInt64()
	ticket, err3 := rest[4].AsInt64()
	fence, err4 := rest[5].AsInt64()
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return SetGrant{}, fmt.Errorf("%w to acquire a set: %w", ErrProtocol, err)
	}
	g.Blocked = Grant{HolderTTL: time.Duration(pttl) * time.Millisecond, Rank: int(rank), Ticket: ticket, Fence: fence}
	g.Blocked.Holder, _ = rest[2].ToString()
	return g, nil
}

// ReleaseAll releases each lock of ks (of one group) as [Client.Release]
// would, in one script, and returns what each release did, in the order
// of ks. It retries as Release does.
func (c *Client) ReleaseAll(ctx context.Context, ks []Keys, value string) ([]Release, error) {
	return c.releaseAll(ctx, ks, value, "", c.run)
}

// CancelAll gives value up for each lock of ks (of one group) as
// [Client.Cancel] would, in one script.
func (c *Client) CancelAll(ctx context.Context, ks []Keys, value string, ttl time.Duration) ([]Release, error) {
	if ttl < time.Millisecond {
		return nil, ErrBadTTL
	}
	return c.releaseAll(ctx, ks, value, ms(ttl), c.run)
}

// CancelAllDedicated is CancelAll on a connection of its own, as
// [Client.CancelDedicated] is Cancel.
func (c *Client) CancelAllDedicated(ctx context.Context, ks []Keys, value string, ttl time.Duration) ([]Release, error) {
	if ttl < time.Millisecond {
		return nil, ErrBadTTL
	}
	return c.releaseAll(ctx, ks, value, ms(ttl), c.runDedicated)
}

func (c *Client) releaseAll(ctx context.Context, ks []Keys, value, void string,
	run func(context.Context, *Script, []string, []string) Reply) ([]Release, error) {
	if err := c.checkSet(ks); err != nil {
		return nil, err
	}
	args := []string{value}
	if void != "" {
		args = append(args, void)
	}
	keys := setKeys(ks, value)
	var err error
	for range releaseTries {
		var arr []Reply
		arr, err = run(ctx, releaseAllScript, keys, args).ToArray()
		if err == nil {
			return parseSetRelease(arr, len(ks))
		}
		err = setKindError(ks, err)
		if IsReply(err) || ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

// parseSetRelease reads releaseAllScript's reply for a set of n locks:
// for each lock, whether it was deleted, the number of passes, and a
// {token, value, room} triple per pass.
func parseSetRelease(arr []Reply, n int) ([]Release, error) {
	out := make([]Release, n)
	i := 0
	for j := range out {
		if i+2 > len(arr) {
			return nil, fmt.Errorf("%w to release a set: %d elements for %d locks", ErrProtocol, len(arr), n)
		}
		deleted, err1 := arr[i].AsInt64()
		passes, err2 := arr[i+1].AsInt64()
		end := i + 2 + 3*int(passes)
		if err := errors.Join(err1, err2); err != nil || passes < 0 || end > len(arr) {
			return nil, fmt.Errorf("%w to release a set: lock %d: %v", ErrProtocol, j, err)
		}
		out[j].Deleted = deleted == 1
		if err := out[j].addPasses(arr[i+2 : end]); err != nil {
			return nil, err
		}
		i = end
	}
	return out, nil
}

// acquireAllScript runs acquireScript's body for each lock of a set, as a
// function of that lock's keys, and stops at the first that is not
// granted (see [Client.AcquireAll]).
//
// KEYS: each lock's five keys, as acquireScript takes them (lease, fence,
// queue, waiters, void). ARGV[1] the TTL in ms; to stand in line
// ARGV[2] the claim window in ms, ARGV[3] the room, ARGV[4] the ticket (0
// for a new place), and ARGV[4 + i] the seen token of lock i (from 1; see
// [Place.SetSeen]; absent or "0": none), which becomes acquireScript's
// ARGV[6] for that lock, so that each lock's grant check is a Mutex's.
// Reply: {held, stopped, token of each lock held, ...}:
// held counts the locks that hold the value now, stopped is the index
// (from 0) of the lock it stopped at (the set's size when it did not), and,
// when it stopped, acquireScript's reply for that lock follows; or the
// error reply of a lock whose keys hold something else.
//
// Cost per call (as for acquireScript, scripts/script-cost, N=200): a
// single attempt at a free set of 2 162k, of 8 551k, some 15k and 40k
// more than without its check that every lock is free (one EXISTS of the
// set's keys); standing in line at the 5th lock of 8 427k, as before.
var acquireAllScript = newScript(`
local acquire = function(KEYS, ARGV)
` + acquireScript.Source() + `
end
local n = #KEYS / 5
local args = {ARGV[1]}
if ARGV[2] then
  args = {ARGV[1], '', ARGV[2], ARGV[3], ARGV[4]}
end
local lock = function(i)
  local b = 5 * (i - 1)
  return {KEYS[b + 1], KEYS[b + 2], KEYS[b + 3], KEYS[b + 4], KEYS[b + 5]}
end
-- stop replies for lock i, not granted (r, acquireScript's reply), or an
-- error; out holds the reply's start, the tokens of the locks before it
-- when they were granted to a caller standing in line. Standing in line, the locks before it wait with the caller, for
-- its claim window (after an error too: the caller gives them up, passing
-- each to its line). A single attempt gives back those that hold the
-- value (nobody alive was ahead in their lines a moment ago, so the delete
-- needs no pass).
local stop = function(i, r, out)
  local value = string.sub(KEYS[5], #KEYS[1] + 7)
  for j = 1, i - 1 do
    local lk = KEYS[5 * (j - 1) + 1]
    if ARGV[2] then
      redis.call('PEXPIRE', lk, ARGV[2])
    elseif redis.call('GET', lk) == value then
      redis.call('DEL', lk)
    end
  end
  if r.err then
    return r
  end
  if not ARGV[2] then
    out = {0}
  end
  out[2] = i - 1
  for _, x in ipairs(r) do
    out[#out + 1] = x
  end
  return out
end
if not ARGV[2] and n > 1 then
  -- A single attempt first tries, in order, each lock that is not
  -- plainly free (its lease, its line or the value's void marker exists:
  -- what acquireScript's common case finds absent), and only then grants
  -- the free ones: one refused ends the attempt before any free lock was
  -- granted, so with no token issued and no fencing key made for them.
  -- (A lock granted here, to the value that held it already or past a
  -- line of the dead, is deleted again by stop.) That check is only a
  -- shortcut: the loop below grants each lock as acquireScript decides.
  local all = {}
  for i = 1, n do
    local b = 5 * (i - 1)
    all[3 * i - 2], all[3 * i - 1], all[3 * i] = KEYS[b + 1], KEYS[b + 3], KEYS[b + 5]
  end
  if redis.call('EXISTS', unpack(all)) > 0 then
    for i = 1, n do
      local k = lock(i)
      if redis.call('EXISTS', k[1], k[3], k[5]) > 0 then
        local r = acquire(k, args)
        if type(r) ~= 'number' then
          return stop(i, r, nil)
        end
      end
    end
  end
end
local out = {0, 0}
for i = 1, n do
  if ARGV[2] then
    -- The lock's seen token, as a Mutex's call brings it (ARGV[6]).
    local seen = ARGV[4 + i]
    if seen == '0' then
      seen = nil
    end
    args[6] = seen
  end
  local r = acquire(lock(i), args)
  if type(r) ~= 'number' then
    return stop(i, r, out)
  end
  out[1] = i
  out[2] = i
  out[i + 2] = r
end
return out
`)

// releaseAllScript runs releaseScript's body for each lock of a set, as a
// function of that lock's keys (see [Client.ReleaseAll]).
//
// KEYS: each lock's five keys, as for acquireAllScript. ARGV[1] the value,
// ARGV[2] for a Cancel how long the void key lasts, in ms. Reply: for
// each lock, deleted (1 or 0), the number of passes, and a {token, value,
// room} triple per pass; an error reply of one lock's release stops the
// rest.
var releaseAllScript = newScript(`
local release = function(KEYS, ARGV)
` + releaseScript.Source() + `
end
local n = #KEYS / 5
local args = {ARGV[1]}
if ARGV[2] then
  args = {ARGV[1], '', ARGV[2]}
end
local out = {}
for i = 1, n do
  local b = 5 * (i - 1)
  local k = {KEYS[b + 1], KEYS[b + 2], KEYS[b + 3], KEYS[b + 4]}
  if ARGV[2] then
    k[5] = KEYS[b + 5]
  end
  local r = release(k, args)
  if type(r) == 'number' then
    out[#out + 1] = r
    out[#out + 1] = 0
  elseif r.err then
    return r
  else
    out[#out + 1] = r[1]
    out[#out + 1] = (#r - 1) / 3
    for j = 2, #r do
      out[#out + 1] = r[j]
    end
  end
end
return out
`)
