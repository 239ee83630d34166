-- advance_turn: running → running (next turn taken by this worker, lease renewed)
--                       | queued (next turn queued).
-- Reads run (status, version, lease). Writes run (messages, version, lease), checkpoints,
-- events, leases, index; queues the turn.
-- Arguments: version, owner, messages (JSON), event (its data, JSON), added (the messages
--   the step added, JSON: its event's field `messages`; '' for none), keep_lease ('1' to
--   keep it), lease_ms, exhausted (JSON: the tools whose calls ran out of attempts)
-- Returns {'ok', new version, outbox entry or ''} | {'stale', …} | {'missing'}
local A = args({'version', 'owner', 'messages', 'event', 'added', 'keep_lease', 'lease_ms'}, {'exhausted'})
local version, owner, messages, event_data = A.version, A.owner, A.messages, A.event
local keep_lease, lease_ms, added = A.keep_lease, A.lease_ms, A.added
local refused, run = check_claim(version, owner)
if refused then return refused end
local checkpointed = run.checkpointed
count_exhausted(A.exhausted)
local now = now_ms()
local v = tonumber(version) + 1
if keep_lease == '1' then
  local until_ms = now + tonumber(lease_ms)
  redis.call('HSET', RUN, 'messages', messages, 'version', v, 'updated_at', now,
             'attempts', 0, 'lease_until', until_ms, 'waiting', '')
  redis.call('ZADD', LEASES, until_ms, ID)
  forget_retry(run)
  if checkpointed then
    redis.call('DEL', CHECKPOINTS)
    redis.call('HSET', RUN, 'checkpointed', '')
  end
  event('turn.committed', v, event_data, now, added)
  return {'ok', v, ''}
end
commit_step(version, messages, now, run, {'status', 'queued'})
redis.call('ZREM', INDEX.running, ID)
redis.call('ZADD', INDEX.queued, now, ID)
event('turn.committed', v, event_data, now, added)
return {'ok', v, enqueue('turn', v, now)}
