package lease

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/rueidis"
)

// FenceRetention is how long the fencing key outlives the last acquisition.
// It guards token order against a server clock that steps back; see the
// package documentation.
const FenceRetention = 24 * time.Hour

// ErrProtocol is wrapped by errors for replies that do not have the shape the
// scripts return, which means something other than distlock wrote the keys or
// answered the call.
var ErrProtocol = errors.New("unexpected reply")

// ErrWrongKind is matched by a [*WrongKindError].
var ErrWrongKind = errors.New("distlock: name used by another kind of lease")

// WrongKindError reports a call of one kind (a lock's in any face, a
// semaphore's) refused because the lease key holds another kind, or a key
// that distlock did not write. Nothing was written. A lock's and a
// read-write lock's calls are one kind: they never refuse each other.
type WrongKindError struct {
	Key   string // the lease key
	Want  string // "lock", "semaphore" or "rwmutex"
	Found string // "semaphore", "lock", "rwmutex", or the Redis type of a foreign key ("hash", "list", ...)
	Reply error  // the script's error reply
}

func (e *WrongKindError) Error() string {
	// distlock wraps this error in one that says what it was doing, so the
	// text does not repeat the "distlock:" prefix.
	if e.Found == "lock" || e.Found == "semaphore" || e.Found == "rwmutex" {
		return fmt.Sprintf("%s is a %s, not a %s: the name is used by another kind", e.Key, e.Found, e.Want)
	}
	return fmt.Sprintf("%s holds a %s, not a %s: distlock did not write it", e.Key, e.Found, e.Want)
}

// Is reports whether target is [ErrWrongKind].
func (e *WrongKindError) Is(target error) bool { return target == ErrWrongKind }

// Unwrap returns the script's error reply.
func (e *WrongKindError) Unwrap() error { return e.Reply }

// IsReply reports whether err is, or wraps, an error that Redis answered
// with (an error reply): the call reached Redis and did not run to a write,
// as opposed to a call that got no reply (a lost connection, a deadline),
// whose outcome is unknown.
func IsReply(err error) bool {
	_, ok := replyError(err)
	return ok
}

// wrongKindReply matches the error reply of a script that found the lease
// key of another kind (see lineLua's scan and semLua's notSemaphore).
var wrongKindReply = regexp.MustCompile(`^(?:ERR )?distlock: .* holds a (\w+), not a (lock|semaphore|rwmutex);`)

// kindError turns the error reply of a script that found the lease key of
// another kind into a *WrongKindError, and returns any other error as it is.
func kindError(k Keys, err error) error {
	rerr, ok := replyError(err)
	if !ok {
		return err
	}
	m := wrongKindReply.FindStringSubmatch(rerr.Message)
	if m == nil {
		return err
	}
	found := m[1]
	switch found {
	case "string":
		found = "lock" // a lock's or an election's lease
	case "zset":
		found = "semaphore"
	}
	return &WrongKindError{Key: k.Lease, Want: m[2], Found: found, Reply: err}
}

// ErrBadTTL is returned for a TTL under one millisecond, Redis's unit.
var ErrBadTTL = errors.New("lease: TTL under one millisecond")

// The scripts share one key layout, so that the helpers below can name the
// keys by position: KEYS[1] lease, KEYS[2] fencing key, KEYS[3] queue,
// KEYS[4] waiters, KEYS[5] wake channel prefix (a channel, declared as a key
// so that Redis Cluster checks that it shares the lease's slot and answers
// TRYAGAIN while the slot moves), and for the scripts that take one KEYS[6],
// the value's void key (see [Keys.Void]). The protocol they implement is
// described in doc.go.

// The common case of a script comes first and defines no function: Lua
// makes a closure each time a "local function" statement runs, and making
// the dozen helpers of lockLua and protocolLua costs about 10,000
// instructions (callgrind), more than two calls. The two lean pieces below
// are shared by several scripts' common cases, as text, and cancelLua by
// the full paths of the releases.
//
// leanAnnounceLua publishes msg on the election's channel, as protocolLua's
// publish does; the includer declares msg.
//
// leanClockLua sets t to the server's clock (TIME's seconds and µs, as
// text) and us to its µs as six digits; the includer declares both.
//
// cancelLua is where the full path of a release starts for Cancel
// (KEYS[6], the void key, given): it takes value out of line (only Cancel
// can find its value there: a holder's value left the line when it was
// granted) and marks it void for ARGV[3] ms, after the delete (at
// maxmemory Redis refuses a script's first write unless it frees memory,
// and the delete must not depend on the marker). It declares out, the
// reply {deleted}, and returns it when the line's keys are of the wrong
// type; the includer declares value and deleted, and protocolLua's leave.
//
// leanTokenLua reads the fencing key and the clock, and makes the token as
// nextToken (in protocolLua) does, and its text: the clock's seconds and µs
// side by side spare a string.format. (Arithmetic on a string reads it as a
// number at half the cost of tonumber.) It declares token, s, now (the
// clock in µs), t and us; token is nil when the fencing key holds no token
// that can be followed (fence's rule) or the next token would pass
// 2^53-1, and the full path is left to say so.
var (
	leanAnnounceLua = `
local r = redis.pcall('SPUBLISH', KEYS[1] .. ':leader', msg)
if type(r) == 'table' and r.err then
  redis.pcall('PUBLISH', KEYS[1] .. ':leader', msg)
end
`
	cancelLua = `
local err
if KEYS[6] then
  err = leave(value)
  redis.call('SET', KEYS[6], '1', 'PX', ARGV[3])
end
local out = {deleted}
if err then
  return out
end
`
	leanClockLua = `
t = redis.call('TIME')
us = t[2]
if #us < 6 then
  us = string.rep('0', 6 - #us) .. us
end
`
	leanTokenLua = `
local token, s, now, t, us
local raw = redis.pcall('GET', KEYS[2])
if not raw or type(raw) == 'string' and string.find(raw, '^%d+$') then
` + leanClockLua + `
  now = t[1] * 1000000 + t[2]
  token, s = now, t[1] .. us
  local last = raw and raw + 0 or 0
  if token <= last then
    token = last + 1
    s = string.format('%.0f', token)
  end
  if token > 9007199254740991 then
    token = nil
  end
end
`
)

