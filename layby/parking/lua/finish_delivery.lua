-- finish_delivery: what a send came to. sending → sent | retrying (due again in retry_ms) |
-- failed (no attempts left: recorded on the run for operators; the run stays parked).
-- Reads notifications, run (version). Writes notifications, notify:due, events, stats.
-- Arguments: notification_id, outcome (sent | retry | failed), error (text), retry_ms (due
--   again in, for a retry), run_id, attempts (of the send being finished), message (where
--   a sent message is, to update it later: a Slack post's "<channel>/<ts>"; '' for none)
-- Returns {'ok'} | {'stale'} (another sender took this notification over)
local A = args({'notification_id', 'outcome', 'error', 'retry_ms', 'run_id', 'attempts', 'message'})
local outcome, error_text, retry_ms = A.outcome, A.error, A.retry_ms
local the_run, attempts, nid = A.run_id, A.attempts, A.notification_id
local member = the_run .. ' ' .. nid
local raw = note_of(nid)
if not raw then return {'stale'} end
local rec = decode_note(raw)
if rec.state ~= 'sending' or tonumber(rec.attempts) ~= tonumber(attempts) then
  return {'stale'}
end
local now = now_ms()
local v = redis.call('HGET', RUN, 'version')
local data = {id = nid, interruptId = rec.interruptId, reviewer = rec.reviewer,
              channel = rec.channel, kind = rec.kind, attempts = rec.attempts}
if outcome == 'sent' then
  rec.state = 'sent'
  rec.sentAt = now
  rec.lastError = nil
  rec.due = nil  -- nothing more is due: a parked run keeps the record for as long as it waits
  if A.message ~= '' then rec.message = A.message end
  redis.call('ZREM', NOTIFY_DUE, member)
  stat('notifications_sent:' .. (rec.channel or 'unknown'))
  event('notification.sent', v, cjson.encode(data), now)
elseif outcome == 'retry' then
  rec.state = 'retrying'
  rec.lastError = error_text
  rec.due = now + tonumber(retry_ms)
  redis.call('ZADD', NOTIFY_DUE, rec.due, member)
  data.error = error_text
  event('notification.retrying', v, cjson.encode(data), now)
else
  fail_notification(nid, rec, member, error_text, v, now)
  return {'ok'}
end
save_note(nid, rec)
return {'ok'}
