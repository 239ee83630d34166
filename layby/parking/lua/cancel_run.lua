-- cancel_run: any unfinished state → cancelled. A worker mid-turn finds its claim gone and
-- drops its commit.
-- ARGV: 1 event data JSON ({by, reason}), 2 retention (s)
-- Returns {'ok', new version} | {'finished', status} | {'missing'}
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
local status = redis.call('HGET', KEYS[1], 'status')
if FINISHED[status] then return {'finished', status} end
local now = now_ms()
redis.call('HSET', KEYS[1], 'error', ARGV[1])
local v = bump(now)
finish('cancelled', now, tonumber(ARGV[2]))
event('run.cancelled', v, ARGV[1], now)
return {'ok', v}
