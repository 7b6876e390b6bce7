
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

local token, s, now, t, us
local raw = redis.pcall('GET', KEYS[2])
if not raw or type(raw) == 'string' and string.find(raw, '^%d+$') then

t = redis.call('TIME')
us = t[2]
if #us < 6 then
  us = string.rep('0', 6 - #us) .. us
end

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
    redis.call('SET', KEYS[2], s, 'PX', '86400000')
    return token
  end
end

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
  return redis.error_reply('ERR distlock: ' .. KEYS[1] .. ' holds a ' .. (function()
  local t = redis.call('TYPE', KEYS[1]).ok
  if t == 'hash' and redis.call('HGET', KEYS[1], '~') == 'rw' then
    return 'rwmutex'
  end
  return t
end)() .. ', not a rwmutex; is the name used by another kind?')
end

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
local function grant(last, now, value, ttl)
  local token, terr = nextToken(last, now)
  if terr then
    return terr
  end
  hold(value, ttl, now)
  redis.call('SET', KEYS[2], token, 'PX', '86400000')
  announce(token, value)
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
local function first()
  local now
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
      if lapse and lapse + 0 > math.floor(now / 1000) then
        return v, claim, room, now
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
  hold(v, claim, now)
  local text = string.format('%.0f', token)
  redis.call('SET', KEYS[2], text, 'PX', '86400000')
  redis.call('ZREM', KEYS[3], v)
  redis.call('HDEL', KEYS[4], v)
  publish(KEYS[5] .. ':' .. room, text .. '\n' .. v)
  announce(token, v)
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
