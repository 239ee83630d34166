-- claim_due_notifications: notifications whose send is due (a lost publish, a retry after
-- its backoff, a reminder, a sender that died), each pushed back by a retry delay so that
-- two sweepers do not publish the same one at once. The notification's own record says
-- whether it is really due (start_delivery.lua).
-- KEYS: 1 notify:due (zset)
-- ARGV: 1 max entries, 2 retry delay (ms)
-- Reads and writes notify:due.
-- Returns "<run id> <notification id>" members.
local NOTIFY_DUE = KEYS[1]
local limit, retry_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', NOTIFY_DUE, '-inf', now, 'LIMIT', 0, limit)
for _, member in ipairs(due) do
  redis.call('ZADD', NOTIFY_DUE, now + retry_ms, member)
end
return due