// voidLua is the text of the full path of an acquire that refuses a voided
// value (see [Client.Cancel]): it takes the value out of line and returns
// reply, a Lua expression (the reply of a caller that is not granted). The
// includer declares value and err, and protocolLua's leave.
func voidLua(reply string) string {
	return `
if redis.call('EXISTS', KEYS[6]) == 1 then
  err = leave(value)
  if err then
    return err
  end
  return ` + reply + `
end
`
}

// acquireScript acquires the lease if it is free, or, when asked, puts the
// caller in line or refreshes its place there. It is the script of a lock
// and of an election, which hold the lock of their name alone; a
// read-write lock of the same name is the same lock (rwAcquireScript), and
// both take one full path (lockAcquireLua).
//
// ARGV[1] TTL in ms, ARGV[2] "1" to announce every change of holder (an
// election; see [Keys.Election]), and to stand in line ARGV[3] the claim
// window in ms, ARGV[4] the waiting room, ARGV[5] a ticket to stand in line
// with (absent or "0": a new one, at the end). A lock's Acquire sends ARGV[1]
// alone: a missing ARGV[2] is no election, a missing ARGV[3] a caller that
// does not stand in line. The acquisition's value is not an argument: it is
// the end of its void key, KEYS[6], after KEYS[1] .. ":void:" (each
// argument costs Redis more than cutting it out of the key).
//
// Reply: the token, a number alone, when the lease is now the caller's, for
// the TTL (a table would cost Redis about 4,500 instructions more); or
// {0, pttl, holder value, rank, ticket, fence} when it is not: pttl is the
// holder's remaining lease (-1 when the key has no expiry, -2 when there is
// none), rank the caller's place in line (0 first; -1 when it does not stand
// in line), ticket the score of that place, and fence the last token issued
// when the script ran.
//
// The lease is granted to the caller when it is free and nobody alive stands
// in line ahead of the caller, and when it already holds the caller's value
// (a grant made to it while it waited, or an earlier attempt whose reply was
// lost): the caller gets the full TTL in both cases, with a new token in the
// first and, in the second, the token of the grant it already had (the
// fencing key's, since every grant sets both; a new one if that key was
// lost). When it is free but someone alive stands in line ahead, the script
// passes it to the first of them (with the run of readers behind a reader
// first in line), exactly as a release does, and the caller waits; while
// readers of a read-write lock hold it, the caller waits behind them. A
// voided value (see [Client.Cancel]) is refused and taken out of
// line. All checks come before the first write, so a key of the wrong type
// or content fails the script without leaving anything behind.
//
// The script starts with the common case, a free lease with nobody in line
// and a value that is not void, in five calls (EXISTS, GET, TIME, SET, SET)
// and without defining any helper; then, for a caller that does not stand
// in line (TryLock), a lease that another's string holds with nobody in
// line, refused in EXISTS, GET, GET and PTTL. When neither case applies, or
// the fencing key does not hold a token that can be followed, it has
// written nothing and the full path decides, as if it had not run.
//
// Cost per call (callgrind instructions and µs in Redis; COSTS.md,
// scripts/script-cost): the common case 72k, 5.1 µs (an election's 80k);
// refused (TryLock) 56k; standing in line 166k (behind readers 222k).
var acquireScript = newScript(`
local value = string.sub(KEYS[6], #KEYS[1] + 7)
-- The common case: a free lease, nobody in line, a value not void.
local n = redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[6])
if n == 0 then
` + leanTokenLua + `
  if token then
    redis.call('SET', KEYS[1], value, 'PX', ARGV[1])
    redis.call('SET', KEYS[2], s, 'PX', ` + retentionMs + `)
    if ARGV[2] == '1' then
      local msg = s .. '\n' .. value
` + leanAnnounceLua + `
    end
    return token
  end
end
-- The next most common: a TryLock refused by another's string, with
-- nobody in line (only the lease exists); as the full path replies.
if n == 1 and not ARGV[3] then
  local cur = redis.pcall('GET', KEYS[1])
  local raw = redis.pcall('GET', KEYS[2])
  if type(cur) == 'string' and cur ~= value and (not raw or type(raw) == 'string' and string.find(raw, '^%d+$')) then
    return {0, redis.call('PTTL', KEYS[1]), cur, -1, 0, raw and raw + 0 or 0}
  end
end
` + lockLua + protocolLua + grantLua + lineLua + `
-- The full path, as every face of the lock takes it.
announcing = ARGV[2] == '1'
` + lockAcquireLua)

