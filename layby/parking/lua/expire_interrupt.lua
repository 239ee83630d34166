-- expire_interrupt: an open interrupt past its deadline gets its expiry policy: an answer
-- (cancel, or resolve with a default) or the failure of the run.
-- Reads deadlines, run, open. Writes deadlines, answers, open, events, stats; resumes
-- (run, index, outbox) or fails the run (as fail_run does).
-- ARGV: 1 interrupt id, 2 answer JSON (state "expired"), 3 error JSON to fail the run
--       ('' to apply the answer and go on), 4 retention (s)
-- Returns {'ok', version, outbox entry or '', {}, {}, '1' if the run resumes} |
-- {'failed', version} | {'gone'} (answered, or the
-- run is over: the deadline is dropped) | {'later'} (not due yet)
local interrupt_id, answer, fail_error = ARGV[1], ARGV[2], ARGV[3]
local retention_s = ARGV[4]
local now = now_ms()
local member = ID .. ' ' .. interrupt_id
local due = redis.call('ZSCORE', DEADLINES, member)
if due and tonumber(due) > now then return {'later'} end
if redis.call('SISMEMBER', OPEN, interrupt_id) == 0 then
  redis.call('ZREM', DEADLINES, member)
  return {'gone'}
end
if fail_error == '' then
  local v, entry, resumed = apply_answers({{interrupt_id, answer}}, now)
  return {'ok', v, entry, {}, {}, resumed and '1' or '0'}
end
redis.call('SREM', OPEN, interrupt_id)
redis.call('HSET', ANSWERS, interrupt_id, answer)
event('interrupt.answered', redis.call('HGET', RUN, 'version'), answer, now)
redis.call('HSET', RUN, 'error', fail_error)
local v = bump(now)
finish('failed', now, tonumber(retention_s))
event('run.failed', v, fail_error, now)
return {'failed', v}
