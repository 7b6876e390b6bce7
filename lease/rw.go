package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Read-write locks, and the lock of a name in all its faces.
//
// A read-write lock ([Keys.RW]) keeps its holders in a hash at the lease
// key: a field per holder, from its value to "<end> <token>", the server
// time (ms) at which its lease ends and its grant's token, the field "~w"
// naming the writer while one holds, and the field "~" holding "rw", the
// mark of the kind (a hash without it is not distlock's). The hash is kept
// at least as long as its longest lease, and as long as anyone stands in
// line behind its holders, so that a semaphore of the same name always
// finds it and refuses it. A lock or an election of the same name is the
// same lock: its exclusive hold is the string it has always written, which
// the read-write lock's scripts read as a writer's hold, and its scripts
// read the hash. The line, the rooms, the fencing key and the void markers
// are one; a waiter's entry in the waiters hash says its mode: "<lapse>
// <claim> <r|w> <room>" for a read-write lock's, "<lapse> <claim> <room>"
// (exclusive) for a lock's or an election's.
//
// The rules, in every script that grants, whatever the caller's face:
//
//   - holders whose lease has ended are dropped first (by the full path;
//     the lean paths never need to know), so a dead reader or writer stops
//     counting when its own lease ends;
//   - the head of the line is served first: a reader is granted while
//     nobody holds alone, and the run of readers behind it with it; an
//     exclusive waiter (a writer, a lock's) when nobody holds; the first
//     waiter that cannot be granted stops the run (arrival order: nobody
//     gets ahead of an earlier waiter);
//   - a caller is granted only when nobody is ahead of it and its mode
//     allows (a reader: nobody holds alone; an exclusive hold: nobody
//     holds); a caller that does not stand in line (TryRLock, TryLock) is
//     refused while anyone waits;
//   - every grant, to a caller or passed to a waiter, has a new token from
//     the fencing key (nextToken), so an exclusive holder's token is above
//     that of every reader granted before it. A holder that asks again (a
//     claim, a lost reply) keeps its token, as a lock's holder does.
//
// Release and Cancel drop the caller's hold (any mode, either format) and,
// when someone stands in line, serve the head of the line as above: an
// exclusive hold's release grants the whole run of readers at the head,
// the last reader's release the exclusive waiter first in line. Downgrade
// turns the writer's hold into a reader's in one script and serves the
// head of the line the same way. Renew extends the caller's hold in
// whatever mode and format it is (so a renewal in flight across a
// Downgrade is not refused), and never re-creates one.

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
// replies of the semaphore's scripts: its Redis type, or "rwmutex" for a
// read-write lock's hash (see kindError). It runs only on their error
// paths.
var leaseKindLua = `(function()
  local t = redis.call('TYPE', KEYS[1]).ok
  if t == 'hash' and redis.call('HGET', KEYS[1], '~') == 'rw' then
    return 'rwmutex'
  end
  return t
end)()`

