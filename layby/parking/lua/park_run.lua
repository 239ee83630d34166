-- park_run: running → interrupted (or straight to resuming when background jobs or policy
-- rules already answered every new interrupt before this commit).
-- Reads run, answers. Writes run (messages, version, status, lease), checkpoints,
-- interrupts, answers (rules' answers), open, deadlines, leases, index, events, stats,
-- outbox.
-- ARGV: 1 version, 2 owner, 3 messages JSON, 4 event data JSON, 5 resume task, 6 queue,
--       7 notify task ('' when no interrupt needs reviewers), 8 notify queue,
--       9 count n, then n quintuples: interrupt id, Interrupt JSON, expiry (ms, or ''),
--       the answer a policy rule gives (JSON, or ''), that rule's name (or '')
-- Returns {'ok', new version, entry} | {'stale', …} | {'missing'}; the entry queues the
-- resume when nothing stays open, else the announcement to reviewers (or is '').
local version, owner, messages, event_data = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local resume_task, queue, notify_task, notify_queue, count = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local refused = check_claim(version, owner)
if refused then return refused end
local now = now_ms()
local id = run_id()
redis.call('HSET', RUN, 'messages', messages)
local v = bump(now)
redis.call('DEL', CHECKPOINTS)
release_lease()
local n = tonumber(count)
local by_rule = {}
for i = 0, n - 1 do
  local iid, spec, expiry = ARGV[10 + 5 * i], ARGV[11 + 5 * i], ARGV[12 + 5 * i]
  local auto, rule = ARGV[13 + 5 * i], ARGV[14 + 5 * i]
  redis.call('HSET', INTERRUPTS, iid, spec)
  if redis.call('HEXISTS', ANSWERS, iid) == 0 then
    if auto ~= '' then
      -- Answered by rule, in the park itself: nobody is asked, nothing can answer it twice.
      redis.call('HSET', ANSWERS, iid, auto)
      table.insert(by_rule, {auto, rule})
    else
      redis.call('SADD', OPEN, iid)
      if expiry ~= '' then redis.call('ZADD', DEADLINES, tonumber(expiry), id .. ' ' .. iid) end
    end
  end
end
set_status('interrupted', now)
event('run.interrupted', v, event_data, now)
for _, pair in ipairs(by_rule) do
  stat('answers:policy')
  stat('auto_answers:' .. pair[2])
  event('interrupt.auto_answered', v, pair[1], now)
end
if redis.call('SCARD', OPEN) == 0 then
  local rv = bump(now)
  set_status('resuming', now)
  event('run.resuming', rv, '{}', now)
  return {'ok', rv, outbox('resume', resume_task, queue, rv, now)}
end
if notify_task ~= '' then return {'ok', v, outbox('notify', notify_task, notify_queue, v, now)} end
return {'ok', v, ''}
