-- complete_run: running → completed, with the final text. Starts the retention clock.
-- ARGV: 1 version, 2 owner, 3 messages JSON, 4 result text, 5 event data JSON, 6 retention (s)
-- Returns {'ok', new version} | {'stale', …} | {'missing'}
local refused = check_claim(ARGV[1], ARGV[2])
if refused then return refused end
local now = now_ms()
redis.call('HSET', KEYS[1], 'messages', ARGV[3], 'result', ARGV[4])
local v = bump(now)
finish('completed', now, tonumber(ARGV[6]))
event('run.completed', v, ARGV[5], now)
return {'ok', v}
