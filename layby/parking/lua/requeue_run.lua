-- requeue_run: running with a lapsed lease (its worker died) → queued, same version, the
-- turn queued again; retrying whose next try is due → queued, same version, the step queued
-- again with its checkpoints (schedule_retry.lua). Also used by operators to requeue a run
-- that waits for a lost message, or to try a retrying run's calls again now.
-- Reads run. Writes run (lease, status), leases, retries, index, events; queues the step.
-- Arguments: owner ('' waits for the lease to lapse or the retry to be due, '*' takes it
--   over now (operators), else only that lease holder may requeue)
-- Returns {'ok', outbox entry or ''} | {'busy'} | {'later'} (a retry not due yet)
--       | {'skipped', status} | {'missing'}
local A = args({'owner'})
local taker = A.owner
local st = redis.call('HMGET', RUN, 'status', 'version', 'lease_until', 'lease_owner',
                      'retry_at')
local status, version = st[1], st[2]
if not version then
  redis.call('ZREM', LEASES, ID)
  return {'missing'}
end
local now = now_ms()
if status == 'running' then
  local lapsed = tonumber(st[3] or '0') <= now
  if not (lapsed or taker == '*' or (taker ~= '' and taker == st[4])) then
    return {'busy'}
  end
  release_lease()
  set_status('queued', now, status)
  event('run.requeued', version, '{}', now)
  return {'ok', enqueue('turn', version, now)}
elseif status == 'queued' or status == 'resuming' then
  -- Refresh its place in the index, so the sweeper's scan for waiting runs whose message
  -- was lost finds it again only after another full wait.
  redis.call('ZADD', INDEX[status], now, ID)
  event('run.requeued', version, '{}', now)
  return {'ok', enqueue(status == 'queued' and 'turn' or 'resume', version, now)}
elseif status == 'retrying' then
  if not (taker == '*' or tonumber(st[5] or '0') <= now) then return {'later'} end
  redis.call('ZREM', RETRIES, ID)
  set_status('queued', now, status)
  event('run.requeued', version, taker == '*' and '{"retry":"now"}' or '{"retry":"due"}', now)
  return {'ok', enqueue('turn', version, now)}
end
return {'skipped', status}
