package lease

import "strconv"

// The scripts of the lease protocol and their Lua helpers, each helper
// before the scripts that use it (doc.go describes the protocol; COSTS.md
// what each path costs).
//
// Every piece of Lua below (a value or function whose name ends in "Lua")
// opens with its contract, "--[[ name: needs a b; defines x y ]]": the
// locals of its includer that it reads or sets, and the locals it declares
// at its top level, which stay in scope after it. The Go comment says what
// they mean. TestLuaPiecesStateTheirContracts checks each contract against
// the piece's text, and TestScriptsUseNoUndeclaredName each script as sent;
// a comment costs Redis nothing per call (a script is compiled once).

// The scripts share one key layout, so that the helpers below can name the
// keys by position: KEYS[1] lease, KEYS[2] fencing key, KEYS[3] queue,
// KEYS[4] waiters, and for the scripts that take one KEYS[5], the value's
// void key (see [Keys.Void]). The protocol they implement is described in
// doc.go. A room's wake channel is KEYS[1] .. ':wake:' .. room (see
// [Keys.Wake]), as an election's is KEYS[1] .. ':leader': a channel is no
// data that a Cluster's slot migration moves, and it shares the lease's
// hash tag, so declaring it, as the scripts did until issue 31, bought no
// check and cost every acquire and release about 1,300 instructions.

// retentionMs is FenceRetention in ms, as the scripts write it: a Lua
// string literal, since Redis turns a number passed to redis.call into a
// string with snprintf on every call (about 2,500 instructions).
var retentionMs = "'" + strconv.FormatInt(FenceRetention.Milliseconds(), 10) + "'"

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
// leanPadLua is its second half, for a t read already.
//
// leanNextTokenLua makes the token as nextToken (in protocolLua) does, and
// its text s, from the clock in t and us and the fencing key's raw (a
// token, or none): token is nil when the next one would pass 2^53-1. The
// includer declares token, s and now (set to the clock in µs).
//
// cancelLua is where the full path of a release starts for Cancel
// (KEYS[5], the void key, given): it takes value out of line (only Cancel
// can find its value there: a holder's value left the line when it was
// granted) and marks it void for ARGV[3] ms, after the delete (at
// maxmemory Redis refuses a script's first write unless it frees memory,
// and the delete must not depend on the marker). It declares out, the
// reply {deleted}, and returns it when the line's keys are of the wrong
// type; the includer declares value and deleted, and protocolLua's leave.
//
// seenLua is a Lua condition for the lean paths, true when a call may take
// a new grant or a new place although its value neither holds the lock
// nor stands in line: it brings no token it saw (ARGV[6]: its first call,
// or a caller that does not stand in line), or the fencing key (raw, which
// the includer has read) holds no token above it. Otherwise the call is
// stale (see stale, in grantLua) and the full path refuses it.
//
// leanTokenLua reads the fencing key and the clock, and makes the token
// and its text (leanNextTokenLua): the clock's seconds and µs side by side
// spare a string.format. (Arithmetic on a string reads it as a
// number at half the cost of tonumber.) It declares token, s, now (the
// clock in µs), t and us; token is nil when the fencing key holds no token
// that can be followed (fence's rule) or the next token would pass
// 2^53-1, and the full path is left to say so.
//
// leanSetTokenLua is leanTokenLua for a lock's grant, with the read of the
// fencing key and the write of the token in one call: it reads the clock,
// writes its µs to the fencing key with SET ... GET, which hands back what
// the key held (raw), and then makes the token from raw as leanTokenLua
// does, writing it again in the rare case that the clock has not passed
// the last token. That spares a GET (some 3,500 instructions) on the
// lock's commonest grants: a free lock's, and a release's pass. A call
// that brings a seen token (ARGV[6]) is checked against the fencing key
// before anything is written (seenLua; a stale call writes nothing), so
// for it the piece only reads the key, and wrote is false: the includer
// writes the token when it grants. The includer that then does not grant
// (token nil: raw is no token that can be followed, or the next token
// would pass 2^53-1; a stale call; a lapsed place) runs
// leanUnsetTokenLua, which puts back what a write replaced (the key's
// value, with the fencing key's retention as its TTL; a key of another
// type makes SET fail, writing nothing), before the full path decides and
// says what is wrong.
var (
	leanSetTokenLua = `
--[[ leanSetTokenLua: needs nothing; defines token s now t us raw wrote ]]
local token, s, now, t, us, raw
` + leanClockLua + `
s = t[1] .. us
local wrote = not ARGV[6]
if wrote then
  raw = redis.pcall('SET', KEYS[2], s, 'PX', ` + retentionMs + `, 'GET')
else
  raw = redis.pcall('GET', KEYS[2])
end
if not raw or type(raw) == 'string' and string.find(raw, '^%d+$') then
  now = t[1] * 1000000 + t[2]
  token = now
  if raw and token <= raw + 0 then
    token = raw + 1
    s = string.format('%.0f', token)
    if wrote then
      redis.call('SET', KEYS[2], s, 'PX', ` + retentionMs + `)
    end
  end
  if token > 9007199254740991 then
    token = nil
  end
end
`
	leanUnsetTokenLua = `
--[[ leanUnsetTokenLua: needs raw wrote ]]
if wrote and not raw then
  redis.call('DEL', KEYS[2])
elseif wrote and type(raw) == 'string' then
  redis.call('SET', KEYS[2], raw, 'PX', ` + retentionMs + `)
end
`
)

