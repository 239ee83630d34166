-- start_delivery: pending | retrying (once due) | sending (past its send deadline: the
-- sender died) → sending, with a new send deadline. An interrupt that is no longer open is
-- not announced: skipped. A notification out of attempts is failed.
-- ARGV: 1 notification id, 2 send deadline (ms from now), 3 max attempts, 4 run id
-- Returns {'ok', Notification JSON} | {'later'} | {'done', state} | {'failed'}
local nid = ARGV[1]
local member = ARGV[4] .. ' ' .. nid
local raw = redis.call('HGET', KEYS[18], nid)
if not raw then
  redis.call('ZREM', KEYS[19], member)
  return {'done', 'gone'}
end
local rec = cjson.decode(raw)
if rec.state == 'sent' or rec.state == 'failed' or rec.state == 'skipped' then
  redis.call('ZREM', KEYS[19], member)
  return {'done', rec.state}
end
local now = now_ms()
local v = redis.call('HGET', KEYS[1], 'version')
if redis.call('SISMEMBER', KEYS[4], rec.interruptId) == 0 then
  rec.state = 'skipped'
  redis.call('HSET', KEYS[18], nid, cjson.encode(rec))
  redis.call('ZREM', KEYS[19], member)
  return {'done', 'skipped'}
end
if tonumber(rec.due) > now then return {'later'} end
if tonumber(rec.attempts) >= tonumber(ARGV[3]) then
  fail_notification(nid, rec, member, 'gave up after ' .. rec.attempts .. ' attempts; the '
                    .. 'last never finished (' .. (rec.lastError or 'the sender stopped') .. ')',
                    v, now)
  return {'failed'}
end
rec.state = 'sending'
rec.attempts = tonumber(rec.attempts) + 1
rec.due = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[18], nid, cjson.encode(rec))
redis.call('ZADD', KEYS[19], rec.due, member)
return {'ok', cjson.encode(rec)}
