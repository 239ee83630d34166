-- fail_run: any unfinished state → failed, with an error {code, message}.
-- ARGV: 1 version ('' for any), 2 owner ('' when the caller holds no claim),
--       3 error JSON, 4 messages JSON ('' to keep), 5 retention (s)
-- Returns {'ok', new version} | {'stale', …} | {'finished', status} | {'missing'}
if ARGV[2] ~= '' then
  local refused = check_claim(ARGV[1], ARGV[2])
  if refused then return refused end
end
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
local status = redis.call('HGET', KEYS[1], 'status')
if FINISHED[status] then return {'finished', status} end
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'version') ~= ARGV[1] then
  return {'stale', status, redis.call('HGET', KEYS[1], 'version')}
end
local now = now_ms()
redis.call('HSET', KEYS[1], 'error', ARGV[3])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'messages', ARGV[4]) end
local v = bump(now)
finish('failed', now, tonumber(ARGV[5]))
event('run.failed', v, ARGV[3], now)
return {'ok', v}
