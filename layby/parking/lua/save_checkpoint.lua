-- save_checkpoint: keep one result of the current version (model reply, a tool's outcome).
-- A step that keeps saving results keeps its claim: each save renews the lease.
-- ARGV: 1 version, 2 owner, 3 field, 4 value JSON, 5 lease (ms)
-- Returns {'ok'} | {'stale', …} | {'missing'}
local refused = check_claim(ARGV[1], ARGV[2])
if refused then return refused end
redis.call('HSET', KEYS[5], ARGV[3], ARGV[4])
local until_ms = now_ms() + tonumber(ARGV[5])
redis.call('HSET', KEYS[1], 'lease_until', until_ms)
redis.call('ZADD', KEYS[9], until_ms, run_id())
return {'ok'}
