-- park_run: running → interrupted, its interrupts announced in the same step (or straight
-- to resuming when background jobs or policy rules already answered every new interrupt
-- before this commit).
-- Reads run, answers. Writes run (messages, version, status, lease, waiting), checkpoints,
-- interrupts, answers (rules' answers), open, deadlines, leases, index, events, stats,
-- notifications, notify:due, grant keys, review (hand-overs); queues the resume, or the
-- deliveries of the requests due now (or, when the caller could not plan them, the
-- announcement task).
-- KEYS from 22: the plan's grant keys.
-- ARGV: 1 version, 2 owner, 3 messages JSON, 4 event data JSON, 5 '1' to queue the
--       announcement task (layby.notify.interrupts) instead of a plan, 6 count n, then n
--       quintuples: interrupt id, Interrupt JSON, expiry (ms, or ''), the answer a policy
--       rule gives (JSON, or ''), that rule's name (or ''), then the plan (record_plan)
-- Returns {'ok', new version, outbox entry or '', {notifications planned},
--          {notifications the caller must dispatch}, '1' if it resumes at once}
--       | {'stale', …} | {'missing'}
local version, owner, messages, event_data = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local announce, count = ARGV[5], tonumber(ARGV[6])
local refused = check_claim(version, owner)
if refused then return refused end
local now = now_ms()
local waiting = {}
for i = 0, count - 1 do table.insert(waiting, ARGV[7 + 5 * i]) end
local v = commit_step(version, messages, now, {'waiting', table.concat(waiting, ' ')})
local by_rule = {}
for i = 0, count - 1 do
  local iid, spec, expiry = ARGV[7 + 5 * i], ARGV[8 + 5 * i], ARGV[9 + 5 * i]
  local auto, rule = ARGV[10 + 5 * i], ARGV[11 + 5 * i]
  redis.call('HSET', INTERRUPTS, iid, spec)
  if redis.call('HEXISTS', ANSWERS, iid) == 0 then
    if auto ~= '' then
      -- Answered by rule, in the park itself: nobody is asked, nothing can answer it twice.
      redis.call('HSET', ANSWERS, iid, auto)
      table.insert(by_rule, {auto, rule})
    else
      redis.call('SADD', OPEN, iid)
      if expiry ~= '' then redis.call('ZADD', DEADLINES, tonumber(expiry), ID .. ' ' .. iid) end
    end
  end
end
set_status('interrupted', now, 'running')
event('run.interrupted', v, event_data, now)
for _, pair in ipairs(by_rule) do
  stat('answers:policy')
  stat('auto_answers:' .. pair[2])
  event('interrupt.auto_answered', v, pair[1], now)
end
if redis.call('SCARD', OPEN) == 0 then
  local rv = bump(now)
  set_status('resuming', now, 'interrupted')
  event('run.resuming', rv, '{}', now)
  return {'ok', rv, enqueue('resume', rv, now), {}, {}, '1'}
end
if announce == '1' then return {'ok', v, enqueue('notify', v, now), {}, {}} end
local planned, dispatch = record_plan(7 + 5 * count, 22, v, now)
-- The stream of a parked run is copied into an exact fit: the first entry of a stream
-- reserves room for many more (4 KB with the defaults), which would stay reserved for
-- however long the run waits.
if redis.call('COPY', EVENTS, EVENTS .. ':compact', 'REPLACE') == 1 then
  redis.call('RENAME', EVENTS .. ':compact', EVENTS)
end
return {'ok', v, '', planned, dispatch}