// releaseScript deletes the lease if it still holds the caller's value and
// passes it to the first live waiter in line, if there is one. For
// [Client.Cancel] it also marks the value void and takes it out of line.
//
// ARGV[1] the acquisition's value, ARGV[2] "1" to announce the change of
// holder (an election), ARGV[3] for Cancel how long the void key lasts, in
// ms. A lock's Release sends only ARGV[1].
//
// Reply: deleted, a number alone, in the common case, or {deleted} or
// {deleted, token, waiter value, room, ...}: deleted is 1 when the lease
// held the value and was deleted; each triple names a waiter the lock was
// passed to (one exclusive waiter, or the run of readers of a read-write
// lock at the head of the line). A lease that was already free is passed
// on as well, so that a waiter who gives up also unblocks a line whose
// grant lapsed, or the readers behind it. The full path (lockReleaseLua)
// is a read-write lock's too, and drops the value's hold in the hash if it
// is there.
// A fencing or queue key of the wrong type or content does not stop the
// delete: the lease is deleted and not passed on.
//
// The script starts with the common case, a lease that holds the value with
// nobody in line: GET, DEL and EXISTS (and for Cancel the void marker; for
// an election GET of the fencing key and the announcement that nobody
// leads), without defining any helper. Otherwise the full path goes on
// from what that part found (deleted, gone).
//
// Cost per call (as for acquireScript): the common case 37k, 2.5 µs
// (Cancel's 53k; an election's 51k); passing the lease on 163k (to a
// reader 194k).
var releaseScript = newScript(`
-- The common case: the lease holds the value, and nobody is in line.
local value = ARGV[1]
local cur = redis.pcall('GET', KEYS[1])
local deleted, gone = 0, false
if cur == value then
  redis.call('DEL', KEYS[1])
  deleted, gone = 1, true
  -- An election's release says that nobody leads, with the token of the
  -- term that ends (the fencing key's, since every grant sets it).
  local line = redis.call('EXISTS', KEYS[3]) == 1
  local msg = not line and ARGV[2] == '1' and redis.pcall('GET', KEYS[2])
  if not line and (not msg or type(msg) == 'string' and string.find(msg, '^%d+$')) then
    if msg then
      msg = msg .. '\n'
` + leanAnnounceLua + `
    end
    if KEYS[6] then
      -- After the delete: at maxmemory Redis refuses a script's first
      -- write unless it frees memory, and the delete must not depend on
      -- the marker.
      redis.call('SET', KEYS[6], '1', 'PX', ARGV[3])
    end
    return 1
  end
end
` + lockLua + protocolLua + lineLua + serveLua + `
-- The full path, from what the common case found.
announcing = ARGV[2] == '1'
` + lockReleaseLua)

// protocolLua calls hold(value, ms, now, token) to make value hold the
// lease for ms milliseconds from now (the server clock in µs) under token;
// lockLua and semLua define it.
//
// lockLua defines hold for every face of a lock (a Mutex, an Election, an
// RWMutex), in holdMode, which the script sets before each grant: "x" (an
// exclusive hold of a Mutex or an Election) writes the lease as a string
// holding the value, in one SET; "w" (an RWMutex's writer) and "r" (a
// reader) write the value's field of the hash, "<end ms> <token>", with
// the mark "~" = "rw", and for a writer the field "~w" naming it, and keep
// the hash at least ms. mode is the caller's face ("x", "r" or "w"; for a
// read-write lock's release or downgrade, "r": the format it reads first)
// and want the kind it names in an error reply ("lock" or "rwmutex"); the
// scripts of a read-write lock set them before their full path.
var lockLua = `
local mode, holdMode, want = 'x', 'x', 'lock'
local function hold(v, ms, now, token)
  if holdMode == 'x' then
    redis.call('SET', KEYS[1], v, 'PX', ms)
    return
  end
  -- An end in ms has 13 digits, which Lua writes exactly (%.14g); a token
  -- has 16.
  local f = math.ceil(now / 1000) + ms .. ' ' .. string.format('%.0f', token)
  if holdMode == 'w' then
    redis.call('HSET', KEYS[1], v, f, '~w', v, '~', 'rw')
  else
    redis.call('HSET', KEYS[1], v, f, '~', 'rw')
  end
  if redis.call('PTTL', KEYS[1]) < ms + 0 then
    redis.call('PEXPIRE', KEYS[1], ms)
  end
end
`