// lineLua defines, after protocolLua, the helpers of the full paths of a
// lock's scripts, which every face takes (a Mutex's, an Election's, an
// RWMutex's), so that they are one lock with one line. They read the
// clock only when they need it (a hash's leases, a grant, a place in
// line) and keep what they read in st.now (µs), since TIME costs more than
// most calls.
//
// scan reads who holds the lock, in either format (mode says which to try
// first: a lock's string, "x", or a read-write lock's hash; a failed read
// costs an error reply), drops the holders of the hash whose lease has
// ended, and returns the state: writer (the value that holds it alone:
// the string's, or the hash's "~w" while its lease lasts), str (the lease
// is a string), readers (how many others share it), mine and mineMode
// (value's token and how it holds: "x" a string, "w" or "r" the hash; a
// string's token is last, the fencing key's, since every grant sets it,
// and 0 when that key is lost), soonest and soonestV, the end (ms) and
// value of the hash's lease that ends first, and now; or the error reply
// for a lease key of another kind (a semaphore's sorted set, a key
// distlock did not write).
//
// promote serves the head of the line (see the comment at the top of
// rw.go), after the token last, up to stop (a value: the caller's place)
// or the first waiter it cannot grant: each waiter in its entry's mode
// (first), so a lock's waiter in a string; it appends a {token, value,
// room} triple per pass to out (if given) and returns the last token and
// the value it stopped at (nil: the line is empty, or someone holds alone).
// It sets st.passed when it granted an exclusive hold. An election's
// scripts announce exclusive grants only: a reader is no leader.
var lineLua = `
local function scan(now, value, last)
  local st = {readers = 0, now = now}
  local all
  if mode ~= 'x' then
    all = redis.pcall('HGETALL', KEYS[1])
  end
  if not all or all.err then
    local cur = redis.pcall('GET', KEYS[1])
    if type(cur) == 'string' then
      st.writer, st.str = cur, true
      if cur == value then
        st.mine, st.mineMode = last, 'x'
      end
      return st
    elseif not cur then
      return st
    end
    all = redis.pcall('HGETALL', KEYS[1])
    if all.err then
      local t = redis.call('TYPE', KEYS[1]).ok
      return nil, redis.error_reply('ERR distlock: ' .. KEYS[1] .. ' holds a ' .. t .. ', not a ' .. want .. '; is the name used by another kind?')
    end
  end
  if #all == 0 then
    return st
  end
  now = now or clock()
  st.now = now
  local ms = math.floor(now / 1000)
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
  if not marked then
    return nil, redis.error_reply('ERR distlock: ' .. KEYS[1] .. ' holds a hash, not a ' .. want .. '; distlock did not write it')
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
        st.mine, st.mineMode = tokens[f], st.writer == f and 'w' or 'r'
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
local function promote(st, last, out, stop)
  while not st.writer do
    local v, claim, room, now, err, m = first(st.now)
    st.now = now or st.now
    if err then
      return last, v, err
    end
    if not v or v == stop or m ~= 'r' and st.readers > 0 then
      return last, v
    end
    holdMode = m
    local loud = announcing
    announcing = loud and m ~= 'r'
    local token, terr = passTo(last, now, v, claim, room)
    announcing = loud
    if terr then
      return last, v, terr
    end
    if m == 'r' then
      st.readers = st.readers + 1
    else
      st.writer, st.str, st.passed = v, m == 'x', true
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
  return last
end
`

// serveLua defines serve, after lineLua, for the full paths of a release
// and a downgrade: promote, after reading the fencing key and the holders
// (unless gone says the caller's release left the lease key deleted); it
// stops quietly at a key of the wrong type or content (the caller's own
// release or downgrade stands), and returns the state after the passes
// and the token of the last grant before them.
var serveLua = `
local function serve(out, gone)
  local last, lerr = fence()
  if lerr then
    return nil
  end
  local st, serr = {readers = 0}, nil
  if not gone then
    st, serr = scan(nil, nil, last)
  end
  if serr then
    return nil
  end
  promote(st, last, out, nil)
  return st, last
end
`

