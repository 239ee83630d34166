-- plan_notifications: record the announcements of a parked run's open interrupts, each
-- once. A notification already planned (same id) is left as it is, so planning again after
-- a crash sends nothing twice; its grant is stored only with a new notification.
-- Reads run (status), notifications. Writes notifications, notify:due, grant keys, events.
-- KEYS from 22: one grant key per grant in ARGV.
-- ARGV: 1 count n, 2 count g, then n triples: notification id, Notification JSON, when to
--       send (ms; '' for now), then g pairs: grant JSON, its lifetime (ms)
-- Returns the ids planned by this call ({} when the run no longer waits).
local count, grant_count = ARGV[1], ARGV[2]
if redis.call('HGET', RUN, 'status') ~= 'interrupted' then return {} end
local now = now_ms()
local id = run_id()
local n, g = tonumber(count), tonumber(grant_count)
local planned = {}
for i = 0, n - 1 do
  local nid, raw, at = ARGV[3 + 3 * i], ARGV[4 + 3 * i], ARGV[5 + 3 * i]
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
  local base = 3 + 3 * n
  for j = 0, g - 1 do
    redis.call('SET', KEYS[22 + j], ARGV[base + 2 * j], 'PX', ARGV[base + 2 * j + 1], 'NX')
  end
  event('notifications.planned', redis.call('HGET', RUN, 'version'),
        cjson.encode({ids = planned}), now)
end
return planned
