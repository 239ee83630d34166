-- start_delivery: pending | retrying (once due) | sending (past its send deadline: the
-- sender died) → sending, with a new send deadline. An interrupt that is no longer open is
-- not announced: skipped. A notification out of attempts is failed.
-- Reads notifications, run (version), open. Writes notifications, notify:due, events and
-- stats (when it gives up, and when an escalation level is first asked), review
-- (escalated levels).
-- Arguments: notification_id, deadline_ms (the send's, from now), max_attempts, run_id
-- Returns {'ok', Notification JSON} | {'later'} | {'done', state} | {'failed'}
local A = args({'notification_id', 'deadline_ms', 'max_attempts', 'run_id'})
local deadline_ms, max_attempts, the_run = A.deadline_ms, A.max_attempts, A.run_id
local nid = A.notification_id
local member = the_run .. ' ' .. nid
local raw = note_of(nid)
if not raw then
  redis.call('ZREM', NOTIFY_DUE, member)
  return {'done', 'gone'}
end
local rec = decode_note(raw)
if rec.state == 'sent' or rec.state == 'failed' or rec.state == 'skipped' then
  redis.call('ZREM', NOTIFY_DUE, member)
  return {'done', rec.state}
end
local now = now_ms()
local st = redis.call('HMGET', RUN, 'version', 'open')
local v = st[1]
local _, open = parse_open(st[2])
if not open[rec.interruptId] then
  rec.state = 'skipped'
  save_note(nid, rec)
  redis.call('ZREM', NOTIFY_DUE, member)
  return {'done', 'skipped'}
end
if tonumber(rec.due) > now then
  -- Queued early (a sweep after a restart queues what may have been lost): back to its time.
  redis.call('ZADD', NOTIFY_DUE, rec.due, member)
  return {'later'}
end
if tonumber(rec.attempts) >= tonumber(max_attempts) then
  fail_notification(nid, rec, member, 'gave up after ' .. rec.attempts .. ' attempts; the '
                    .. 'last never finished (' .. (rec.lastError or 'the sender stopped') .. ')',
                    v, now)
  return {'failed'}
end
if rec.kind == 'escalation' then
  -- The level's first request to go out marks it reached: one event and one count a level.
  local level = tonumber(rec.level or 0)
  if redis.call('HSETNX', REVIEW, 'escalated:' .. rec.interruptId .. ':' .. level, now) == 1 then
    stat('escalations:' .. level)
    event('interrupt.escalated', v, cjson.encode({interruptId = rec.interruptId,
                                                  level = level}), now)
  end
end
rec.state = 'sending'
rec.attempts = tonumber(rec.attempts) + 1
rec.due = now + tonumber(deadline_ms)
save_note(nid, rec)
redis.call('ZADD', NOTIFY_DUE, rec.due, member)
return {'ok', cjson.encode(rec)}
