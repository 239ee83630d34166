-- delegate_interrupt: a reviewer hands an open interrupt to another reviewer. Recorded once
-- per reviewer and interrupt; what was still to be sent to the one handing it on is
-- skipped; the new reviewer's request is recorded and delivered in the same step (or, when
-- the caller could not plan it, the announcement task is queued to plan it).
-- Reads run, open, review. Writes review, notifications, notify:due, grant keys, events,
-- the reviewers' request index (the new reviewer's); queues deliveries (or the
-- announcement task).
-- KEYS from EXTRA: the plan's grant keys.
-- Arguments: interrupt_id, reviewer (the one handing it on), handover (Delegation JSON),
--   announce ('1' to queue the announcement task instead of a plan), plan (JSON, as
--   record_plan reads it), slack ('1' to queue the update of the giver's Slack message:
--   `slack_update`)
-- Returns {'ok', version, outbox entry or '', {notifications planned},
--          {notifications the caller must dispatch}, '0', when (ms), the event's id, the
--          Slack update's outbox entry or ''} | {'missing'} | {'again', id} (handed
--          on before) | {'conflict', id, first answer JSON or '', run status}
local A = args({'interrupt_id', 'reviewer', 'handover', 'announce', 'slack'}, {'plan'})
local iid, from, record, announce = A.interrupt_id, A.reviewer, A.handover, A.announce
local st = redis.call('HMGET', RUN, 'status', 'version', 'open', 'noted')
local status, v = st[1], st[2]
if not v then return {'missing'} end
local _, open = parse_open(st[3])
if status ~= 'interrupted' or not open[iid] then
  return {'conflict', iid, redis.call('HGET', ANSWERS, iid) or '', status}
end
if redis.call('HSETNX', REVIEW, 'delegated:' .. iid .. ':' .. from, record) == 0 then
  return {'again', iid}
end
local now = now_ms()
skip_notifications({[iid] = true}, from, st[4])
ask_handed(record, now)
event('interrupt.delegated', v, record, now)
local slack = slack_update(A.slack, {iid}, false, now)
if announce == '1' then
  return {'ok', v, enqueue('notify', v, now), {}, {}, '0', now, LAST_EVENT, slack}
end
local planned, dispatch = record_plan(A.plan, EXTRA, v, now, open, true)
return {'ok', v, '', planned, dispatch, '0', now, LAST_EVENT, slack}
