-- complete_run: running → completed, with the final text. Starts the retention clock.
-- Reads run. Writes run (messages, result, version, status), index, leases, open,
-- deadlines, notifications, notify:due, checkpoints, events; keys expire after retention.
-- ARGV: 1 version, 2 owner, 3 messages JSON, 4 result text, 5 event data JSON, 6 retention (s)
-- Returns {'ok', new version} | {'stale', …} | {'missing'}
local version, owner, messages = ARGV[1], ARGV[2], ARGV[3]
local result, event_data, retention_s = ARGV[4], ARGV[5], ARGV[6]
local refused, run = check_claim(version, owner)
if refused then return refused end
local now = now_ms()
local fields = ending('completed', now, run)
for _, x in ipairs({'result', result}) do table.insert(fields, x) end
local v = commit_step(version, messages, now, run.checkpointed, fields)
count_down('completed', 'running', now, tonumber(retention_s), run.noted)
event('run.completed', v, event_data, now)
return {'ok', v}