var (
	seenLua         = `--[[ seenLua: needs raw ]](not ARGV[6] or (raw and raw + 0 or 0) <= ARGV[6] + 0)`
	leanAnnounceLua = `
--[[ leanAnnounceLua: needs msg; defines r ]]
local r = redis.pcall('SPUBLISH', KEYS[1] .. ':leader', msg)
if type(r) == 'table' and r.err then
  redis.pcall('PUBLISH', KEYS[1] .. ':leader', msg)
end
`
	cancelLua = `
--[[ cancelLua: needs deleted leave value; defines err out ]]
local err
if KEYS[5] then
  err = leave(value)
  redis.call('SET', KEYS[5], '1', 'PX', ARGV[3])
end
local out = {deleted}
if err then
  return out
end
`
	leanPadLua = `
--[[ leanPadLua: needs t us ]]
us = t[2]
if #us < 6 then
  us = string.rep('0', 6 - #us) .. us
end
`
	leanClockLua = `
--[[ leanClockLua: needs t us ]]
t = redis.call('TIME')
` + leanPadLua
	leanNextTokenLua = `
--[[ leanNextTokenLua: needs now raw s t token us; defines last ]]
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
`
	leanTokenLua = `
--[[ leanTokenLua: needs nothing; defines token s now t us raw ]]
local token, s, now, t, us
local raw = redis.pcall('GET', KEYS[2])
if not raw or type(raw) == 'string' and string.find(raw, '^%d+$') then
` + leanClockLua + leanNextTokenLua + `
end
`
)

// The lean contended paths of every face share these pieces.
//
// leanPlaceLua takes or keeps value's place in line, once its entry is
// written (the includer's HSET, the first write, which fails on a waiters'
// key of another type): a place it has keeps its ticket; a new one gets
// the ticket the caller brings (ARGV[5]), or the clock in µs as text (a
// string.format spared), above the last ticket in line (ZCOUNT, a number
// in, tells whether any is as high, without reading a score out); and both
// keys of the line are kept at least the claim window (keep). The includer
// declares value, t, us, keep, fresh (the line's keys did not exist: they
// are new now, so their TTL is set without asking it, and value is first)
// and rank (value's rank, or false when it is not in line); leanPlaceLua
// declares ticket (text) and leaves rank the place's.
//
// leanHeadLua reads the first place in line and its entry: v, lapse,
// claim, room, and m, the entry's mode ("r" or "w" for a read-write lock's
// entry, "x" for one without; room is then the room alone), all nil when
// nobody or something unreadable is there.
//
// leanWakeLua tells room of a grant, msg ("<token>\n<value>"), as
// protocolLua's publish does.
var (
	leanPlaceLua = `
--[[ leanPlaceLua: needs fresh keep rank t us value; defines ticket ]]
local ticket
if rank then
  ticket = redis.call('ZSCORE', KEYS[3], value)
else
  ticket = ARGV[5]
  if not ticket or ticket == '0' then
    ticket = t[1] .. us
    if not fresh and redis.call('ZCOUNT', KEYS[3], ticket, '+inf') > 0 then
      local tail = redis.call('ZRANGE', KEYS[3], '-1', '-1', 'WITHSCORES')
      ticket = string.format('%.0f', tail[2] + 1)
    end
  end
  redis.call('ZADD', KEYS[3], ticket, value)
end
if fresh then
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
  redis.call('PEXPIRE', KEYS[4], ARGV[3])
  rank = 0
else
  if redis.call('PTTL', KEYS[3]) < keep then
    redis.call('PEXPIRE', KEYS[3], ARGV[3])
  end
  if redis.call('PTTL', KEYS[4]) < keep then
    redis.call('PEXPIRE', KEYS[4], ARGV[3])
  end
  if not rank then
    rank = redis.call('ZRANK', KEYS[3], value)
  end
end
`
	leanHeadLua = `
--[[ leanHeadLua: needs nothing; defines head v entry lapse claim room m ]]
local head = redis.pcall('ZRANGE', KEYS[3], '0', '0')
local v = not head.err and head[1]
local entry = v and redis.pcall('HGET', KEYS[4], v)
local lapse, claim, room, m
if type(entry) == 'string' then
  lapse, claim, room = string.match(entry, '^(%d+) (%d+) (.+)$')
  m = 'x'
  if room and string.byte(room, 2) == 32 then
    m, room = string.sub(room, 1, 1), string.sub(room, 3)
  end
end
`
	leanWakeLua = `
--[[ leanWakeLua: needs msg room; defines r ]]
local r = redis.pcall('SPUBLISH', KEYS[1] .. ':wake:' .. room, msg)
if type(r) == 'table' and r.err then
  redis.pcall('PUBLISH', KEYS[1] .. ':wake:' .. room, msg)
end
`
)

