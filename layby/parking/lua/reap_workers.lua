-- reap_workers: processes whose lease lapsed (a process killed, a machine gone) → removed,
-- once: two sweepers do not both act on one death.
-- KEYS: 1 workers (zset: name → lease end, ms), 2 workers:about (hash)
-- Arguments: lease_ms
-- Returns {name, last beat (ms), about (its kind first; '' if it said none), …} of each
-- process removed.
local A = args({'lease_ms'})
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, 100)
local out = {}
for i = 1, #lapsed, 2 do
  redis.call('ZREM', KEYS[1], lapsed[i])
  out[#out + 1] = lapsed[i]
  out[#out + 1] = tostring(tonumber(lapsed[i + 1]) - tonumber(A.lease_ms))
  out[#out + 1] = redis.call('HGET', KEYS[2], lapsed[i]) or ''
  redis.call('HDEL', KEYS[2], lapsed[i])
end
return out
