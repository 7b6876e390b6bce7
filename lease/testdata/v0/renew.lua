
local cur = redis.pcall('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if type(cur) ~= 'string' then
  cur = false
end
return {0, cur}
