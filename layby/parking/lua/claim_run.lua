-- claim_run: queued | resuming | running (lease lapsed) → running, under a lease.
-- Reads run. Writes run (lease, attempts, status), leases, index, events, checkpoints, stats.
-- ARGV: 1 expected version, 2 owner, 3 lease (ms), 4 most attempts at one version
-- Returns {'ok', previous status, lease until, attempt} | {'stale', status, version} |
--         {'busy', owner, lease until} | {'exhausted', attempts} | {'missing'}
local expected, claimer, lease_ms, max_attempts = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = now_ms()
if redis.call('EXISTS', RUN) == 0 then return {'missing'} end
local st = redis.call('HMGET', RUN, 'status', 'version', 'lease_owner', 'lease_until',
                      'updated_at')
local status, version, owner, lease_until = st[1], st[2], st[3], tonumber(st[4] or '0')
if version ~= expected or not (status == 'queued' or status == 'resuming'
                              or status == 'running') then
  return {'stale', status, version}
end
if status == 'running' and owner and owner ~= claimer and lease_until > now then
  return {'busy', owner, lease_until}
end
-- Attempts are counted before running, so a step that kills its worker every time ends.
local attempt = redis.call('HINCRBY', RUN, 'attempts', 1)
if attempt > tonumber(max_attempts) then return {'exhausted', attempt - 1} end
local until_ms = now + tonumber(lease_ms)
redis.call('HSET', RUN, 'lease_owner', claimer, 'lease_until', until_ms)
redis.call('ZADD', LEASES, until_ms, run_id())
if status == 'resuming' then
  -- The last answer set updated_at: this is how long the continuation waited for a worker.
  observe('resume', now - tonumber(st[5] or now))
end
if status ~= 'running' then
  set_status('running', now)
  event('run.started', version, cjson.encode({from = status}), now)
end
-- Checkpoints belong to one version: drop those of a version that never committed.
if redis.call('HGET', CHECKPOINTS, 'v') ~= version then
  redis.call('DEL', CHECKPOINTS)
  redis.call('HSET', CHECKPOINTS, 'v', version)
end
return {'ok', status, until_ms, attempt}