// leanQueueLua is the lean path of acquireScript for a caller that stands
// in line (or refreshes its place) behind another value's string, a Mutex
// or an Election that holds the lock: what the full path does in that
// case, call for call, without defining its helpers. It runs after the
// common case, which declares n (how many of the lease, the line and the
// value's void key exist) and value. It takes the path only when every
// check passes before its first write: the lease is a string not holding
// value; the fencing key holds a token that can be followed (or none);
// value is not void (when n says only the lease exists, neither the line
// nor the void key does; when value has a place, the line exists, so n
// says whether the void key does, and only a caller not in line asks); the line is a sorted set (ZSCORE) and the
// waiters' key a hash (HSET, the first write, fails on another type and
// writes nothing). Otherwise it has written nothing and the full path
// decides, and says what is wrong.
//
// A new place's ticket is the one the caller brings (ARGV[5]), or the
// clock in µs, above the last ticket in line; with nobody in line, the
// caller is first (rank 0) and the line's keys are new, so they are kept
// for the claim window without asking their TTL (leanPlaceLua). The lapse
// is written as ms + claim with string.format('%d'), cheaper than Lua's
// own number format.
//
// leanPassLua is the lean path of releaseScript for a release of value's
// string when someone is in line (line), for Release (not Cancel: KEYS[5]
// absent): the first place in line, if it is an exclusive one (a Mutex's
// or an Election's entry, without a mode) that has not lapsed, gets the
// lease for its claim window with a new token, and its room is told, as
// the full path's passTo does. It runs after the delete of value's lease
// (at maxmemory, Redis refuses a script's first write unless it frees
// memory, and a pass must not fail there), and its checks come before its
// own first write; when one fails (a reader or a writer of a read-write lock first
// in line, a lapsed place, a key of another type, a fencing key that
// cannot be followed), it has written nothing more, and the release goes
// on to the full path.
var (
	leanQueueLua = `
--[[ leanQueueLua: needs n value ]]
if n > 0 and ARGV[3] then
  local cur = redis.pcall('GET', KEYS[1])
  local raw = redis.pcall('GET', KEYS[2])
  local fresh, rank = n == 1, false
  local behind = type(cur) == 'string' and cur ~= value and (not raw or type(raw) == 'string' and string.find(raw, '^%d+$'))
  if behind and not fresh then
    rank = redis.pcall('ZRANK', KEYS[3], value)
  end
  -- A place in line (rank) says that the line exists besides the lease,
  -- so n says whether the void key does.
  if behind and type(rank) ~= 'table' and (fresh or rank and n == 2 or not rank and redis.call('EXISTS', KEYS[5]) == 0) then
    if rank or ` + seenLua + ` then
      local t, us
` + leanClockLua + `
      local keep = ARGV[3] + 0
      local ok = redis.pcall('HSET', KEYS[4], value, string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000) + keep) .. ' ' .. ARGV[3] .. ' ' .. ARGV[4])
      if type(ok) == 'number' then
` + leanPlaceLua + `
        return {0, redis.call('PTTL', KEYS[1]), cur, rank, ticket + 0, raw and raw + 0 or 0}
      end
    end
  end
end
`
	leanPassLua = `
--[[ leanPassLua: needs line ]]
if line and not KEYS[5] then
` + leanHeadLua + `
  if room and m == 'x' then
` + leanSetTokenLua + `
    if token and lapse + 0 > math.floor(now / 1000) then
      redis.call('ZREM', KEYS[3], v)
      redis.call('HDEL', KEYS[4], v)
      redis.call('SET', KEYS[1], v, 'PX', claim)
      local msg = s .. '\n' .. v
` + leanWakeLua + `
      if ARGV[2] == '1' then
` + leanAnnounceLua + `
      end
      return {1, token, v, room}
    end
` + leanUnsetTokenLua + `
  end
end
`
)

