
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
