-- claim_run: queued | resuming | running (lease lapsed) → running, under a lease, and
-- everything the step needs, so the worker reads nothing else before it works.
-- Reads run (with the interrupts it parked on), checkpoints, answers (to those). Writes run
-- (lease, attempts, status), leases, index, events, checkpoints (dropped when they belong
-- to a version that never committed), stats, queues (how far its queue was taken).
-- Arguments: version (the one expected), owner, lease_ms, max_attempts (at one version),
--   hosts (what the claimer hosts of pinned runs: '<agent>@<version>', one a line)
-- Returns {'ok', previous status, lease until, attempt, agent, messages JSON, metadata JSON,
--          {checkpoint name, value JSON, …}, waiting ('' unless it parked),
--          {Interrupt JSON of each waiting id}, {its answer JSON or ''}, agent version or '',
--          '1' if pinned or '', tenant or '' (default), trace or '', trace_was or ''}
--       | {'stale', status, version} | {'busy', owner, lease until}
--       | {'elsewhere', agent version} (pinned to a version the claimer does not host)
--       | {'exhausted', attempts} | {'missing'}
local A = args({'version', 'owner', 'lease_ms', 'max_attempts', 'hosts'})
local expected, claimer, lease_ms, max_attempts = A.version, A.owner, A.lease_ms, A.max_attempts
local hosts = A.hosts
local st = redis.call('HMGET', RUN, 'status', 'version', 'lease_owner', 'lease_until',
                      'updated_at', 'attempts', 'agent', 'messages', 'metadata', 'waiting',
                      'checkpointed', 'agent_version', 'pinned', 'sent', 'tenant',
                      'trace', 'trace_was')
local status, version, owner = st[1], st[2], st[3]
if not version then return {'missing'} end
RUN_TENANT = st[15]
if version ~= expected or not (status == 'queued' or status == 'resuming'
                              or status == 'running') then
  return {'stale', status, version}
end
local now = now_ms()
if status == 'running' and owner and owner ~= claimer and tonumber(st[4] or '0') > now then
  return {'busy', owner, st[4]}
end
-- A pinned run's step is for a worker that hosts its version: refused before anything is
-- written, not counted as an attempt (the caller hands it back to its queue).
local pinned_to = (st[7] or '') .. '@' .. (st[12] or '')
if st[13] == '1'
    and not string.find('\n' .. hosts .. '\n', '\n' .. pinned_to .. '\n', 1, true) then
  return {'elsewhere', st[12]}
end
-- Attempts are counted before running, so a step that kills its worker every time ends.
local attempt = tonumber(st[6] or '0') + 1
if attempt > tonumber(max_attempts) then
  redis.call('HSET', RUN, 'attempts', attempt)
  return {'exhausted', attempt - 1}
end
local until_ms = now + tonumber(lease_ms)
if status ~= 'running' then
  redis.call('HSET', RUN, 'lease_owner', claimer, 'lease_until', until_ms, 'attempts', attempt,
             'status', 'running', 'updated_at', now)
  redis.call('ZREM', INDEX[status], ID)
  redis.call('ZADD', INDEX.running, now, ID)
  event('run.started', version, cjson.encode({from = status}), now)
  -- Its queue has been taken this far: every message it held before this one is gone
  -- from it (claimed, or lost).
  local queue, n = string.match(st[14] or '', '^(%S+) (%d+)$')
  if queue and tonumber(n) > tonumber(redis.call('HGET', QUEUES, queue .. ':taken') or '0') then
    redis.call('HSET', QUEUES, queue .. ':taken', n)
  end
else
  redis.call('HSET', RUN, 'lease_owner', claimer, 'lease_until', until_ms, 'attempts', attempt)
end
redis.call('ZADD', LEASES, until_ms, ID)
if status == 'resuming' then
  -- The last answer set updated_at: this is how long the continuation waited for a worker.
  observe('resume', now - tonumber(st[5] or now))
end
-- Checkpoints belong to one version: those of a version that never committed are dropped.
-- Only a step that saved some has them (`checkpointed` '1'; absent after a park, which
-- deletes it: looked at; so is a second attempt).
local checkpoints = {}
if st[11] ~= '' or attempt > 1 then
  local saved = redis.call('HGETALL', CHECKPOINTS)
  for i = 1, #saved, 2 do
    if saved[i] == 'v' and saved[i + 1] ~= version then
      redis.call('DEL', CHECKPOINTS)
      redis.call('HSET', RUN, 'checkpointed', '')
      checkpoints = {}
      break
    elseif saved[i] ~= 'v' then
      table.insert(checkpoints, saved[i])
      table.insert(checkpoints, saved[i + 1])
    end
  end
end
-- A parked turn resumes with the interrupts it waited on and their answers.
local specs, answers = {}, {}
local waiting = st[10] or ''
if waiting ~= '' then
  local ids = {}
  for iid in string.gmatch(waiting, '%S+') do table.insert(ids, iid) end
  specs = interrupts_of(ids)
  local given = redis.call('HMGET', ANSWERS, unpack(ids))
  for i = 1, #ids do table.insert(answers, given[i] or '') end
end
return {'ok', status, until_ms, attempt, st[7] or '', st[8] or '[]', st[9] or '{}',
        checkpoints, st[10] or '', specs, answers, st[12] or '', st[13] or '', st[15] or '',
        st[16] or '', st[17] or ''}
