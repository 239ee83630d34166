-- save_checkpoint: keep one result of the current version (model reply, a tool's outcome),
-- when losing it could repeat a side effect (tasks.steps says when). A step that keeps
-- saving results keeps its claim: each save renews the lease.
-- Reads run (claim). Writes checkpoints (with the version they belong to), run (lease, and
-- `checkpointed`, which tells the claim and the commit there are some), leases.
-- Arguments: version, owner, field, value (JSON), lease_ms
-- Returns {'ok'} | {'stale', …} | {'missing'}
local A = args({'version', 'owner', 'field', 'value', 'lease_ms'})
local version, owner, field, value, lease_ms = A.version, A.owner, A.field, A.value, A.lease_ms
local refused = check_claim(version, owner)
if refused then return refused end
redis.call('HSET', CHECKPOINTS, 'v', version, field, value)
local until_ms = now_ms() + tonumber(lease_ms)
redis.call('HSET', RUN, 'lease_until', until_ms, 'checkpointed', '1')
redis.call('ZADD', LEASES, until_ms, ID)
return {'ok'}