// semLua defines a semaphore's hold: it adds the value to the set of
// holders, scored by the server time in ms at which its lease ends (rounded
// up, so that a lease never ends before now + ms: it ends once the clock's
// whole ms reach the score), keeps the set at least that long, and records
// the caller's limit (the permits it was called with, set by the script's
// body) for inspection. It also defines notSemaphore, which returns the
// error reply for a lease key of another type (a lock's string), and
// dropEnded, which drops the holders whose lease has ended.
var semLua = `
local limit
local function hold(v, ms, now)
  redis.call('ZADD', KEYS[1], math.ceil(now / 1000) + ms, v)
  if redis.call('PTTL', KEYS[1]) < ms + 0 then
    redis.call('PEXPIRE', KEYS[1], ms)
  end
  redis.call('SET', KEYS[1] .. ':permits', limit, 'PX', ` + retentionMs + `)
end
local function notSemaphore()
  local t = ` + leaseKindLua + `
  if t ~= 'zset' and t ~= 'none' then
    return redis.error_reply('ERR distlock: ' .. KEYS[1] .. ' holds a ' .. t .. ', not a semaphore; is the name used by another kind?')
  end
end
local function dropEnded(now)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', math.floor(now / 1000))
end
`

// semPassLua defines passFree, which passes free permits, while fewer than
// permits are held, to the first live waiters in line (see passTo), after
// the token last (nil: read the fencing key first). It appends a
// {token, value, room} triple per pass to out, and returns the last token.
// A fencing or queue key of the wrong type stops it quietly: the caller's
// own grant or release stands. It follows protocolLua, whose helpers it
// calls.
var semPassLua = `
local function passFree(last, now, held, permits, out)
  while held < permits do
    local v, claim, room, _, ferr = first()
    if not v or ferr then
      break
    end
    if not last then
      local lerr
      last, lerr = fence()
      if lerr then
        break
      end
    end
    local token, terr = passTo(last, now, v, claim, room)
    if terr then
      break
    end
    table.insert(out, token)
    table.insert(out, v)
    table.insert(out, room)
    last, held = token, held + 1
  end
  return last
end
`

// semAcquireScript is acquireScript for a semaphore (see [Keys.Semaphore]).
// Its KEYS and ARGV are those of acquireScript, but for ARGV[2]: the
// caller's limit, the number of permits.
//
// Holders whose lease has ended are dropped first. The caller is granted a
// permit, with the full TTL and a new token, when it holds one already (a
// permit passed to it while it waited, or an earlier attempt whose reply was
// lost), or when fewer than permits holders remain and nobody alive stands
// in line ahead of it; free permits go to those ahead first, as a release
// passes them, and those left after the caller's to those behind it.
// Otherwise it stands in line, as with acquireScript. The reply
// has acquireScript's shape: pttl and holder name the holder whose lease
// ends first, the moment a permit may come free without a release.
//
// As acquireScript, it starts with the common case, a free permit for a
// value that holds none, with nobody in line and no void marker: EXISTS,
// ZCARD, GET, TIME, ZREMRANGEBYSCORE, ZADD, PTTL (not for the first
// holder), PEXPIRE if needed, SET, SET, and no helper defined. When all
// permits are taken it gives up after ZCARD (a permit whose lease ended is
// left to the full path); when the value holds a permit already, after
// removing the ended holders, which the full path starts with anyway.
//
// Cost per call (as for acquireScript): a free permit 106k, 7.9 µs; all
// permits held, standing in line 204k.
var semAcquireScript = newScript(`
local value = string.sub(KEYS[6], #KEYS[1] + 7)
-- The common case: nobody in line, a value not void, a free permit.
if redis.call('EXISTS', KEYS[3], KEYS[6]) == 0 then
  -- ZCARD counts the holders whose lease has ended too, so fewer than
  -- permits means one is free; it fails on a lease key that is no sorted
  -- set, and held 0 means there is no set yet.
  local held = redis.pcall('ZCARD', KEYS[1])
  if type(held) == 'number' and held < tonumber(ARGV[2]) then
` + leanTokenLua + `
    if token then
      -- dropEnded, and hold for a value that holds no permit yet (NX), as
      -- below.
      redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t[1] .. string.sub(us, 1, 3))
      if redis.call('ZADD', KEYS[1], 'NX', math.ceil(now / 1000) + ARGV[1], value) == 1 then
        if held == 0 or redis.call('PTTL', KEYS[1]) < ARGV[1] + 0 then
          redis.call('PEXPIRE', KEYS[1], ARGV[1])
        end
        redis.call('SET', KEYS[1] .. ':permits', ARGV[2], 'PX', ` + retentionMs + `)
        redis.call('SET', KEYS[2], s, 'PX', ` + retentionMs + `)
        return token
      end
    end
  end
end
` + semLua + protocolLua + grantLua + semPassLua + `
-- The full path.
local err = notSemaphore()
if err then
  return err
end
local last
last, err = fence()
if err then
  return err
end
local now = clock()
dropEnded(now)
limit = ARGV[2]
local permits = tonumber(limit)
local function waiting(rank, ticket)
  local soon = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if not soon[1] then
    return {0, -2, '', rank, ticket, last}
  end
  return {0, tonumber(soon[2]) - math.floor(now / 1000), soon[1], rank, ticket, last}
end
` + voidLua("waiting(-1, 0)") + `
if redis.call('ZSCORE', KEYS[1], value) then
  err = leave(value)
  if err then
    return err
  end
  return grant(last, now, value, ARGV[1])
end
local held = redis.call('ZCARD', KEYS[1])
while held < permits do
  local v, claim, room, _, ferr = first()
  if ferr then
    return ferr
  end
  if not v or v == value then
    if v then
      leave(v)
    end
    local reply = grant(last, now, value, ARGV[1])
    if type(reply) ~= 'number' then
      return reply
    end
    -- Permits still free (several leases ended at once, or the limit was
    -- raised) go to those behind the caller, as a release passes them.
    passFree(reply, now, held + 1, permits, {})
    return reply
  end
  local token, terr = passTo(last, now, v, claim, room)
  if terr then
    return terr
  end
  last, held = token, held + 1
end
if not ARGV[3] then
  return waiting(-1, 0)
end
local rank, ticket, serr = standInLine(now, value, ARGV[3], ARGV[4], tonumber(ARGV[5] or '0'))
if serr then
  return serr
end
return waiting(rank, ticket)
`)

