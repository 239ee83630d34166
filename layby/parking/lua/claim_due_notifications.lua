-- claim_due_notifications: notifications whose send is due (a retry after its backoff, a
-- reminder, an escalation, a sender that died, a lost message), each pushed back so that
-- nobody queues it again meanwhile: with the broker on this server its delivery is pushed
-- here and it is due again only if that message is lost (LOST_MESSAGE_MS); otherwise the
-- caller dispatches it, and it is due again after a retry delay. The notification's own
-- record says whether it is really due (start_delivery.lua).
-- KEYS: 1 notify:due (zset)
-- Arguments: limit (the most entries), retry_ms (the delay)
-- Reads and writes notify:due; pushes delivery tasks.
-- Returns the "<run id> <notification id>" members the caller must dispatch.
local A = args({'limit', 'retry_ms'})
local NOTIFY_DUE = KEYS[1]
local limit, retry_ms = tonumber(A.limit), tonumber(A.retry_ms)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', NOTIFY_DUE, '-inf', now, 'LIMIT', 0, limit)
local dispatch = {}
for _, member in ipairs(due) do
  local run, nid = string.match(member, '^(%S+) (%S+)$')
  if run and push('deliver', run, nil, nid, now) then
    redis.call('ZADD', NOTIFY_DUE, now + LOST_MESSAGE_MS, member)
  else
    redis.call('ZADD', NOTIFY_DUE, now + retry_ms, member)
    table.insert(dispatch, member)
  end
end
return dispatch
