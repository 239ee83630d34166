-- answer_interrupts: record answers to open interrupts; the answer that closes the last
-- one moves interrupted → resuming and queues exactly one resume.
-- Reads run, interrupts, answers, open. Writes answers, open, deadlines, events,
-- notifications and notify:due (skipped), stats; with the last answer run, index, outbox.
-- ARGV: 1 '1' if the answers must cover every open interrupt, 2 '1' to keep an answer for
--       an interrupt not parked yet (a background job that finished first), 3 resume task,
--       4 queue, 5 count n, then n pairs: interrupt id, answer JSON
-- Returns {'ok', version, entry or ''} | {'early'} | {'missing'} | {'finished', status} |
--         {'unknown', id} |
--         {'conflict', id, first answer JSON or '', run status} | {'incomplete', open ids…}
local require_all, allow_early = ARGV[1], ARGV[2]
local resume_task, queue, count = ARGV[3], ARGV[4], ARGV[5]
if redis.call('EXISTS', RUN) == 0 then return {'missing'} end
local status = redis.call('HGET', RUN, 'status')
-- A finished run takes no early answers: its keys already count down to expiry.
if FINISHED[status] and allow_early == '1' then return {'finished', status} end
local n = tonumber(count)
for i = 0, n - 1 do
  local iid = ARGV[6 + 2 * i]
  if redis.call('HEXISTS', INTERRUPTS, iid) == 0 then
    if allow_early == '1' then
      redis.call('HSETNX', ANSWERS, iid, ARGV[7 + 2 * i])
      return {'early'}
    end
    return {'unknown', iid}
  end
  if redis.call('SISMEMBER', OPEN, iid) == 0 then
    return {'conflict', iid, redis.call('HGET', ANSWERS, iid) or '',
            redis.call('HGET', RUN, 'status')}
  end
end
if require_all == '1' and redis.call('SCARD', OPEN) ~= n then
  local open = redis.call('SMEMBERS', OPEN)
  table.insert(open, 1, 'incomplete')
  return open
end
local answers = {}
for i = 0, n - 1 do table.insert(answers, {ARGV[6 + 2 * i], ARGV[7 + 2 * i]}) end
local v, entry = apply_answers(answers, resume_task, queue, now_ms())
return {'ok', v, entry}