// leanSemQueueLua is the lean path of semAcquireScript for a caller that
// stands in line (or refreshes its place) while every permit is held: what
// the full path does in that case, without its helpers, as leanQueueLua
// does for a lock. It follows the common case, which declares value and n
// (how many of the line and the value's void key exist). Its checks, all
// before any write but the drop of the holders whose lease has ended
// (which the full path makes first too, and which only frees memory): the
// fencing key holds a token that can be followed, or none; value is not
// void; the lease key is a sorted set (ZREMRANGEBYSCORE fails on another
// type, writing nothing); no permit is free once the ended holders are
// dropped; value holds no permit (one passed to it while it waited is
// claimed by the full path); the line is a sorted set and the waiters' key
// a hash (HSET fails on another type, writing nothing). The reply names
// the holder whose lease ends first, as the full path's does.
//
// leanSemPassLua is the lean path of semReleaseScript for a Release (not
// Cancel) that leaves exactly one permit free while someone is in line: it
// passes that permit to the first place in line, if it has not lapsed, as
// passFree does (a semaphore's line holds only its own waiters, whose
// entries have no mode). It follows the common case, which has dropped the
// ended holders and the caller's permit, and declares t, us, now and
// deleted. When more than one permit is free (leases ended, or the caller's
// limit is above the others'), or a check fails (a lapsed place, a key of
// another type, a fencing key that cannot be followed), it has written
// nothing more and the full path passes what is free.
var (
	leanSemQueueLua = `
--[[ leanSemQueueLua: needs n value ]]
if ARGV[3] and (n == 0 or redis.call('EXISTS', KEYS[5]) == 0) then
  local raw = redis.pcall('GET', KEYS[2])
  if not raw or type(raw) == 'string' and string.find(raw, '^%d+$') then
    local t, us
` + leanClockLua + `
    local ms = t[1] * 1000 + math.floor(t[2] / 1000)
    if type(redis.pcall('ZREMRANGEBYSCORE', KEYS[1], '-inf', t[1] .. string.sub(us, 1, 3))) == 'number'
        and redis.call('ZCARD', KEYS[1]) >= ARGV[2] + 0 and not redis.call('ZSCORE', KEYS[1], value) then
      local fresh, rank = n == 0, false
      if not fresh then
        rank = redis.pcall('ZRANK', KEYS[3], value)
      end
      local keep = ARGV[3] + 0
      local ok = type(rank) ~= 'table' and (rank or ` + seenLua + `) and
        redis.pcall('HSET', KEYS[4], value, string.format('%d', ms + keep) .. ' ' .. ARGV[3] .. ' ' .. ARGV[4])
      if type(ok) == 'number' then
` + leanPlaceLua + `
        local soon = redis.call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')
        return {0, soon[2] - ms, soon[1], rank, ticket + 0, raw and raw + 0 or 0}
      end
    end
  end
end
`
	leanSemPassLua = `
--[[ leanSemPassLua: needs deleted now t us ]]
if not KEYS[5] and redis.call('ZCARD', KEYS[1]) + 1 == ARGV[2] + 0 then
` + leanHeadLua + `
  local raw = room and redis.pcall('GET', KEYS[2])
  if room and (not raw or type(raw) == 'string' and string.find(raw, '^%d+$')) then
    local token, s
` + leanNextTokenLua + `
    if token and lapse + 0 > math.floor(now / 1000) then
      redis.call('ZREM', KEYS[3], v)
      redis.call('HDEL', KEYS[4], v)
      redis.call('ZADD', KEYS[1], string.format('%d', math.ceil(now / 1000) + claim), v)
      if redis.call('PTTL', KEYS[1]) < claim + 0 then
        redis.call('PEXPIRE', KEYS[1], claim)
      end
      redis.call('SET', KEYS[1] .. ':permits', ARGV[2], 'PX', ` + retentionMs + `)
      redis.call('SET', KEYS[2], s, 'PX', ` + retentionMs + `)
      local msg = s .. '\n' .. v
` + leanWakeLua + `
      return {deleted, token, v, room}
    end
  end
end
`
)

