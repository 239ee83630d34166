-- plan_notifications: record the announcements of a parked run's open interrupts, each
-- once, and the hand-overs of reviewers away. A notification already planned (same id) is
-- left as it is, so planning again after a crash sends nothing twice; its grant is stored
-- only with a new notification; a hand-over is recorded once per reviewer and interrupt.
-- Reads run (status), notifications, review. Writes notifications, notify:due, grant keys,
-- review (hand-overs), events.
-- KEYS from 22: one grant key per grant in ARGV.
-- ARGV: 1 count n, 2 count g, 3 count d, then n triples: notification id, Notification
--       JSON, when to send (ms; '' for now), then g pairs: grant JSON, its lifetime (ms),
--       then d triples: interrupt id, the reviewer away, Delegation JSON
-- Returns the ids planned by this call ({} when the run no longer waits).
if redis.call('HGET', RUN, 'status') ~= 'interrupted' then return {} end
local now = now_ms()
local id = run_id()
local version = redis.call('HGET', RUN, 'version')
local n, g, d = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local base_grants, base_handovers = 4 + 3 * n, 4 + 3 * n + 2 * g
for k = 0, d - 1 do
  local iid, from, record = ARGV[base_handovers + 3 * k], ARGV[base_handovers + 3 * k + 1],
                            ARGV[base_handovers + 3 * k + 2]
  if redis.call('SISMEMBER', OPEN, iid) == 1
      and redis.call('HSETNX', REVIEW, 'delegated:' .. iid .. ':' .. from, record) == 1 then
    event('interrupt.delegated', version, record, now)
  end
end
local planned = {}
for i = 0, n - 1 do
  local nid, raw, at = ARGV[4 + 3 * i], ARGV[5 + 3 * i], ARGV[6 + 3 * i]
  if redis.call('HEXISTS', NOTIFICATIONS, nid) == 0 then
    local rec = cjson.decode(raw)
    rec.due = (at == '') and now or tonumber(at)
    rec.createdAt = now
    redis.call('HSET', NOTIFICATIONS, nid, cjson.encode(rec))
    -- The planner publishes requests itself; the sweeper's copy waits out the grace time.
    local publish_at = (at == '') and now + OUTBOX_GRACE_MS or rec.due
    redis.call('ZADD', NOTIFY_DUE, publish_at, id .. ' ' .. nid)
    table.insert(planned, nid)
  end
end
if #planned > 0 then
  for j = 0, g - 1 do
    redis.call('SET', KEYS[22 + j], ARGV[base_grants + 2 * j], 'PX',
               ARGV[base_grants + 2 * j + 1], 'NX')
  end
  event('notifications.planned', version, cjson.encode({ids = planned}), now)
end
return planned
