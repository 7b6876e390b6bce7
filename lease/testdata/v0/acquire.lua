
local value = string.sub(KEYS[6], #KEYS[1] + 7)
-- The common case: a free lease, nobody in line, a value not void.
if redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[6]) == 0 then

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
    redis.call('SET', KEYS[1], value, 'PX', ARGV[1])
    redis.call('SET', KEYS[2], s, 'PX', '86400000')
    if ARGV[2] == '1' then
      -- announce, as publish (below) does it.
      local msg = s .. '\n' .. value
      local r = redis.pcall('SPUBLISH', KEYS[1] .. ':leader', msg)
      if type(r) == 'table' and r.err then
        redis.pcall('PUBLISH', KEYS[1] .. ':leader', msg)
      end
    end
    return token
  end
end

local function hold(v, ms, now)
  redis.call('SET', KEYS[1], v, 'PX', ms)
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

-- The full path.
announcing = ARGV[2] == '1'
local last, err = fence()
if err then
  return err
end
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then
  return redis.error_reply('ERR distlock: ' .. KEYS[1] .. ' holds a ' .. (function()
  local t = redis.call('TYPE', KEYS[1]).ok
  if t == 'hash' and redis.call('HGET', KEYS[1], '~') == 'rw' then
    return 'rwmutex'
  end
  return t
end)() .. ', not a lock; is the name used by another kind?')
end
if redis.call('EXISTS', KEYS[6]) == 1 then
  err = leave(value)
  if err then
    return err
  end
  return {0, redis.call('PTTL', KEYS[1]), cur or '', -1, 0, last}
end
if cur == value then
  err = leave(value)
  if err then
    return err
  end
  if last > 0 then
    -- The last grant was to this value: the same acquisition asks again.
    -- It keeps its token, so a term has one token and nothing changes
    -- hands (nothing to announce).
    redis.call('PEXPIRE', KEYS[1], ARGV[1])
    return last
  end
  return grant(last, clock(), value, ARGV[1])
end
local now
if not cur then
  local v, claim, room
  v, claim, room, now, err = first()
  if err then
    return err
  end
  now = now or clock()
  if not v or v == value then
    if v then
      leave(v)
    end
    return grant(last, now, value, ARGV[1])
  end
  local token, terr = passTo(last, now, v, claim, room)
  if terr then
    return terr
  end
  cur, last = v, token
end
if not ARGV[3] then
  return {0, redis.call('PTTL', KEYS[1]), cur, -1, 0, last}
end
local rank, ticket, serr = standInLine(now or clock(), value, ARGV[3], ARGV[4], tonumber(ARGV[5] or '0'))
if serr then
  return serr
end
return {0, redis.call('PTTL', KEYS[1]), cur, rank, ticket, last}
