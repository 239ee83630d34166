-- schedule_retry: running → retrying. Tool calls of the step failed in a way their policy
-- tries again: the step waits, holding no claim, and the sweeper queues it again at the same
-- version once its next try is due (requeue_run.lua). Nothing of the step is committed: what
-- it kept in memory is saved beside its checkpoints (its finished calls do not run again,
-- its model reply is not asked again), with each failed call's attempts so far
-- ("try:<ref>"); its claim's attempts start again, as the wait is not a crash.
-- Reads run (claim). Writes run (status, retry, retry_at, the claim's fields, attempts,
-- checkpointed), checkpoints, leases, index, retries, stats, events.
-- Arguments: version, owner, retry (RetryWait JSON, layby.wire, as views show it), due_ms
--   (when the next try is due), event (its data, JSON), checkpoints (JSON: name → value
--   JSON, a string), tools (JSON: the tool of each call tried again)
-- Returns {'ok', due ms} | {'stale', …} | {'missing'}
local A = args({'version', 'owner', 'retry', 'due_ms', 'event'}, {'checkpoints', 'tools'})
local version = A.version
local refused = check_claim(version, A.owner)
if refused then return refused end
local now = now_ms()
local saved = {'v', version}
for name, value in pairs(A.checkpoints) do
  table.insert(saved, name)
  table.insert(saved, value)
end
redis.call('HSET', CHECKPOINTS, unpack(saved))
release_lease()
redis.call('HSET', RUN, 'retry', A.retry, 'retry_at', A.due_ms, 'attempts', 0,
           'checkpointed', '1')
set_status('retrying', now, 'running')
redis.call('ZADD', RETRIES, A.due_ms, ID)
for _, name in ipairs(A.tools) do stat('tool_retries:' .. name) end
event('run.retrying', version, A.event, now)
return {'ok', A.due_ms}
