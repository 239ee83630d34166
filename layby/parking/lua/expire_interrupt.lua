-- expire_interrupt: an open interrupt past its deadline gets its expiry policy: an answer
-- (cancel, or resolve with a default) or the failure of the run.
-- ARGV: 1 interrupt id, 2 answer JSON (state "expired"), 3 error JSON to fail the run
--       ('' to apply the answer and go on), 4 resume task, 5 queue, 6 retention (s), 7 run id
-- Returns {'ok', version, entry or ''} | {'failed', version} | {'gone'} (answered, or the
-- run is over: the deadline is dropped) | {'later'} (not due yet)
local now = now_ms()
local member = ARGV[7] .. ' ' .. ARGV[1]
local due = redis.call('ZSCORE', KEYS[10], member)
if due and tonumber(due) > now then return {'later'} end
if not run_id() or redis.call('SISMEMBER', KEYS[4], ARGV[1]) == 0 then
  redis.call('ZREM', KEYS[10], member)
  return {'gone'}
end
if ARGV[3] == '' then
  local v, entry = apply_answers({{ARGV[1], ARGV[2]}}, ARGV[4], ARGV[5], now)
  return {'ok', v, entry}
end
redis.call('SREM', KEYS[4], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
event('interrupt.answered', redis.call('HGET', KEYS[1], 'version'), ARGV[2], now)
redis.call('HSET', KEYS[1], 'error', ARGV[3])
local v = bump(now)
finish('failed', now, tonumber(ARGV[6]))
event('run.failed', v, ARGV[3], now)
return {'failed', v}
