-- complete_run: running → completed, with the final text. Starts the retention clock.
-- Reads run. Writes run (messages, result, version, status), index, leases, open,
-- deadlines, notifications, notify:due, checkpoints, events; keys expire after retention.
-- Arguments: version, owner, messages (JSON), result (text), event (its data, JSON), added
--   (the messages the step added, JSON: its event's field `messages`; '' for none),
--   retention_s, exhausted (JSON: the tools whose calls ran out of attempts)
-- Returns {'ok', new version} | {'stale', …} | {'missing'}
local A = args({'version', 'owner', 'messages', 'result', 'event', 'added', 'retention_s'}, {'exhausted'})
local version, owner, messages = A.version, A.owner, A.messages
local result, event_data, retention_s = A.result, A.event, A.retention_s
local refused, run = check_claim(version, owner)
if refused then return refused end
count_exhausted(A.exhausted)
local now = now_ms()
local fields = ending('completed', now, run)
for _, x in ipairs({'result', result}) do table.insert(fields, x) end
local v = commit_step(version, messages, now, run, fields)
count_down('completed', 'running', now, tonumber(retention_s))
event('run.completed', v, event_data, now, A.added)
return {'ok', v}
