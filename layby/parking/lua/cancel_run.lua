-- cancel_run: any unfinished state → cancelled. A worker mid-turn finds its claim gone and
-- drops its commit.
-- Reads run. Writes run (error, version, status), index, leases, open, deadlines,
-- notifications, notify:due, events; the run's keys expire after retention.
-- Arguments: event (its data, JSON: {code, message, by}), retention_s, audit (JSON: its
--   audit entries, strings), slack ('1' to queue the update of the Slack messages of the
--   interrupts it leaves unanswered: `slack_update`)
-- Returns {'ok', new version, '', {}, {}, '0', when (ms), the event's id, the Slack
--          update's outbox entry or ''} | {'finished', status} | {'missing'}
local A = args({'event', 'retention_s', 'slack'}, {'audit'})
local event_data, retention_s = A.event, A.retention_s
local st = redis.call('HMGET', RUN, 'status', 'open', 'noted', 'version')
local status = st[1]
if not status then return {'missing'} end
if FINISHED[status] then return {'finished', status} end
local now = now_ms()
local v = tonumber(st[4]) + 1
finish('cancelled', now, tonumber(retention_s), status, {open = st[2], noted = st[3]},
       {'error', event_data, 'version', v, 'attempts', 0})
event('run.cancelled', v, event_data, now)
audit(A.audit, now)
local waiting = parse_open(st[2])
return {'ok', v, '', {}, {}, '0', now, LAST_EVENT, slack_update(A.slack, waiting, false, now)}