// leanRWQueueLua is the lean path of rwAcquireScript for a caller, in
// either mode, that stands in line (or refreshes its place) while another
// value holds the lock as a writer whose lease lasts: the full path's
// decision in that case (nobody is granted while a writer holds), without
// its helpers, as leanQueueLua does behind a Mutex's string. It follows
// the common cases, which declare value and n (how many of the lease, the
// line and the void key exist). Its checks, all before the first write:
// the lease is a read-write lock's hash whose writer ("~w") is another
// value and whose field says its lease has not ended; the fencing key
// holds a token that can be followed, or none; value is not void; the line
// is a sorted set and the waiters' key a hash. The entry carries the
// caller's mode before its room, and the hash, which has its mark, is kept
// at least as long as the place, as the full path keeps it. The reply
// names the writer and what is left of its lease (a writer holds alone).
//
// leanRWPassLua is the lean path of rwReleaseScript for a Release (not
// Cancel) that left the lease key deleted (a writer's, or the last
// reader's) while someone is in line: the first place in line, if it is an
// exclusive one (a writer's "w" entry, or a Mutex's entry without a mode)
// and has not lapsed, gets the lock for its claim window with a new token,
// in its face's format (a writer's field, "~w" and the mark; a Mutex's
// string), and its room is told. A run of readers first in line, a lapsed
// place, a key of another type or a fencing key that cannot be followed
// leave it to the full path, with nothing more written. It follows the
// common case, which declares value, deleted, gone, t (the clock, read
// when the caller held the lock) and line.
var (
	leanRWQueueLua = `
--[[ leanRWQueueLua: needs n value ]]
if n > 0 and ARGV[3] then
  local h = redis.pcall('HMGET', KEYS[1], '~', '~w')
  if not h.err and h[1] == 'rw' and h[2] and h[2] ~= value then
    local writer = h[2]
    local f = redis.call('HGET', KEYS[1], writer)
    local e = f and string.match(f, '^(%d+) %d+$')
    local raw = e and redis.pcall('GET', KEYS[2])
    if e and (not raw or type(raw) == 'string' and string.find(raw, '^%d+$'))
        and (n == 1 or redis.call('EXISTS', KEYS[5]) == 0) then
      local t, us
` + leanClockLua + `
      local ms = t[1] * 1000 + math.floor(t[2] / 1000)
      local fresh, rank = n == 1, false
      if not fresh then
        rank = redis.pcall('ZRANK', KEYS[3], value)
      end
      local keep = ARGV[3] + 0
      local ok = e + 0 > ms and type(rank) ~= 'table' and (rank or ` + seenLua + `) and
        redis.pcall('HSET', KEYS[4], value, string.format('%d', ms + keep) .. ' ' .. ARGV[3] .. ' ' .. ARGV[2] .. ' ' .. ARGV[4])
      if type(ok) == 'number' then
` + leanPlaceLua + `
        if redis.call('PTTL', KEYS[1]) < keep then
          redis.call('PEXPIRE', KEYS[1], ARGV[3])
        end
        return {0, e - ms, writer, rank, ticket + 0, raw and raw + 0 or 0}
      end
    end
  end
end
`
	leanRWPassLua = `
--[[ leanRWPassLua: needs deleted gone line t ]]
if gone and line and not KEYS[5] then
` + leanHeadLua + `
  local exclusive = room and m ~= 'r'
  local raw = exclusive and redis.pcall('GET', KEYS[2])
  if exclusive and (not raw or type(raw) == 'string' and string.find(raw, '^%d+$')) then
    local token, s, now, us
` + leanPadLua + leanNextTokenLua + `
    if token and lapse + 0 > math.floor(now / 1000) then
      redis.call('ZREM', KEYS[3], v)
      redis.call('HDEL', KEYS[4], v)
      if m == 'x' then
        redis.call('SET', KEYS[1], v, 'PX', claim)
      else
        redis.call('HSET', KEYS[1], v, math.ceil(now / 1000) + claim .. ' ' .. s, '~w', v, '~', 'rw')
        redis.call('PEXPIRE', KEYS[1], claim)
      end
      redis.call('SET', KEYS[2], s, 'PX', ` + retentionMs + `)
      local msg = s .. '\n' .. v
` + leanWakeLua + `
      return {deleted, token, v, room}
    end
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
--[[ voidLua: needs err leave value ]]
if redis.call('EXISTS', KEYS[5]) == 1 then
  err = leave(value)
  if err then
    return err
  end
  return ` + reply + `
end
`
}

