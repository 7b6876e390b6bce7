package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Read-write locks.
//
// A read-write lock ([Keys.RW]) keeps its holders in a hash at the lease
// key: a field per holder, from its value to "<end> <token>", the server
// time (ms) at which its lease ends and its grant's token, the field "~w"
// naming the writer while one holds, and the
// field "~" holding "rw", the mark of the kind (a hash without it is not
// distlock's). The hash is kept at least as long as its longest lease, and
// as long as anyone stands in line, so that a lock or semaphore of the same
// name always finds it and refuses it. The line, the rooms, the fencing key
// and the void markers are a lock's; a waiter's entry in the waiters hash
// says its mode: "<lapse> <claim> <r|w> <room>".
//
// The rules, in every script that grants:
//
//   - holders whose lease has ended are dropped first (by the full path;
//     the lean paths never need to know), so a dead reader or writer stops
//     counting when its own lease ends;
//   - the head of the line is served first: a reader is granted while no
//     writer holds, and the run of readers behind it with it; a writer
//     when nobody holds; the first waiter that cannot be granted stops the
//     run (arrival order: nobody gets ahead of an earlier waiter);
//   - a caller is granted only when nobody is ahead of it and its mode
//     allows (a reader: no writer holds; a writer: nobody holds); a caller
//     that does not stand in line (TryRLock, TryLock) is refused while
//     anyone waits;
//   - every grant, to a caller or passed to a waiter, has a new token from
//     the fencing key (nextToken), so a writer's token is above that of
//     every reader granted before it. A holder that asks again (a claim,
//     a lost reply) keeps its token, as a lock's holder does.
//
// Release and Cancel drop the caller's hold (any mode) and, when someone
// stands in line, serve the head of the line as above: a writer's release
// grants the whole run of readers at the head, the last reader's release
// the writer first in line. Downgrade turns the writer's hold into a
// reader's in one script and serves the head of the line the same way.
// Renew extends the caller's hold in whatever mode it is (so a renewal in
// flight across a Downgrade is not refused), and never re-creates one.

// Mode is how a read-write lock's call holds it: [Read] shares it with
// other readers, [Write] excludes everyone. The zero Mode is no read-write
// lock.
type Mode byte

const (
	// Read holds a read-write lock shared with other readers.
	Read Mode = 'r'
	// Write holds a read-write lock alone.
	Write Mode = 'w'
)

