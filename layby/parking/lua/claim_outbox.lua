-- claim_outbox: take outbox entries whose publish is overdue, pushing each back by a retry
-- delay so that two sweepers do not publish the same entry at once.
-- KEYS: 1 outbox (zset), 2 outbox:entries (hash)
-- ARGV: 1 max entries, 2 retry delay (ms)
-- Returns the entries' JSON.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for _, entry_id in ipairs(due) do
  local entry = redis.call('HGET', KEYS[2], entry_id)
  if entry then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), entry_id)
    table.insert(out, entry)
  else
    redis.call('ZREM', KEYS[1], entry_id)
  end
end
return out
