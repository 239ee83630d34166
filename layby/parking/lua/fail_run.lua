-- fail_run: any unfinished state → failed, with an error {code, message}.
-- Reads run. Writes run (error, messages, version, status), index, leases, open, deadlines,
-- notifications, notify:due, checkpoints, events; keys expire after retention.
-- Arguments: version ('' for any), owner ('' when the caller holds no claim), error
--   (JSON), messages (JSON; '' to keep), retention_s, exhausted (JSON: the tools whose calls
--   ran out of attempts)
-- Returns {'ok', new version} | {'stale', …} | {'finished', status} | {'missing'}
local A = args({'version', 'owner', 'error', 'messages', 'retention_s'}, {'exhausted'})
local version, owner, error_json, messages = A.version, A.owner, A.error, A.messages
local retention_s = A.retention_s
if owner ~= '' then
  local refused = check_claim(version, owner)
  if refused then return refused end
end
local st = redis.call('HMGET', RUN, 'status', 'version', 'open', 'noted')
local status = st[1]
if not st[2] then return {'missing'} end
if FINISHED[status] then return {'finished', status} end
if version ~= '' and st[2] ~= version then return {'stale', status, st[2]} end
count_exhausted(A.exhausted)
local now = now_ms()
local v = tonumber(st[2]) + 1
local extra = {'error', error_json, 'version', v, 'attempts', 0}
if messages ~= '' then
  table.insert(extra, 'messages')
  table.insert(extra, messages)
end
finish('failed', now, tonumber(retention_s), status, {open = st[3], noted = st[4]}, extra)
count_failure(error_json)
event('run.failed', v, error_json, now)
return {'ok', v}
