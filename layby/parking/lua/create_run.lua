-- create_run: (nothing) → queued, version 1, with the first turn in the outbox.
-- KEYS[21] idempotency key (string).
-- ARGV: 1 run id, 2 agent, 3 input JSON, 4 messages JSON, 5 metadata JSON,
--       6 idempotency ttl (s), 7 turn task, 8 queue
-- Returns {'created', entry} or {'exists', run id} (same idempotency key or run id).
local now = now_ms()
if KEYS[21] ~= '' then
  local existing = redis.call('GET', KEYS[21])
  if existing then return {'exists', existing} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists', ARGV[1]} end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'agent', ARGV[2], 'version', 1,
           'input', ARGV[3], 'messages', ARGV[4], 'metadata', ARGV[5],
           'created_at', now, 'updated_at', now)
set_status('queued', now)
if KEYS[21] ~= '' then redis.call('SET', KEYS[21], ARGV[1], 'EX', tonumber(ARGV[6])) end
event('run.created', 1, cjson.encode({agent = ARGV[2]}), now)
return {'created', outbox('turn', ARGV[7], ARGV[8], 1, now)}