// semReleaseScript is releaseScript for a semaphore: it gives up the
// caller's permit and passes every free permit to the first live waiters in
// line, in order. ARGV[1] the value, ARGV[2] the releaser's limit (at most
// that many holders after the passes), ARGV[3] the void key's TTL in ms
// (Cancel only).
//
// Reply: deleted, a number alone, when nobody is in line; otherwise
// {deleted, token, value, room, token, value, room, ...}: deleted is
// 1 when the caller held a permit whose lease had not ended, followed by one
// triple per waiter a permit was passed to.
//
// It starts by dropping the ended holders and the caller's permit, and
// returns at once when nobody stands in line (TIME, ZREMRANGEBYSCORE, ZREM,
// EXISTS, and the void marker for Cancel); only a line makes it define the
// helpers that pass permits on.
//
// Cost per call (as for acquireScript): nobody in line 51k, 3.7 µs; passing
// a permit on 195k.
var semReleaseScript = newScript(`
-- The common case: nobody in line.
local value = ARGV[1]
local t, us
` + leanClockLua + `
-- dropEnded (below); it fails, writing nothing, on a lease key that is no
-- sorted set.
if type(redis.pcall('ZREMRANGEBYSCORE', KEYS[1], '-inf', t[1] .. string.sub(us, 1, 3))) ~= 'number' then
  return {0}
end
local deleted = redis.call('ZREM', KEYS[1], value)
if redis.call('EXISTS', KEYS[3]) == 0 then
  if KEYS[6] then
    redis.call('SET', KEYS[6], '1', 'PX', ARGV[3])
  end
  return deleted
end
local now = t[1] * 1000000 + t[2]
` + semLua + protocolLua + semPassLua + `
-- The full path, from what the common case found.
` + cancelLua + `
limit = ARGV[2]
passFree(nil, now, redis.call('ZCARD', KEYS[1]), tonumber(limit), out)
return out
`)

// semRenewScript extends a semaphore holder's lease to ARGV[2] ms if its
// value (ARGV[1]) still holds a permit whose lease has not ended. It never
// re-creates one. Reply: 1 when extended, {0} when refused.
//
// Its numbers are read by arithmetic, and the score is passed to ZADD as a
// number, which Redis prints exactly (%.17g) below 2^53: both cost about
// half of tonumber and string.format. Cost per call (as for
// acquireScript): 61k, 4.3 µs.
var semRenewScript = newScript(`
local s = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(s) ~= 'string' then
  return {0}
end
local t = redis.call('TIME')
local ms, us, ttl = t[1] * 1000, t[2] / 1000, ARGV[2] + 0
if s + 0 <= ms + math.floor(us) then
  return {0}
end
redis.call('ZADD', KEYS[1], 'XX', ms + math.ceil(us) + ttl, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
`)

