-- finish_delivery: what a send came to. sending → sent | retrying (due again in ARGV[4] ms) |
-- failed (no attempts left: recorded on the run for operators; the run stays parked).
-- Reads notifications, run (version). Writes notifications, notify:due, events, stats.
-- ARGV: 1 notification id, 2 outcome (sent | retry | failed), 3 error text, 4 retry in (ms),
--       5 run id, 6 attempts of the send being finished
-- Returns {'ok'} | {'stale'} (another sender took this notification over)
local outcome, error_text, retry_ms, the_run, attempts = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local nid = ARGV[1]
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
  redis.call('ZREM', NOTIFY_DUE, member)
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
