-- retry_notifications: an operator sends failed notifications again. failed → pending,
-- attempts 0, delivered now, only while the run is interrupted and the notification's
-- interrupt is still open; others are left as they are.
-- Reads run (status), notifications, open. Writes notifications, notify:due, events;
-- pushes delivery tasks.
-- Arguments: ids (JSON: the notification ids to retry; none: every failed one of the run)
-- Returns {{the ids set back to pending}, {those the caller must dispatch}}.
local A = args({}, {'ids'})
local st = redis.call('HMGET', RUN, 'status', 'open')
if st[1] ~= 'interrupted' then return {{}, {}} end
local _, open = parse_open(st[2])
local now = now_ms()
local ids, found = notes_of_run()
if #A.ids > 0 then ids = A.ids end
local retried, dispatch = {}, {}
for _, nid in ipairs(ids) do
  local raw = found[nid]
  if raw then
    local rec = decode_note(raw)
    if rec.state == 'failed' and open[rec.interruptId] then
      rec.state = 'pending'
      rec.attempts = 0
      rec.due = now
      rec.lastError = nil
      save_note(nid, rec)
      if not deliver_now(nid, now) then table.insert(dispatch, nid) end
      table.insert(retried, nid)
    end
  end
end
if #retried > 0 then
  event('notifications.retried', redis.call('HGET', RUN, 'version'),
        cjson.encode({ids = retried}), now)
end
return {retried, dispatch}