// protocolLua defines the helpers of acquireScript and releaseScript. They
// read the queue keys with pcall and hand back an error (foreign) for a key
// of the wrong type, so that acquire fails before it writes anything and
// release still deletes the lease. They read only what a call needs: the
// waiters hash only when someone is in line, TIME only when the clock
// matters. So the uncontended path stays short, and a foreign waiters key
// is noticed when the line is used, not by every acquisition.
//
// fence reads the fencing key and returns the last token, or the error
// reply to return: the key must hold digits only, since Lua's tonumber would
// also take "1.5", "0x10", " 5 ", "nan" or "inf".
//
// clock returns the server's clock in µs. nextToken returns it, or last+1
// if the clock has not moved past last, and refuses to pass 2^53-1, beyond
// which a Lua number (a float64) can no longer count by one. grant writes
// value to the lease with ttl, stores the next token with the fencing key's
// retention, and returns the reply {1, token}.
//
// A waiter's entry in KEYS[4] is "<lapse ms> <claim ms> <room>": its place
// lapses at the server time lapse unless refreshed, and a grant to it lasts
// its claim window. leave takes a value out of line, writing nothing when it
// is not there (Redis lets a script past maxmemory once it has written, so
// the acquire script must not write before its grant unless it has to; a
// write that frees memory, as a lapsed place's removal, is fine). first
// returns the first waiter in line whose place has not lapsed (value, claim,
// room), the clock (now, or read when now is nil), no error, and the
// entry's mode ("r" or "w" for a read-write lock's "<lapse> <claim> <r|w>
// <room>", "x" for an exclusive entry without one), dropping lapsed places
// ahead of it; nothing but the clock when nobody waits. passTo grants the free lease to that waiter for its
// claim window with a new token, takes it out of line and tells its room
// (SPUBLISH, or PUBLISH where the server has no sharded pub/sub; where the
// server refuses both, as an ACL without pub/sub does, nobody is told and
// the waiter finds its grant at its next call); it returns the token, or
// nothing and the error of nextToken. standInLine puts value in line with
// ticket (0: a new ticket after the last one, never below the clock), or
// keeps the place it has, and sets its lapse to now + claim; the queue keys
// are kept at least that long, so that a line whose waiters all died
// disappears. It returns the value's rank and ticket.
var protocolLua = `
local announcing = false
local function publish(ch, msg)
  local r = redis.pcall('SPUBLISH', ch, msg)
  if type(r) == 'table' and r.err then
    redis.pcall('PUBLISH', ch, msg)
  end
end
local function announce(token, v)
  if announcing then
    publish(KEYS[1] .. ':leader', string.format('%.0f', token) .. '\n' .. v)
  end
end
local function fence()
  local raw = redis.pcall('GET', KEYS[2])
  if type(raw) == 'table' then
    return nil, raw
  end
  if not raw then
    return 0
  end
  if not string.match(raw, '^%d+$') then
    return nil, redis.error_reply('ERR distlock: fencing key ' .. KEYS[2] .. ' does not hold an integer')
  end
  return raw + 0
end
local function clock()
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end
local function nextToken(last, now)
  local token = now
  if token <= last then
    token = last + 1
  end
  if token > 9007199254740991 then
    return nil, redis.error_reply('ERR distlock: fencing key ' .. KEYS[2] .. ' is exhausted: the next token would pass 2^53-1')
  end
  return token
end
local function foreign()
  return redis.error_reply('ERR distlock: queue keys ' .. KEYS[3] .. ' and ' .. KEYS[4] .. ' hold something else')
end
local function leave(value)
  local r = redis.pcall('ZSCORE', KEYS[3], value)
  if type(r) == 'table' and r.err then
    return foreign()
  end
  if r then
    redis.call('ZREM', KEYS[3], value)
    redis.pcall('HDEL', KEYS[4], value)
  end
end
local function first(now)
  while true do
    local r = redis.pcall('ZRANGE', KEYS[3], 0, 0)
    if r.err then
      return nil, nil, nil, nil, foreign()
    end
    local v = r[1]
    if not v then
      return nil, nil, nil, now
    end
    local raw = redis.pcall('HGET', KEYS[4], v)
    if type(raw) == 'table' and raw.err then
      return nil, nil, nil, nil, foreign()
    end
    now = now or clock()
    if raw then
      local lapse, claim, room = string.match(raw, '^(%d+) (%d+) (.+)$')
      local m = 'x'
      if room and string.byte(room, 2) == 32 then
        -- "r <room>" or "w <room>": a room has no space.
        m, room = string.sub(room, 1, 1), string.sub(room, 3)
      end
      if lapse and lapse + 0 > math.floor(now / 1000) then
        return v, claim, room, now, nil, m
      end
    end
    redis.call('ZREM', KEYS[3], v)
    redis.call('HDEL', KEYS[4], v)
  end
end
local function passTo(last, now, v, claim, room)
  local token, terr = nextToken(last, now)
  if terr then
    return nil, terr
  end
  hold(v, claim, now, token)
  local text = string.format('%.0f', token)
  redis.call('SET', KEYS[2], text, 'PX', ` + retentionMs + `)
  redis.call('ZREM', KEYS[3], v)
  redis.call('HDEL', KEYS[4], v)
  publish(KEYS[5] .. ':' .. room, text .. '\n' .. v)
  announce(token, v)
  return token
end
`

