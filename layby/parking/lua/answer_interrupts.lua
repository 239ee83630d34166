-- answer_interrupts: record answers to open interrupts; the answer that closes the last
-- one moves interrupted → resuming and queues exactly one resume.
-- ARGV: 1 '1' if the answers must cover every open interrupt, 2 '1' to keep an answer for
--       an interrupt not parked yet (a background job that finished first), 3 resume task,
--       4 queue, 5 count n, then n pairs: interrupt id, answer JSON
-- Returns {'ok', version, entry or ''} | {'early'} | {'missing'} | {'finished', status} |
--         {'unknown', id} |
--         {'conflict', id, first answer JSON or '', run status} | {'incomplete', open ids…}
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
local status = redis.call('HGET', KEYS[1], 'status')
-- A finished run takes no early answers: its keys already count down to expiry.
if FINISHED[status] and ARGV[2] == '1' then return {'finished', status} end
local n = tonumber(ARGV[5])
for i = 0, n - 1 do
  local iid = ARGV[6 + 2 * i]
  if redis.call('HEXISTS', KEYS[2], iid) == 0 then
    if ARGV[2] == '1' then
      redis.call('HSETNX', KEYS[3], iid, ARGV[7 + 2 * i])
      return {'early'}
    end
    return {'unknown', iid}
  end
  if redis.call('SISMEMBER', KEYS[4], iid) == 0 then
    return {'conflict', iid, redis.call('HGET', KEYS[3], iid) or '',
            redis.call('HGET', KEYS[1], 'status')}
  end
end
if ARGV[1] == '1' and redis.call('SCARD', KEYS[4]) ~= n then
  local open = redis.call('SMEMBERS', KEYS[4])
  table.insert(open, 1, 'incomplete')
  return open
end
local answers = {}
for i = 0, n - 1 do table.insert(answers, {ARGV[6 + 2 * i], ARGV[7 + 2 * i]}) end
local v, entry = apply_answers(answers, ARGV[3], ARGV[4], now_ms())
return {'ok', v, entry}
