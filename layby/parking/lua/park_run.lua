-- park_run: running → interrupted (or straight to resuming when background jobs already
-- answered every new interrupt before this commit).
-- ARGV: 1 version, 2 owner, 3 messages JSON, 4 event data JSON, 5 resume task, 6 queue,
--       7 notify task ('' when no interrupt needs reviewers), 8 notify queue,
--       9 count n, then n triples: interrupt id, Interrupt JSON, expiry (ms, or '')
-- Returns {'ok', new version, entry} | {'stale', …} | {'missing'}; the entry queues the
-- resume when nothing stays open, else the announcement to reviewers (or is '').
local refused = check_claim(ARGV[1], ARGV[2])
if refused then return refused end
local now = now_ms()
local id = run_id()
redis.call('HSET', KEYS[1], 'messages', ARGV[3])
local v = bump(now)
redis.call('DEL', KEYS[5])
release_lease()
local n = tonumber(ARGV[9])
for i = 0, n - 1 do
  local iid, spec, expiry = ARGV[10 + 3 * i], ARGV[11 + 3 * i], ARGV[12 + 3 * i]
  redis.call('HSET', KEYS[2], iid, spec)
  if redis.call('HEXISTS', KEYS[3], iid) == 0 then
    redis.call('SADD', KEYS[4], iid)
    if expiry ~= '' then redis.call('ZADD', KEYS[10], tonumber(expiry), id .. ' ' .. iid) end
  end
end
set_status('interrupted', now)
event('run.interrupted', v, ARGV[4], now)
if redis.call('SCARD', KEYS[4]) == 0 then
  local rv = bump(now)
  set_status('resuming', now)
  event('run.resuming', rv, '{}', now)
  return {'ok', rv, outbox('resume', ARGV[5], ARGV[6], rv, now)}
end
if ARGV[7] ~= '' then return {'ok', v, outbox('notify', ARGV[7], ARGV[8], v, now)} end
return {'ok', v, ''}