// grantLua defines, after protocolLua, the two helpers that only an
// acquire calls, grant and standInLine (see protocolLua's comment), apart
// so that a release does not make their closures.
var grantLua = `
local function grant(last, now, value, ttl)
  local token, terr = nextToken(last, now)
  if terr then
    return terr
  end
  hold(value, ttl, now, token)
  redis.call('SET', KEYS[2], token, 'PX', ` + retentionMs + `)
  announce(token, value)
  return token
end
local function standInLine(now, value, claim, room, ticket)
  local have = redis.pcall('ZSCORE', KEYS[3], value)
  local entry = redis.pcall('HEXISTS', KEYS[4], value)
  if type(have) == 'table' and have.err or type(entry) == 'table' then
    return nil, nil, foreign()
  end
  if have then
    ticket = have + 0
  else
    if ticket == 0 then
      ticket = now
      local tail = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
      local score = tail[2] and tail[2] + 0
      if score and score >= ticket then
        ticket = score + 1
      end
    end
    redis.call('ZADD', KEYS[3], ticket, value)
  end
  local keep = claim + 0
  redis.call('HSET', KEYS[4], value, string.format('%.0f', math.floor(now / 1000) + keep) .. ' ' .. claim .. ' ' .. room)
  for _, k in ipairs({KEYS[3], KEYS[4]}) do
    if redis.call('PTTL', k) < keep then
      redis.call('PEXPIRE', k, claim)
    end
  end
  return redis.call('ZRANK', KEYS[3], value), ticket
end
`

// retentionMs is FenceRetention in ms, as the scripts write it: a Lua
// string literal, since Redis turns a number passed to redis.call into a
// string with snprintf on every call (about 2,500 instructions).
var retentionMs = "'" + strconv.FormatInt(FenceRetention.Milliseconds(), 10) + "'"

// renewStringLua and renewHashLua extend value's (ARGV[1]) hold of a
// lock to ARGV[2] ms, in one of its two formats each: renewStringLua a
// lock's string that holds value (it declares cur, what GET found);
// renewHashLua value's field of a read-write lock's hash, "<end ms>
// <token>", if its lease has not ended, in either mode (so that a renewal
// in flight across a Downgrade is not refused), and refuses a hash in
// which value holds nothing with {0, writer or false}. Both return 1 when
// they extended the hold, and fall through when KEYS[1] is not of their
// format (a read of the wrong type costs an error reply, some 11,000
// instructions, so each face's renewal tries its own format first).
var (
	renewStringLua = `
local cur = redis.pcall('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
`
	renewHashLua = `
local h = redis.pcall('HMGET', KEYS[1], '~w', ARGV[1])
if not h.err then
  if not h[2] then
    return {0, h[1] or false}
  end
  local e, tok = string.match(h[2], '^(%d+) (%d+)$')
  local t = redis.call('TIME')
  local ms, us, ttl = t[1] * 1000, t[2] / 1000, ARGV[2] + 0
  if not e or e + 0 <= ms + math.floor(us) then
    return {0, h[1] or false}
  end
  redis.call('HSET', KEYS[1], ARGV[1], ms + math.ceil(us) + ttl .. ' ' .. tok)
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
`
)

// renewScript extends the caller's hold of a lock or an election if it
// still holds it, and never re-creates it: the string holding the value,
// or, for a hold that a read-write lock's grant made (the value holds the
// lock of its name through another face), its field of the hash.
//
// KEYS[1] lease key. ARGV[1] the acquisition's value, ARGV[2] TTL in ms.
// Reply: 1 when extended; {0, holder value or false} when refused (for a
// hash, the writer's value).
//
// Cost per call (as for acquireScript): 28k, 2.0 µs.
var renewScript = newScript(renewStringLua + `
if type(cur) ~= 'table' then
  return {0, cur}
end
` + renewHashLua + `
return {0, false}
`)

// rwRenewScript is renewScript for a read-write lock, in whichever mode:
// the hash first, then a string that holds the value (a hold passed by a
// release of the version before one lock per name, which read a
// read-write lock's entry as a lock's). KEYS, ARGV and reply are
// renewScript's.
var rwRenewScript = newScript(renewHashLua + renewStringLua + `
if type(cur) ~= 'string' then
  cur = false
end
return {0, cur}
`)

// NewValue returns a fresh lease value for one acquisition by owner:
// "owner#id", where id is formatted as a UUID. The owner part lets an
// operator see who holds a key; the id makes the value unique, so two
// acquisitions by the same owner never renew or release each other's lease.
//
// The id is a random prefix drawn once per process followed by a counter, so
// it costs no system call and cannot repeat within a process, and two
// processes share a prefix with a chance of about one in 2^64.
func NewValue(owner string) string {
	var id [16]byte
	copy(id[:8], idPrefix[:])
	binary.BigEndian.PutUint64(id[8:], idCounter.Add(1))
	id[6] = id[6]&0x0f | 0x40 // version 4
	id[8] = id[8]&0x3f | 0x80 // RFC 4122 variant

	var text [36]byte
	hex.Encode(text[0:8], id[0:4])
	text[8] = '-'
	hex.Encode(text[9:13], id[4:6])
	text[13] = '-'
	hex.Encode(text[14:18], id[6:8])
	text[18] = '-'
	hex.Encode(text[19:23], id[8:10])
	text[23] = '-'
	hex.Encode(text[24:36], id[10:16])

	var b strings.Builder
	b.Grow(len(owner) + 1 + len(text))
	b.WriteString(owner)
	b.WriteByte('#')
	b.Write(text[:])
	return b.String()
}