// lockAcquireLua is the full path of the acquire script of every face of
// a lock (acquireScript, rwAcquireScript), after lockLua, protocolLua and
// lineLua, with the caller's value in value and its face in mode. The
// holders whose lease has ended are dropped first (scan). A voided value
// is refused and taken out of line. A value that holds already (a grant
// passed to it while it waited, a lost reply) is granted the full TTL in
// the way it holds, with its token (a new one if the fencing key was
// lost); nothing changes hands, so an election announces nothing. Else
// the head of the line is served up to the caller, and the caller is
// granted when nobody is left ahead of it and its mode allows (a reader:
// nobody holds alone; an exclusive hold: nobody holds). Otherwise it
// stands in line when asked: a Mutex's or an Election's entry is
// "<lapse> <claim> <room>", a read-write lock's "<lapse> <claim> <r|w>
// <room>" (an entry without a mode is an exclusive one, so that the
// entries of a lock written before read-write locks shared its line read
// as they did), and a hash behind which it waits keeps its mark as long as
// the place (so that a semaphore of the name refuses it). All checks come
// before the first write, so a key of the wrong kind fails the script
// without leaving anything behind. Its helper waiting builds the reply of
// a caller that is not granted, as acquireScript's: the string's holder
// and its PTTL, or the holder of the hash whose lease ends first, and how
// long it has. It reads the clock only to grant or to stand in line.
var lockAcquireLua = `
local function waiting(st, rank, ticket, last)
  if st.str then
    return {0, redis.call('PTTL', KEYS[1]), st.writer, rank, ticket, last}
  end
  if not st.soonestV then
    return {0, -2, '', rank, ticket, last}
  end
  return {0, st.soonest - math.floor(st.now / 1000), st.soonestV, rank, ticket, last}
end
local last, err = fence()
if err then
  return err
end
local st
st, err = scan(nil, value, last)
if err then
  return err
end
` + voidLua("waiting(st, -1, 0, last)") + `
if st.mine then
  err = leave(value)
  if err then
    return err
  end
  holdMode = st.mineMode
  if st.mine == 0 then
    return grant(last, st.now or clock(), value, ARGV[1])
  end
  hold(value, ARGV[1], st.now, st.mine)
  return st.mine
end
local v
last, v, err = promote(st, last, nil, value)
if err then
  return err
end
if (not v or v == value) and not st.writer and (mode == 'r' or st.readers == 0) then
  if v then
    leave(value)
  end
  holdMode = mode
  return grant(last, st.now or clock(), value, ARGV[1])
end
if not ARGV[3] then
  return waiting(st, -1, 0, last)
end
local now = st.now or clock()
local room = ARGV[4]
if mode ~= 'x' then
  room = mode .. ' ' .. room
end
local rank, ticket, serr = standInLine(now, value, ARGV[3], room, tonumber(ARGV[5] or '0'))
if serr then
  return serr
end
if not st.str then
  redis.call('HSET', KEYS[1], '~', 'rw')
  if redis.call('PTTL', KEYS[1]) < ARGV[3] + 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
end
st.now = now
return waiting(st, rank, ticket, last)
`

