-- save_checkpoint: keep one result of the current version (model reply, a tool's outcome).
-- ARGV: 1 version, 2 owner, 3 field, 4 value JSON
-- Returns {'ok'} | {'stale', …} | {'missing'}
local refused = check_claim(ARGV[1], ARGV[2])
if refused then return refused end
redis.call('HSET', KEYS[5], ARGV[3], ARGV[4])
return {'ok'}
