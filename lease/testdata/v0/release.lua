
-- The common case: the lease holds the value, and nobody is in line.
local value = ARGV[1]
local cur = redis.pcall('GET', KEYS[1])
local deleted = 0
if cur == value then
  redis.call('DEL', KEYS[1])
  deleted, cur = 1, false
  if ARGV[2] ~= '1' and redis.call('EXISTS', KEYS[3]) == 0 then
    if KEYS[6] then
      -- After the delete: at maxmemory Redis refuses a script's first
      -- write unless it frees memory, and the delete must not depend on
      -- the marker.
      redis.call('SET', KEYS[6], '1', 'PX', ARGV[3])
    end
    return 1
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

-- The full path, from what the common case found.
announcing = ARGV[2] == '1'
local err
if KEYS[6] then
  -- Only Cancel can find its value in line: a holder's value left the
  -- line when it was granted. The marker comes after the delete, as above.
  err = leave(value)
  redis.call('SET', KEYS[6], '1', 'PX', ARGV[3])
end
if cur or err then
  return {deleted}
end
local v, claim, room, now, ferr = first()
if ferr or not v and not (announcing and deleted == 1) then
  return {deleted}
end
local last, lerr = fence()
if lerr then
  return {deleted}
end
if not v then
  announce(last, '')
  return {deleted}
end
local token, terr = passTo(last, now, v, claim, room)
if terr then
  return {deleted}
end
return {deleted, token, v, room}