// lockReleaseLua is the full path of the release script of every face of
// a lock (releaseScript, rwReleaseScript), after lockLua, protocolLua and
// lineLua, with the caller's value in value, deleted set by the script's
// common case (1 when it deleted the caller's live hold) and gone when
// that left the lease key deleted. It drops the caller's hold if the
// common case did not find it in its format (the string, or its field of
// the hash, and "~w" if it names value, with the hash once only the mark
// is left; deleted is 1 if that hold's lease had not ended), takes a
// Cancel's value out of line and voids it (the marker after the delete: at
// maxmemory Redis refuses a script's first write unless it frees memory,
// and the delete must not depend on the marker), and serves the head of
// the line: a release of an exclusive hold grants the run of readers at
// the head, or the exclusive waiter first in line; the last reader's
// grants the exclusive waiter. A waiter that gives up also unblocks a line
// whose grant lapsed. An election's release that passes the lock to no
// exclusive holder announces that nobody leads.
var lockReleaseLua = `
if deleted == 0 then
  local cur = redis.pcall('GET', KEYS[1])
  if cur == value then
    redis.call('DEL', KEYS[1])
    deleted, gone = 1, true
  elseif type(cur) == 'table' then
    local h = redis.pcall('HMGET', KEYS[1], '~w', value)
    if not h.err and h[2] then
      if h[1] == value then
        redis.call('HDEL', KEYS[1], '~w')
      end
      redis.call('HDEL', KEYS[1], value)
      if redis.call('HLEN', KEYS[1]) == 1 then
        redis.call('DEL', KEYS[1])
      end
      local e = string.match(h[2], '^(%d+)')
      if e and e + 0 > math.floor(clock() / 1000) then
        deleted = 1
      end
    end
  end
end
` + cancelLua + `
local st, last = serve(out, gone)
if st and announcing and deleted == 1 and not st.passed then
  announce(last, '')
end
return out
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
// HSET, PTTL, SET; a Mutex's string fails the HMGET and goes on). Anything
// else goes to the full path that every face of the lock shares
// (lockAcquireLua), which decides as if they had not run.
//
// Cost per call (COSTS.md, scripts/script-cost; the "rwmutex" rows): the
// free lock 87k (a writer 89k); a reader among readers 104k; standing in
// line 212k. The full path reads every holder (HGETALL),
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
    -- hold (lockLua), from the clock in t.
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
` + lockLua + protocolLua + grantLua + lineLua + `
-- The full path, as every face of the lock takes it.
mode, want = ARGV[2], 'rwmutex'
` + lockAcquireLua)

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
// EXISTS, and the void marker for Cancel, without defining any helper. A
// lease that is a string (a Mutex's, or a hold passed by a release of an
// older version that read no modes) goes to the full path
// (lockReleaseLua), which drops a hold in either format.
var rwReleaseScript = newScript(`
-- The common case: nobody in line.
local value = ARGV[1]
local h = redis.pcall('HMGET', KEYS[1], '~w', value)
local deleted, gone = 0, false
if not h.err and h[2] then
  local t = redis.call('TIME')
  if string.match(h[2], '^%d+') + 0 > t[1] * 1000 + math.floor(t[2] / 1000) then
    deleted = 1
  end
  -- A writer holds alone; a reader whose field and the mark are all is
  -- the last.
  if h[1] == value or redis.call('HLEN', KEYS[1]) == 2 then
    redis.call('DEL', KEYS[1])
    gone = true
  else
    redis.call('HDEL', KEYS[1], value)
  end
end
if not h.err and redis.call('EXISTS', KEYS[3]) == 0 then
  if KEYS[6] then
    redis.call('SET', KEYS[6], '1', 'PX', ARGV[3])
  end
  return deleted
end
` + lockLua + protocolLua + lineLua + serveLua + `
-- The full path: drop a hold of the other format, serve the line (the
-- lease is a hash, if anything).
mode = 'r'
` + lockReleaseLua)

// rwDowngradeScript turns the writer's hold into a reader's, with a lease
// of ARGV[2] ms from now, and serves the head of the line: the run of
// readers there is granted at once. KEYS are releaseScript's (without the
// void key); ARGV[1] the value.
//
// A writer's hold is the hash's "~w" and its field. A string that holds
// the value is one too (a grant that a release of an older version, which
// read no modes, passed to a writer): its token is the fencing key's, which
// every grant sets, and it becomes the hash's field the same way.
//
// Reply: 0 when the value does not hold the lock (its lease ended, or it
// never did); 1 when it now holds it as a reader (also when it did
// already: an earlier Downgrade whose reply was lost) and nobody waits;
// or {1, token, value, room, ...} with a triple per reader granted.
var rwDowngradeScript = newScript(`
local value = ARGV[1]
local h = redis.pcall('HMGET', KEYS[1], '~w', value)
local t = redis.call('TIME')
local ms = t[1] * 1000 + math.floor(t[2] / 1000)
if h.err then
  local tok = redis.pcall('GET', KEYS[2])
  if redis.pcall('GET', KEYS[1]) ~= value or type(tok) ~= 'string' or not string.match(tok, '^%d+$') then
    return 0
  end
  redis.call('DEL', KEYS[1])
  h = {value, ms + 1 .. ' ' .. tok}
end
if not h[2] then
  return 0
end
local e, tok = string.match(h[2], '^(%d+) (%d+)$')
if not e or e + 0 <= ms then
  return 0
end
if h[1] ~= value then
  return 1
end
local ttl = ARGV[2] + 0
redis.call('HDEL', KEYS[1], '~w')
redis.call('HSET', KEYS[1], value, t[1] * 1000 + math.ceil(t[2] / 1000) + ttl .. ' ' .. tok, '~', 'rw')
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  return 1
end
` + lockLua + protocolLua + lineLua + serveLua + `
local out = {1}
mode = 'r'
serve(out)
return out
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