// staleLua is the text of the full path of an acquire that refuses a stale
// call: one that brings the last token its acquisition saw (ARGV[6]) and
// finds its value neither holding the lock (the includer has checked that)
// nor in line, while the fencing key (last) holds a later token. Such a
// call was sent before its acquisition was granted the lock and reaches
// Redis after that grant was used and ended (a path that held the request
// and delivered it late): granting it again, or putting it back in line
// where a release would pass it the lock, would hand its value a lease
// that nobody holds, or let the guard that renews that value regain the
// lock after another holder. It writes nothing and returns reply, a Lua
// expression (the reply of a caller that is not granted, rank -1). A live
// waiter whose place merely lapsed gets the same reply, and calls again at
// once with the fencing key's token (see [Place.Seen]). The includer
// declares value and last; a line of the wrong type reads as a place and
// is reported by standInLine.
func staleLua(reply string) string {
	return `
--[[ staleLua: needs last value ]]
if ARGV[6] and last > ARGV[6] + 0 and not redis.pcall('ZSCORE', KEYS[3], value) then
  return ` + reply + `
end
`
}

// leaseKindLua is a Lua expression for what KEYS[1] holds, for the error
// replies of the semaphore's scripts: its Redis type, or "rwmutex" for a
// read-write lock's hash (see kindError). It runs only on their error
// paths.
var leaseKindLua = `--[[ leaseKindLua: needs nothing ]](function()
  local t = redis.call('TYPE', KEYS[1]).ok
  if t == 'hash' and redis.call('HGET', KEYS[1], '~') == 'rw' then
    return 'rwmutex'
  end
  return t
end)()`

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
--[[ lockLua: needs nothing; defines mode holdMode want hold ]]
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
--[[ semLua: needs nothing; defines limit hold notSemaphore dropEnded ]]
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
--[[ protocolLua: needs hold; defines announcing publish announce fence clock nextToken foreign leave first passTo ]]
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
    local r = redis.pcall('ZRANGE', KEYS[3], '0', '0')
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
  publish(KEYS[1] .. ':wake:' .. room, text .. '\n' .. v)
  announce(token, v)
  return token
end
`

// grantLua defines, after protocolLua, the two helpers that only an
// acquire calls, grant and standInLine (see protocolLua's comment), apart
// so that a release does not make their closures.
var grantLua = `
--[[ grantLua: needs announce foreign hold nextToken; defines grant standInLine ]]
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
      local tail = redis.call('ZRANGE', KEYS[3], '-1', '-1', 'WITHSCORES')
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

// semPassLua defines passFree, which passes free permits, while fewer than
// permits are held, to the first live waiters in line (see passTo), after
// the token last (nil: read the fencing key first). It appends a
// {token, value, room} triple per pass to out, and returns the last token.
// A fencing or queue key of the wrong type stops it quietly: the caller's
// own grant or release stands. It follows protocolLua, whose helpers it
// calls.
var semPassLua = `
--[[ semPassLua: needs fence first passTo; defines passFree ]]
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
--[[ lineLua: needs announcing clock first holdMode mode passTo want; defines scan promote ]]
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
--[[ serveLua: needs fence promote scan; defines serve ]]
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
--[[ lockAcquireLua: needs clock fence grant hold holdMode leave mode promote scan standInLine value; defines waiting last err st v now room rank ticket serr ]]
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
` + staleLua("waiting(st, -1, 0, last)") + `local v
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
--[[ lockReleaseLua: needs announce announcing clock deleted gone leave serve value; defines err out st last ]]
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

// acquireScript acquires the lease if it is free, or, when asked, puts the
// caller in line or refreshes its place there. It is the script of a lock
// and of an election, which hold the lock of their name alone; a
// read-write lock of the same name is the same lock (rwAcquireScript), and
// both take one full path (lockAcquireLua).
//
// ARGV[1] TTL in ms, ARGV[2] "1" to announce every change of holder (an
// election; see [Keys.Election]), and to stand in line ARGV[3] the claim
// window in ms, ARGV[4] the waiting room, ARGV[5] a ticket to stand in line
// with (absent or "0": a new one, at the end), ARGV[6] the largest token
// the acquisition has learnt of (absent: none yet; a call that finds its
// value neither holding nor in line while the fencing key holds a larger
// one is stale and refused with rank -1, see staleLua). A lock's Acquire
// sends ARGV[1] alone: a missing ARGV[2] is no election, a missing ARGV[3]
// a caller that does not stand in line. The acquisition's value is not an argument: it is
// the end of its void key, KEYS[5], after KEYS[1] .. ":void:" (each
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
// line, refused in EXISTS, GET, GET and PTTL; then a caller that stands in
// line behind another's string (leanQueueLua), the contended case of a
// Mutex. When none applies, or the fencing key does not hold a token that
// can be followed, it has written nothing and the full path decides, as if
// it had not run.
//
// Cost per call (callgrind instructions and µs in Redis; COSTS.md,
// scripts/script-cost): the common case 68k, 5.1 µs (an election's 80k);
// refused (TryLock) 56k; standing in line behind a string 106k (behind
// readers 222k); a refresh of its place 120k.
var acquireScript = newScript(`
local value = string.sub(KEYS[5], #KEYS[1] + 7)
-- The common case: a free lease, nobody in line, a value not void.
local n = redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[5])
if n == 0 then
` + leanSetTokenLua + `
  if token and ` + seenLua + ` then
    redis.call('SET', KEYS[1], value, 'PX', ARGV[1])
    if not wrote then
      redis.call('SET', KEYS[2], s, 'PX', ` + retentionMs + `)
    end
    if ARGV[2] == '1' then
      local msg = s .. '\n' .. value
