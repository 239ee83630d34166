-- create_run: (nothing) → queued, version 1, its first turn queued.
-- Reads the idempotency key, run. Writes run, idempotency key, index (its tenant's), the
-- shard's tenants, events; queues the first turn.
-- KEYS from EXTRA: the idempotency key (string), when the run has one (`keyed`); then,
-- with `elsewhere` (a store moving to the sharded layout, parking.formats), the run's hash
-- and its idempotency key (when keyed) in the other layout: read only, so that neither a
-- run id given twice nor a start retried across the move makes a second run.
-- Arguments: run_id, agent, input (JSON; '' when it is the first message's text: read
--   from there), messages (JSON), metadata (JSON), idempotency_ttl_s, agent_version
--   ('' unknown), pinned ('1' when the run is pinned to it: its steps then go to
--   `<turns queue>@<version>`), keyed ('1' or '0'), elsewhere ('1' or '0'), tenant (the
--   starter's tenant; '' for `default`: the run is then in the shard's own indexes), by
--   (who started it, when four eyes may apply to it; '' otherwise), audit (JSON: its audit
--   entries, strings), trace (the trace context its steps continue, a traceparent, or '')
-- Returns {'created', outbox entry or '', created at (ms), its event's id} or
-- {'exists', run id} (same idempotency key or run id).
local A = args({'run_id', 'agent', 'input', 'messages', 'metadata', 'idempotency_ttl_s', 'agent_version', 'pinned', 'keyed', 'elsewhere', 'tenant', 'by', 'trace'}, {'audit'})
local keyed = A.keyed == '1'
local IDEMPOTENCY = keyed and KEYS[EXTRA] or ''  -- '' without an idempotency key
local at = keyed and EXTRA + 1 or EXTRA
local OTHER_RUN = A.elsewhere == '1' and KEYS[at] or nil
local OTHER_IDEMPOTENCY = (OTHER_RUN and keyed) and KEYS[at + 1] or nil
local new_id, agent, input, messages = A.run_id, A.agent, A.input, A.messages
local metadata, idem_ttl_s = A.metadata, A.idempotency_ttl_s
local agent_version, pinned = A.agent_version, A.pinned
local now = now_ms()
if IDEMPOTENCY ~= '' then
  local existing = redis.call('GET', IDEMPOTENCY)
    or (OTHER_IDEMPOTENCY and redis.call('GET', OTHER_IDEMPOTENCY))
  if existing then return {'exists', existing} end
end
if redis.call('EXISTS', RUN) == 1 or (OTHER_RUN and redis.call('EXISTS', OTHER_RUN) == 1) then
  return {'exists', new_id}
end
-- The run's id is its key's; metadata is written only when there is some (readers take
-- an absent field for `{}`), the input only when it is not the history's first text:
-- bytes every run would hold, however long it is parked.
local fields = {'agent', agent, 'version', 1, 'status', 'queued',
                'messages', messages, 'created_at', now, 'updated_at', now, 'open', '',
                'noted', '0', 'checkpointed', ''}
if input ~= '' then
  table.insert(fields, 'input')
  table.insert(fields, input)
end
if metadata ~= '{}' then
  table.insert(fields, 'metadata')
  table.insert(fields, metadata)
end
if agent_version ~= '' then
  table.insert(fields, 'agent_version')
  table.insert(fields, agent_version)
  if pinned == '1' then
    table.insert(fields, 'pinned')
    table.insert(fields, '1')
  end
end
for _, named in ipairs({'tenant', 'by', 'trace'}) do
  if A[named] ~= '' then
    table.insert(fields, named)
    table.insert(fields, A[named])
  end
end
RUN_TENANT = A.tenant ~= '' and A.tenant or false
if RUN_TENANT then redis.call('SADD', TENANTS, RUN_TENANT) end
redis.call('HSET', RUN, unpack(fields))
redis.call('ZADD', INDEX.queued, now, ID)
if IDEMPOTENCY ~= '' then redis.call('SET', IDEMPOTENCY, new_id, 'EX', tonumber(idem_ttl_s)) end
event('run.created', 1, cjson.encode({agent = agent}), now)
audit(A.audit, now)
return {'created', enqueue('turn', 1, now), now, LAST_EVENT}
