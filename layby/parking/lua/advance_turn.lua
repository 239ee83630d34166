-- advance_turn: running → running (next turn taken by this worker, lease renewed)
--                       | queued (next turn published through the outbox).
-- ARGV: 1 version, 2 owner, 3 messages JSON, 4 event data JSON, 5 '1' to keep the lease,
--       6 lease (ms), 7 turn task, 8 queue
-- Returns {'ok', new version, entry or ''} | {'stale', …} | {'missing'}
local refused = check_claim(ARGV[1], ARGV[2])
if refused then return refused end
local now = now_ms()
redis.call('HSET', KEYS[1], 'messages', ARGV[3])
local v = bump(now)
redis.call('DEL', KEYS[5])
event('turn.committed', v, ARGV[4], now)
if ARGV[5] == '1' then
  local until_ms = now + tonumber(ARGV[6])
  redis.call('HSET', KEYS[1], 'lease_until', until_ms)
  redis.call('ZADD', KEYS[9], until_ms, run_id())
  redis.call('HSET', KEYS[5], 'v', v)
  return {'ok', v, ''}
end
release_lease()
set_status('queued', now)
return {'ok', v, outbox('turn', ARGV[7], ARGV[8], v, now)}
