-- renew_lease: the heartbeat of a worker running a step: running (claimed by this owner at
-- this version) → the same, its lease pushed to now + lease. A worker that dies stops
-- beating, its lease lapses, and the sweeper requeues the step (requeue_run.lua).
-- Reads run (status, version, lease owner). Writes run (lease_until), leases.
-- Arguments: version, owner, lease_ms
-- Returns {'ok', lease until} | {'stale', status, version, owner} (the claim is not this
-- worker's any more: it must not commit) | {'missing'}
local A = args({'version', 'owner', 'lease_ms'})
local version, owner, lease_ms = A.version, A.owner, A.lease_ms
local refused = check_claim(version, owner)
if refused then return refused end
local until_ms = now_ms() + tonumber(lease_ms)
redis.call('HSET', RUN, 'lease_until', until_ms)
redis.call('ZADD', LEASES, until_ms, ID)
return {'ok', until_ms}
