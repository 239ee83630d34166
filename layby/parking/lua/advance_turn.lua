-- advance_turn: running → running (next turn taken by this worker, lease renewed)
--                       | queued (next turn published through the outbox).
-- Reads run (status, version, lease). Writes run (messages, version, lease), checkpoints, events,
-- leases, index, outbox.
-- ARGV: 1 version, 2 owner, 3 messages JSON, 4 event data JSON, 5 '1' to keep the lease,
--       6 lease (ms), 7 turn task, 8 queue
-- Returns {'ok', new version, entry or ''} | {'stale', …} | {'missing'}
local version, owner, messages, event_data = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local keep_lease, lease_ms, turn_task, queue = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local refused = check_claim(version, owner)
if refused then return refused end
local now = now_ms()
redis.call('HSET', RUN, 'messages', messages)
local v = bump(now)
redis.call('DEL', CHECKPOINTS)
event('turn.committed', v, event_data, now)
if keep_lease == '1' then
  local until_ms = now + tonumber(lease_ms)
  redis.call('HSET', RUN, 'lease_until', until_ms)
  redis.call('ZADD', LEASES, until_ms, run_id())
  redis.call('HSET', CHECKPOINTS, 'v', v)
  return {'ok', v, ''}
end
release_lease()
set_status('queued', now)
return {'ok', v, outbox('turn', turn_task, queue, v, now)}