` + leanAnnounceLua + `
    end
    return token
  end
` + leanUnsetTokenLua + `
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
` + leanQueueLua + `
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
// nobody in line: GET, EXISTS and DEL (and for Cancel the void marker; for
// an election GET of the fencing key and the announcement that nobody
// leads), without defining any helper. When someone is in line, a Release
// of the value's string passes it to an exclusive waiter first in line
// without the helpers too (leanPassLua). Otherwise the full path goes on
// from what that part found (deleted, gone).
//
// Cost per call (as for acquireScript): the common case 35k, 2.5 µs
// (Cancel's 53k; an election's 51k); passing the lease to an exclusive
// waiter 111k (to a reader 194k).
var releaseScript = newScript(`
-- The common case: the lease holds the value, and nobody is in line.
local value = ARGV[1]
local cur = redis.pcall('GET', KEYS[1])
local deleted, gone = 0, false
if cur == value then
  local line = redis.call('EXISTS', KEYS[3]) == 1
` + leanPassLua + `
  redis.call('DEL', KEYS[1])
  deleted, gone = 1, true
  -- An election's release says that nobody leads, with the token of the
  -- term that ends (the fencing key's, since every grant sets it).
  local msg = not line and ARGV[2] == '1' and redis.pcall('GET', KEYS[2])
  if not line and (not msg or type(msg) == 'string' and string.find(msg, '^%d+$')) then
    if msg then
      msg = msg .. '\n'
` + leanAnnounceLua + `
    end
    if KEYS[5] then
      -- After the delete: at maxmemory Redis refuses a script's first
      -- write unless it frees memory, and the delete must not depend on
      -- the marker.
      redis.call('SET', KEYS[5], '1', 'PX', ARGV[3])
    end
    return 1
  end
end
` + lockLua + protocolLua + lineLua + serveLua + `
-- The full path, from what the common case found.
announcing = ARGV[2] == '1'
` + lockReleaseLua)

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
--[[ renewStringLua: needs nothing; defines cur ]]
local cur = redis.pcall('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
`
	renewHashLua = `
--[[ renewHashLua: needs nothing; defines h ]]
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
// HSET, PTTL, SET; a Mutex's string fails the HMGET and goes on); then a
// caller that stands in line behind a writer (leanRWQueueLua). Anything
// else goes to the full path that every face of the lock shares
// (lockAcquireLua), which decides as if they had not run.
//
// Cost per call (COSTS.md, scripts/script-cost; the "rwmutex" rows): the
// free lock 87k (a writer 89k); a reader among readers 104k; standing in
// line behind readers 212k. The full path reads every holder (HGETALL),
// so it grows with the number of readers; the common cases do not.
var rwAcquireScript = newScript(`
local value = string.sub(KEYS[5], #KEYS[1] + 7)
-- The common cases: nobody in line, a value not void, and a free lock or,
-- for a reader, one that readers hold (the mark, and no writer).
local n = redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[5])
local free = n == 0
if n == 1 and ARGV[2] == 'r' then
  -- (A value that holds already keeps its token: the full path.)
  local h = redis.pcall('HMGET', KEYS[1], '~', '~w', value)
  free = h[1] == 'rw' and not h[2] and not h[3]
end
if free then
` + leanTokenLua + `
  if token and ` + seenLua + ` then
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
` + leanRWQueueLua + `
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
// (lockReleaseLua), which drops a hold in either format. A release that
// leaves the lock free with an exclusive waiter first in line passes it
// without the helpers (leanRWPassLua).
var rwReleaseScript = newScript(`
-- The common case: nobody in line.
local value = ARGV[1]
local h = redis.pcall('HMGET', KEYS[1], '~w', value)
local deleted, gone = 0, false
local t
if not h.err and h[2] then
  t = redis.call('TIME')
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
local line = not h.err and redis.call('EXISTS', KEYS[3]) == 1
if not h.err and not line then
  if KEYS[5] then
    redis.call('SET', KEYS[5], '1', 'PX', ARGV[3])
  end
  return deleted
end
` + leanRWPassLua + `
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
// removing the ended holders, which the full path starts with anyway. A
// caller that stands in line while every permit is held takes a lean path
// of its own (leanSemQueueLua).
//
// Cost per call (as for acquireScript): a free permit 106k, 7.9 µs; all
// permits held, standing in line 137k.
var semAcquireScript = newScript(`
local value = string.sub(KEYS[5], #KEYS[1] + 7)
-- The common case: nobody in line, a value not void, a free permit.
local n = redis.call('EXISTS', KEYS[3], KEYS[5])
if n == 0 then
  -- ZCARD counts the holders whose lease has ended too, so fewer than
  -- permits means one is free; it fails on a lease key that is no sorted
  -- set, and held 0 means there is no set yet.
  local held = redis.pcall('ZCARD', KEYS[1])
  if type(held) == 'number' and held < tonumber(ARGV[2]) then
` + leanTokenLua + `
    if token and ` + seenLua + ` then
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
` + leanSemQueueLua + `
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
  local soon = redis.call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')
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
` + staleLua("waiting(-1, 0)") + `local held = redis.call('ZCARD', KEYS[1])
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
// EXISTS, and the void marker for Cancel); a Release that frees the one
// permit the first in line waits for passes it without the helpers
// (leanSemPassLua); only what is left makes it define the helpers that pass
// permits on.
//
// Cost per call (as for acquireScript): nobody in line 51k, 3.7 µs; passing
// a permit on 162k.
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
  if KEYS[5] then
    redis.call('SET', KEYS[5], '1', 'PX', ARGV[3])
  end
  return deleted
end
local now = t[1] * 1000000 + t[2]
` + leanSemPassLua + `
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

// lineScript reads a lock's line of waiters, for [Client.ReadLine], and
// the raw fencing key so that an inspection can tell a token from
// something else written there.
//
// KEYS[1] the line of waiters, KEYS[2] the fencing key, KEYS[3] the
// waiters' entries. ARGV[1] how many waiters to name.
// Reply: {waiters in line, the first ARGV[1] of their values, the fencing
// key's value or nil, their entries (a read-write lock's say the mode)}.
var lineScript = newScript(`
local n = redis.call('ZCARD', KEYS[1])
local first = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
local entries = {}
for i, v in ipairs(first) do
  entries[i] = redis.call('HGET', KEYS[3], v) or ''
end
return {n, first, redis.call('GET', KEYS[2]), entries}
`)

// rwReadScript reads the holders of a read-write lock, for
// [Client.ReadRW]: its hash at KEYS[1] (see [Keys.RW]). Reply: {the mark ('rw' for distlock's hash, ” for
// a foreign one), writer value or ”, value, ms left, value, ms left, ...}
// for the holders whose lease has not ended, the first to end first.
var rwReadScript = newScript(`
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
local writer, live = '', {}
for i = 1, #all, 2 do
  local f, x = all[i], all[i + 1]
  if f == '~w' then
    writer = x
  elseif string.sub(f, 1, 1) ~= '~' then
    local e = tonumber(string.match(x, '^(%d+) %d+$') or '')
    if e and e > now then
      table.insert(live, {f, e - now})
    end
  end
end
table.sort(live, function(a, b) return a[2] < b[2] end)
local out = {redis.call('HGET', KEYS[1], '~') or '', writer}
for _, h in ipairs(live) do
  table.insert(out, h[1])
  table.insert(out, h[2])
end
return out
`)
