-- finish_delivery: what a send came to. sending → sent | retrying (due again in ARGV[4] ms) |
-- failed (no attempts left: recorded on the run for operators; the run stays parked).
-- ARGV: 1 notification id, 2 outcome (sent | retry | failed), 3 error text, 4 retry in (ms),
--       5 run id, 6 attempts of the send being finished
-- Returns {'ok'} | {'stale'} (another sender took this notification over)
local nid = ARGV[1]
local member = ARGV[5] .. ' ' .. nid
local raw = redis.call('HGET', KEYS[18], nid)
if not raw then return {'stale'} end
local rec = cjson.decode(raw)
if rec.state ~= 'sending' or tonumber(rec.attempts) ~= tonumber(ARGV[6]) then
  return {'stale'}
end
local now = now_ms()
local v = redis.call('HGET', KEYS[1], 'version')
local data = {id = nid, interruptId = rec.interruptId, reviewer = rec.reviewer,
              channel = rec.channel, kind = rec.kind, attempts = rec.attempts}
if ARGV[2] == 'sent' then
  rec.state = 'sent'
  rec.sentAt = now
  rec.lastError = nil
  redis.call('ZREM', KEYS[19], member)
  event('notification.sent', v, cjson.encode(data), now)
elseif ARGV[2] == 'retry' then
  rec.state = 'retrying'
  rec.lastError = ARGV[3]
  rec.due = now + tonumber(ARGV[4])
  redis.call('ZADD', KEYS[19], rec.due, member)
  data.error = ARGV[3]
  event('notification.retrying', v, cjson.encode(data), now)
else
  fail_notification(nid, rec, member, ARGV[3], v, now)
  return {'ok'}
end
redis.call('HSET', KEYS[18], nid, cjson.encode(rec))
return {'ok'}
