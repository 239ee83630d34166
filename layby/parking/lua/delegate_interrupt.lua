-- delegate_interrupt: a reviewer hands an open interrupt to another reviewer. Recorded once
-- per reviewer and interrupt; what was still to be sent to the one handing it on is
-- skipped; the announcement task is queued again, and plans the new reviewer's request.
-- Reads run, open, review. Writes review, notifications and notify:due (skipped), events,
-- outbox.
-- ARGV: 1 interrupt id, 2 the reviewer handing it on, 3 Delegation JSON, 4 notify task,
--       5 notify queue
-- Returns {'ok', version, entry} | {'missing'} | {'again', id} (handed on before) |
--         {'conflict', id, first answer JSON or '', run status}
local iid, from, record, notify_task, notify_queue = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if redis.call('EXISTS', RUN) == 0 then return {'missing'} end
local status = redis.call('HGET', RUN, 'status')
if status ~= 'interrupted' or redis.call('SISMEMBER', OPEN, iid) == 0 then
  return {'conflict', iid, redis.call('HGET', ANSWERS, iid) or '', status}
end
if redis.call('HSETNX', REVIEW, 'delegated:' .. iid .. ':' .. from, record) == 0 then
  return {'again', iid}
end
local now = now_ms()
skip_notifications({[iid] = true}, from)
local v = redis.call('HGET', RUN, 'version')
event('interrupt.delegated', v, record, now)
return {'ok', v, outbox('notify', notify_task, notify_queue, v, now)}
