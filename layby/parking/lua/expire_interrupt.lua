-- expire_interrupt: an open interrupt past its deadline gets its expiry policy: an answer
-- (cancel, or resolve with a default) or the failure of the run.
-- Reads deadlines, run, open. Writes deadlines, answers, open, events, stats; resumes
-- (run, index, outbox) or fails the run (as fail_run does).
-- Arguments: interrupt_id, answer (JSON, state "expired"), fail_error (JSON, to fail the
--   run; '' to apply the answer and go on), retention_s, slack ('1' to queue the update of
--   the interrupt's Slack messages: `slack_update`), trace (the sweeper's trace context, a
--   traceparent, or '': a resume continues it)
-- Returns {'ok' | 'failed', version, outbox entry or '', {}, {}, '1' if the run resumes,
--          when (ms), the last event's id, the Slack update's outbox entry or ''} |
-- {'gone'} (answered, or the
-- run is over: the deadline is dropped) | {'later'} (not due yet)
local A = args({'interrupt_id', 'answer', 'fail_error', 'retention_s', 'slack', 'trace'})
local interrupt_id, answer, fail_error = A.interrupt_id, A.answer, A.fail_error
local retention_s = A.retention_s
local now = now_ms()
local member = ID .. ' ' .. interrupt_id
local due = redis.call('ZSCORE', DEADLINES, member)
if due and tonumber(due) > now then return {'later'} end
local run = redis.call('HMGET', RUN, 'status', 'version', 'updated_at', 'open', 'noted',
                      'waiting')
local _, open = parse_open(run[4])
if not run[1] or not open[interrupt_id] then
  redis.call('ZREM', DEADLINES, member)
  return {'gone'}
end
if fail_error == '' then
  local v, entry, resumed = apply_answers({{interrupt_id, answer, true}}, now, run, A.trace)
  return {'ok', v, entry, {}, {}, resumed and '1' or '0', now, LAST_EVENT,
          slack_update(A.slack, {interrupt_id}, false, now)}
end
redis.call('HSET', ANSWERS, interrupt_id, answer)
event('interrupt.answered', run[2], answer, now)
local v = tonumber(run[2]) + 1
finish('failed', now, tonumber(retention_s), run[1], {open = run[4], noted = run[5]},
       {'error', fail_error, 'version', v, 'attempts', 0})
count_failure(fail_error)
event('run.failed', v, fail_error, now)
return {'failed', v, '', {}, {}, '0', now, LAST_EVENT,
        slack_update(A.slack, {interrupt_id}, false, now)}
