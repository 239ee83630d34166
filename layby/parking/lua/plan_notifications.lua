-- plan_notifications: record the announcements of a parked run's open interrupts, each
-- once, and the hand-overs of reviewers away (`record_plan` in the prelude); requests due
-- now are delivered.
-- Reads run (status), notifications, review. Writes notifications, notify:due, grant keys,
-- review (hand-overs), events; pushes delivery tasks.
-- KEYS from EXTRA: one grant key per grant of the plan.
-- Arguments: plan (JSON, as record_plan reads it)
-- Returns {{ids planned by this call}, {ids the caller must dispatch}} ({{}, {}} when the
-- run no longer waits).
local A = args({}, {'plan'})
local st = redis.call('HMGET', RUN, 'status', 'version', 'open')
if st[1] ~= 'interrupted' then return {{}, {}} end
local _, open = parse_open(st[3])
local planned, dispatch = record_plan(A.plan, EXTRA, st[2], now_ms(), open, true)
return {planned, dispatch}