// The parts of NewValue's ids.
var (
	idPrefix  = randomBytes()
	idCounter atomic.Uint64
)

func randomBytes() (b [8]byte) {
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported systems
	return b
}

// Owner returns the owner part of a value written by [NewValue]. For a value
// that distlock did not write it returns the whole value.
func Owner(value string) string {
	i := strings.LastIndexByte(value, '#')
	if i < 0 {
		return value
	}
	if id := value[i+1:]; len(id) != 36 || uuid.Validate(id) != nil {
		return value
	}
	return value[:i]
}

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
	// caller, on the channel [Keys.WakeChannel](Room). It must not be empty.
	Room string
	// Ticket is the ticket of an earlier place to keep, or 0 for a new place
	// at the end of the line.
	Ticket int64
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
	case p.Ticket < 0:
		return Grant{}, fmt.Errorf("%w: ticket %d is negative", ErrBadPlace, p.Ticket)
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
	s := acquireScript
	if k.Permits > 0 {
		s = semAcquireScript
	} else if k.Mode != 0 {
		s = rwAcquireScript
	}
	// Each argument costs Redis about 1,600 instructions, so the defaults
	// at the end are left out (and the value is in its void key).
	args := []string{ms(ttl)}
	if kind := k.kindArg(); kind != "" || p != nil {
		args = append(args, kind)
	}
	if p != nil {
		args = append(args, ms(p.Claim), p.Room)
		if p.Ticket != 0 {
			args = append(args, strconv.FormatInt(p.Ticket, 10))
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

// all returns the keys of the acquire and release scripts, in their order,
// with value's void key last.
func (k Keys) all(value string) []string {
	return []string{k.Lease, k.Fence, k.Queue, k.Waiters, k.Wake, k.Void(value)}
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
	s := renewScript
	if k.Permits > 0 {
		s = semRenewScript
	} else if k.Mode != 0 {
		s = rwRenewScript
	}
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
	return c.release(ctx, k, []string{k.Lease, k.Fence, k.Queue, k.Waiters, k.Wake}, value, "", c.run)
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
	s, kind := releaseScript, k.kindArg()
	if k.Permits > 0 {
		s = semReleaseScript
	} else if k.Mode != 0 {
		s, kind = rwReleaseScript, "" // releases in either mode
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
func scriptReply(res Reply) (n int64, arr []Reply, err error) {
	if n, err := res.AsInt64(); err == nil {
		return n, nil, nil
	}
	arr, err = res.ToArray()
	if err != nil {
		return 0, nil, err
	}
	if len(arr) == 0 {
		return 0, nil, fmt.Errorf("%w: an empty array", ErrProtocol)
	}
	return 0, arr, nil
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
	for i := 1; i < len(arr); i += 3 {
		var p Pass
		var err1, err2, err3 error
		p.Token, err1 = arr[i].AsInt64()
		p.Value, err2 = arr[i+1].ToString()
		p.Room, err3 = arr[i+2].ToString()
		if err := errors.Join(err1, err2, err3); err != nil {
			return Release{}, fmt.Errorf("%w to release: %w", ErrProtocol, err)
		}
		if i == 1 {
			r.Passed = p
		} else {
			r.More = append(r.More, p)
		}
	}
	return r, nil
}

// ms formats d in whole milliseconds, the unit of Redis's PX and PEXPIRE.
func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// readScript reads who holds a lease now, for [Client.Read]. KEYS[1] the
// lease, KEYS[2] the fencing key, KEYS[3] a semaphore's limit record.
// Reply: {type, fence, limit, value, ttl ms, value, ttl ms, ...}, with the
// holders in the order their leases end; fence and limit are "" when
// missing or not integers.
var readScript = newScript(`
local t = redis.call('TYPE', KEYS[1]).ok
local function int(k)
  local v = redis.pcall('GET', k)
  if type(v) == 'string' and string.match(v, '^%d+$') then
    return v
  end
  return ''
end
local out = {t, int(KEYS[2]), int(KEYS[3])}
if t == 'string' then
  table.insert(out, redis.call('GET', KEYS[1]))
  table.insert(out, redis.call('PTTL', KEYS[1]))
elseif t == 'zset' then
  local tm = redis.call('TIME')
  local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
  local r = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
  for i = 1, #r, 2 do
    table.insert(out, r[i])
    table.insert(out, tonumber(r[i + 1]) - now)
  end
end
return out
`)

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
	for i := 3; i < len(arr); i += 2 {
		v, err1 := arr[i].ToString()
		ttl, err2 := arr[i+1].AsInt64()
		if err := errors.Join(err1, err2); err != nil {
			return Snapshot{}, fmt.Errorf("%w to read: %w", ErrProtocol, err)
		}
		s.Holders = append(s.Holders, Holding{Value: v, TTL: time.Duration(ttl) * time.Millisecond})
	}
	return s, nil
}