// String returns "read", "write", or "" for the zero Mode.
func (m Mode) String() string {
	switch m {
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return ""
}

// RW returns k for a read-write lock whose acquire calls ask for mode
// (Read or Write). Renew, Release and Cancel do not depend on the mode:
// they act on the caller's hold, whichever it is.
func (k Keys) RW(mode Mode) Keys {
	k.Mode = mode
	return k
}

// ErrBadMode is returned for [Keys] whose Mode is neither 0, [Read] nor
// [Write], or that mix a read-write lock with a semaphore or an election.
var ErrBadMode = errors.New("lease: invalid read-write mode")

func (k Keys) checkMode() error {
	switch {
	case k.Mode == 0:
		return nil
	case k.Mode != Read && k.Mode != Write:
		return fmt.Errorf("%w: %q", ErrBadMode, k.Mode)
	case k.Permits != 0 || k.Announce:
		return fmt.Errorf("%w: a read-write lock is neither a semaphore nor an election", ErrBadMode)
	}
	return nil
}

// leaseKindLua is a Lua expression for what KEYS[1] holds, for the error
// replies of the lock's and the semaphore's scripts: its Redis type, or
// "rwmutex" for a read-write lock's hash (see kindError). It runs only on
// their error paths.
var leaseKindLua = `(function()
  local t = redis.call('TYPE', KEYS[1]).ok
  if t == 'hash' and redis.call('HGET', KEYS[1], '~') == 'rw' then
    return 'rwmutex'
  end
  return t
end)()`

// rwLua defines the read-write lock's helpers, before protocolLua, whose
// helpers it serves and uses:
//
// hold(v, ms, now), which protocolLua's grant and passTo call before they
// know the token they return, notes that v is to hold the lock for ms from
// now (µs); commit(token), called with what they returned, writes it, in
// holdMode (set before each grant): v's field, "~w" for a writer, and the
// mark, and keeps the hash at least ms. It returns token. notRW returns the
// error reply for a lease key of another kind.
var rwLua = `
local holdMode, held = 'r', nil
local function hold(v, ms, now)
  held = {v, ms, math.ceil(now / 1000) + ms}
end
local function commit(token)
  if type(token) ~= 'number' then
    return token
  end
  local v, ms = held[1], held[2]
  -- An end in ms has 13 digits, which Lua writes exactly (%.14g); a token
  -- has 16.
  local f = held[3] .. ' ' .. string.format('%.0f', token)
  if holdMode == 'w' then
    redis.call('HSET', KEYS[1], v, f, '~w', v, '~', 'rw')
  else
    redis.call('HSET', KEYS[1], v, f, '~', 'rw')
  end
  if redis.call('PTTL', KEYS[1]) < ms + 0 then
    redis.call('PEXPIRE', KEYS[1], ms)
  end
  return token
end
local function notRW()
  return redis.error_reply('ERR distlock: ' .. KEYS[1] .. ' holds a ' .. ` + leaseKindLua + ` .. ', not a rwmutex; is the name used by another kind?')
end
`

// rwLineLua defines, after protocolLua, the helpers of the read-write
// lock's full paths:
//
// scan(now, value) reads the holders, drops those whose lease has ended,
// and returns the state: writer (its value, while its lease lasts),
// readers (how many others hold), mine (value's token, when it holds in
// either mode), and soonest and soonestV, the end (ms) and value of the
// lease that ends first; or the error reply for a key of another kind.
//
// rwFirst is protocolLua's first for entries that carry a mode: it also
// returns the mode, and the error reply for an entry of another kind's
// line.
//
// promote serves the head of the line (see the comment at the top of
// rw.go), after the token last, up to stop (a value: the caller's place)
// or the first waiter it cannot grant; it appends a {token, value, room}
// triple per pass to out (if given) and returns the last token and the
// value it stopped at (nil: the line is empty).
//
// serve is promote for a release or a downgrade: it reads the fencing key
// and the holders first, and stops quietly at a key of the wrong type or
// content (the caller's own release or downgrade stands). It returns out.
//
// mark keeps the hash (with its mark) at least ms, for a line that waits.
//
// waiting builds the reply of a caller that is not granted, as
// acquireScript's: the holder whose lease ends first, and how long it has.
var rwLineLua = `
local function scan(now, value)
  local all = redis.pcall('HGETALL', KEYS[1])
  if all.err then
    return nil, notRW()
  end
  local ms = math.floor(now / 1000)
  local st = {readers = 0}
  local ends, tokens = {}, {}
  local marked = false
  for i = 1, #all, 2 do
    local f, x = all[i], all[i + 1]
    local e, tok = string.match(x, '^(%d+) (%d+)$')
    if f == '~' then
      marked = x == 'rw'
    elseif f == '~w' then
      st.writer = x
    elseif e then
      ends[f], tokens[f] = e + 0, tok + 0
    else
      marked = false
      break
    end
  end
  if #all > 0 and not marked then
    return nil, redis.error_reply('ERR distlock: ' .. KEYS[1] .. ' holds a hash, not a rwmutex; distlock did not write it')
  end
  if st.writer and not (ends[st.writer] and ends[st.writer] > ms) then
    redis.call('HDEL', KEYS[1], '~w')
    st.writer = nil
  end
  for f, e in pairs(ends) do
    if e <= ms then
      redis.call('HDEL', KEYS[1], f)
    else
      if f == value then
        st.mine = tokens[f]
      elseif f ~= st.writer then
        st.readers = st.readers + 1
      end
      if not st.soonest or e < st.soonest then
        st.soonest, st.soonestV = e, f
      end
    end
  end
  return st
end
local function rwFirst(now)
  while true do
    local r = redis.pcall('ZRANGE', KEYS[3], 0, 0)
    if r.err then
      return nil, nil, nil, nil, foreign()
    end
    local v = r[1]
    if not v then
      return nil
    end
    local raw = redis.pcall('HGET', KEYS[4], v)
    if type(raw) == 'table' and raw.err then
      return nil, nil, nil, nil, foreign()
    end
    if raw then
      local lapse, claim, m, room = string.match(raw, '^(%d+) (%d+) ([rw]) (.+)$')
      if not lapse then
        return nil, nil, nil, nil, redis.error_reply('ERR distlock: ' .. KEYS[1] .. ' holds a lock, not a rwmutex; its line ' .. KEYS[3] .. ' is of another kind')
      end
      if lapse + 0 > math.floor(now / 1000) then
        return v, claim, room, m
      end
    end
    redis.call('ZREM', KEYS[3], v)
    redis.call('HDEL', KEYS[4], v)
  end
end
local function promote(st, now, last, out, stop)
  while true do
    local v, claim, room, m, err = rwFirst(now)
    if err then
      return last, v, err
    end
    if not v or v == stop or st.writer or m == 'w' and st.readers > 0 then
      return last, v
    end
    holdMode = m
    local token, terr = passTo(last, now, v, claim, room)
    if terr then
      return last, v, terr
    end
    commit(token)
    if m == 'w' then
      st.writer = v
    else
      st.readers = st.readers + 1
    end
    local e = math.ceil(now / 1000) + claim
    if not st.soonest or e < st.soonest then
      st.soonest, st.soonestV = e, v
    end
    if out then
      table.insert(out, token)
      table.insert(out, v)
      table.insert(out, room)
    end
    last = token
  end
end
local function serve(now, out)
  local last, lerr = fence()
  if lerr then
    return out
  end
  local st, serr = scan(now, nil)
  if not serr then
    promote(st, now, last, out, nil)
  end
  return out
end
local function mark(ms)
  redis.call('HSET', KEYS[1], '~', 'rw')
  if redis.call('PTTL', KEYS[1]) < ms + 0 then
    redis.call('PEXPIRE', KEYS[1], ms)
  end
end
local function waiting(st, now, rank, ticket, last)
  if not st.soonestV then
    return {0, -2, '', rank, ticket, last}
  end
  return {0, st.soonest - math.floor(now / 1000), st.soonestV, rank, ticket, last}
end
`

// rwAcquireScript is acquireScript for a read-write lock (see
// [Keys.RW]). Its KEYS and ARGV are those of acquireScript, but for
// ARGV[2]: the mode, "r" or "w". Its reply has acquireScript's shape:
// a token alone when granted; when not, pttl and holder name the holder
// whose lease ends first.
//
// It starts with the common cases, in the calls of a lock's, without
// defining any helper: a free lock with nobody in line and a value not
// void (EXISTS, GET, TIME, HSET, PEXPIRE, SET); and, for a reader, a lock
// that only readers hold with nobody in line (EXISTS, HMGET, GET, TIME,
// HSET, PTTL, SET). Anything else goes to the full path, which decides as
// if they had not run.
//
// Cost per call (COSTS.md, scripts/script-cost; the "rwmutex" rows): the
// free lock 85k (a writer 87k), 6.0 µs in Redis; a reader among readers
// 99k; standing in line 198k. The full path reads every holder (HGETALL),
// so it grows with the number of readers; the common cases do not.
var rwAcquireScript = newScript(`
local value = string.sub(KEYS[6], #KEYS[1] + 7)
-- The common cases: nobody in line, a value not void, and a free lock or,
-- for a reader, one that readers hold (the mark, and no writer).
local n = redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[6])
local free = n == 0
if n == 1 and ARGV[2] == 'r' then
  -- (A value that holds already keeps its token: the full path.)
  local h = redis.pcall('HMGET', KEYS[1], '~', '~w', value)
  free = h[1] == 'rw' and not h[2] and not h[3]
end
if free then
` + leanTokenLua + `
  if token then
    -- hold and commit (below), from the clock in t.
    local e = t[1] * 1000 + math.ceil(t[2] / 1000) + ARGV[1] .. ' ' .. s
    if ARGV[2] == 'w' then
      redis.call('HSET', KEYS[1], value, e, '~w', value, '~', 'rw')
      redis.call('PEXPIRE', KEYS[1], ARGV[1])
    else
      redis.call('HSET', KEYS[1], value, e, '~', 'rw')
      if n == 0 or redis.call('PTTL', KEYS[1]) < ARGV[1] + 0 then
        redis.call('PEXPIRE', KEYS[1], ARGV[1])
      end
    end
    redis.call('SET', KEYS[2], s, 'PX', ` + retentionMs + `)
    return token
  end
end
` + rwLua + protocolLua + rwLineLua + `
-- The full path.
local mode = ARGV[2]
local last, err = fence()
if err then
  return err
end
local now = clock()
local st
st, err = scan(now, value)
if err then
  return err
end
if redis.call('EXISTS', KEYS[6]) == 1 then
  err = leave(value)
  if err then
    return err
  end
  return waiting(st, now, -1, 0, last)
end
if st.mine then
  -- The value holds already (a grant passed to it, a lost reply): the
  -- full TTL, in the mode it holds, with its token.
  err = leave(value)
  if err then
    return err
  end
  if st.writer == value then
    holdMode = 'w'
  end
  hold(value, ARGV[1], now)
  return commit(st.mine)
end
local v
last, v, err = promote(st, now, last, nil, value)
if err then
  return err
end
if (not v or v == value) and not st.writer and (mode == 'r' or st.readers == 0) then
  if v then
    leave(value)
  end
  holdMode = mode
  return commit(grant(last, now, value, ARGV[1]))
end
if not ARGV[3] then
  return waiting(st, now, -1, 0, last)
end
local rank, ticket, serr = standInLine(now, value, ARGV[3], mode .. ' ' .. ARGV[4], tonumber(ARGV[5] or '0'))
if serr then
  return serr
end
mark(ARGV[3])
return waiting(st, now, rank, ticket, last)
`)

// rwReleaseScript is releaseScript for a read-write lock: it drops the
// caller's hold, in either mode, and serves the head of the line. KEYS are
// releaseScript's; ARGV[1] the value, ARGV[2] unused, ARGV[3] the void
// key's TTL (Cancel only).
//
// Reply: deleted alone (1 when the caller held the lock and its lease had
// not ended) when nobody stands in line, or {deleted, token, value, room,
// ...} with a triple per waiter granted.
//
// It starts with the common case, nobody in line: HMGET, TIME, DEL (a
// writer, or the last reader) or HLEN and HDEL (a reader among others),
// EXISTS, and the void marker for Cancel, without defining any helper.
var rwReleaseScript = newScript(`
-- The common case: nobody in line.
local value = ARGV[1]
local h = redis.pcall('HMGET', KEYS[1], '~w', value)
local deleted = 0
if not h.err and h[2] then
  local t = redis.call('TIME')
  if string.match(h[2], '^%d+') + 0 > t[1] * 1000 + math.floor(t[2] / 1000) then
    deleted = 1
  end
  -- A writer holds alone; a reader whose field and the mark are all is
  -- the last.
  if h[1] == value or redis.call('HLEN', KEYS[1]) == 2 then
    redis.call('DEL', KEYS[1])
  else
    redis.call('HDEL', KEYS[1], value)
  end
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  if KEYS[6] then
    redis.call('SET', KEYS[6], '1', 'PX', ARGV[3])
  end
  return deleted
end
` + rwLua + protocolLua + rwLineLua + `
-- The full path: serve the line.
local err
if KEYS[6] then
  err = leave(value)
  redis.call('SET', KEYS[6], '1', 'PX', ARGV[3])
end
local out = {deleted}
if h.err or err then
  return out
end
return serve(clock(), out)
`)

// rwRenewScript extends the caller's hold of a read-write lock, in
// whichever mode, to ARGV[2] ms if its lease has not ended. KEYS[1] the
// lease; ARGV[1] the value. Reply: 1 when extended, {0, writer or false}
// when refused.
var rwRenewScript = newScript(`
local h = redis.pcall('HMGET', KEYS[1], '~w', ARGV[1])
if h.err or not h[2] then
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
`)

// rwDowngradeScript turns the writer's hold into a reader's, with a lease
// of ARGV[2] ms from now, and serves the head of the line: the run of
// readers there is granted at once. KEYS are releaseScript's (without the
// void key); ARGV[1] the value.
//
// Reply: 0 when the value does not hold the lock (its lease ended, or it
// never did); 1 when it now holds it as a reader (also when it did
// already: an earlier Downgrade whose reply was lost) and nobody waits;
// or {1, token, value, room, ...} with a triple per reader granted.
var rwDowngradeScript = newScript(`
local value = ARGV[1]
local h = redis.pcall('HMGET', KEYS[1], '~w', value)
if h.err or not h[2] then
  return 0
end
local e, tok = string.match(h[2], '^(%d+) (%d+)$')
local t = redis.call('TIME')
if not e or e + 0 <= t[1] * 1000 + math.floor(t[2] / 1000) then
  return 0
end
if h[1] ~= value then
  return 1
end
local ttl = ARGV[2] + 0
redis.call('HDEL', KEYS[1], '~w')
redis.call('HSET', KEYS[1], value, t[1] * 1000 + math.ceil(t[2] / 1000) + ttl .. ' ' .. tok)
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  return 1
end
` + rwLua + protocolLua + rwLineLua + `
local out = {1}
return serve(t[1] * 1000000 + t[2], out)
`)

// Downgrade turns value's write hold of k's read-write lock into a read
// hold with the given TTL, counted from when Redis runs the script, and in
// the same step grants the run of readers at the head of the line (each
// told in its room, as a release's passes are). It reports whether value
// now holds the lock as a reader: false when it did not hold it (its lease
// ended, or another holds it); true also when it was a reader already, so
// that a Downgrade whose reply was lost can be sent again. The readers
// granted are in the Release's Passed and More (its Deleted is unused).
//
// A TTL under a millisecond is refused with ErrBadTTL, keys that are not a
// read-write lock's with ErrBadMode, before anything is sent.
func (c *Client) Downgrade(ctx context.Context, k Keys, value string, ttl time.Duration) (bool, Release, error) {
	if ttl < time.Millisecond {
		return false, Release{}, ErrBadTTL
	}
	if k.Mode == 0 {
		return false, Release{}, fmt.Errorf("%w: %s is not a read-write lock", ErrBadMode, k.Lease)
	}
	if err := k.check(); err != nil {
		return false, Release{}, err
	}
	res := c.run(ctx, rwDowngradeScript, []string{k.Lease, k.Fence, k.Queue, k.Waiters, k.Wake}, []string{value, ms(ttl)})
	n, arr, err := scriptReply(res)
	switch {
	case err != nil:
		return false, Release{}, err
	case arr == nil:
		return n == 1, Release{}, nil
	}
	r, err := parseRelease(arr)
	if err != nil {
		return false, Release{}, err
	}
	ok := r.Deleted
	r.Deleted = false
	return ok, r, nil
}
