-- claim_outbox: take outbox entries whose publish is overdue, pushing each back by a retry
-- delay so that two sweepers do not publish the same entry at once.
-- KEYS: 1 outbox (zset), 2 outbox:entries (hash)
-- Arguments: limit (the most entries), retry_ms (the delay)
-- Reads and writes outbox; reads outbox:entries.
-- Returns the entries' JSON.
local A = args({'limit', 'retry_ms'})
local OUTBOX, OUTBOX_ENTRIES = KEYS[1], KEYS[2]
local limit, retry_ms = tonumber(A.limit), tonumber(A.retry_ms)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', OUTBOX, '-inf', now, 'LIMIT', 0, limit)
local out = {}
for _, entry_id in ipairs(due) do
  local entry = redis.call('HGET', OUTBOX_ENTRIES, entry_id)
  if entry then
    redis.call('ZADD', OUTBOX, now + retry_ms, entry_id)
    table.insert(out, entry)
  else
    redis.call('ZREM', OUTBOX, entry_id)
  end
end
return out
