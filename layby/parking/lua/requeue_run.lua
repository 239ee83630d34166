-- requeue_run: running with a lapsed lease (its worker died) → queued, same version, the
-- turn queued again. Also used by operators to requeue a run that waits for a lost message.
-- Reads run. Writes run (lease, status), leases, index, events, outbox.
-- ARGV: 1 turn task, 2 resume task, 3 queue, 4 run id, 5 owner: '' waits for the lease to
--       lapse, '*' takes it over now (operators), else only that lease holder may requeue
-- Returns {'ok', entry} | {'busy'} | {'skipped', status} | {'missing'}
local turn_task, resume_task, queue, the_run, taker = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if redis.call('EXISTS', RUN) == 0 then
  redis.call('ZREM', LEASES, the_run)
  return {'missing'}
end
local now = now_ms()
local st = redis.call('HMGET', RUN, 'status', 'version', 'lease_until', 'lease_owner')
local status, version = st[1], st[2]
if status == 'running' then
  local lapsed = tonumber(st[3] or '0') <= now
  if not (lapsed or taker == '*' or (taker ~= '' and taker == st[4])) then
    return {'busy'}
  end
  release_lease()
  set_status('queued', now)
  event('run.requeued', version, '{}', now)
  return {'ok', outbox('turn', turn_task, queue, version, now)}
elseif status == 'queued' or status == 'resuming' then
  -- Refresh its place in the index, so the sweeper's scan for waiting runs whose message
  -- was lost finds it again only after another full wait.
  redis.call('ZADD', INDEX[status], now, run_id())
  event('run.requeued', version, '{}', now)
  local kind = status == 'queued' and 'turn' or 'resume'
  return {'ok', outbox(kind, status == 'queued' and turn_task or resume_task, queue, version, now)}
end
return {'skipped', status}
