-- park_run: running → interrupted, its interrupts announced in the same step (or straight
-- to resuming when background jobs or policy rules already answered every new interrupt
-- before this commit).
-- Reads run, answers. Writes run (messages, version, status, waiting, its interrupts; the
-- lease's fields deleted), checkpoints, answers (rules' answers), open, deadlines, leases,
-- index, events, stats, notifications, notify:due, grant keys, review (hand-overs), the
-- reviewers' request index; queues the resume, or the deliveries of the requests due now
-- (or, when the caller could not plan them, the announcement task).
-- KEYS from EXTRA: the plan's grant keys.
-- Arguments: version, owner, messages (JSON), event (its data, JSON, without messages:
--   readers take them from the history), announce ('1' to queue the announcement task,
--   layby.notify.interrupts, instead of a plan), interrupts (JSON, each {id, record:
--   Interrupt JSON as stored (a string), expires: ms (left out when it does not), auto:
--   the answer a policy rule gives (Answer JSON, a string; left out, or '', when none),
--   rule: that rule's name, asks: the names it asks, for the reviewers' request index}),
--   plan (JSON, as record_plan reads it), exhausted (JSON: the
--   tools whose calls ran out of attempts), audit (JSON: the audit entries of the answers
--   policy rules give, strings)
-- Returns {'ok', new version, outbox entry or '', {notifications planned},
--          {notifications the caller must dispatch}, '1' if it resumes at once}
--       | {'stale', …} | {'missing'}
local A = args({'version', 'owner', 'messages', 'event', 'announce'}, {'interrupts', 'plan', 'exhausted', 'audit'})
-- The events of a parked run, made as small as they can be, for however long it waits:
-- copied into an exact fit (the first entry of a stream reserves room for many more, 4 KB
-- with the defaults), and without the messages its steps' events carried, the field
-- `messages` of their entries (the run's history holds them; readers fill them in from
-- there, by the event's `from` and `historyTo`: parking.events).
local function compact_events()
  local entries = redis.call('XRANGE', EVENTS, '-', '+')
  local cut = false
  for _, entry in ipairs(entries) do
    local kept = {}
    for i = 1, #entry[2], 2 do
      if entry[2][i] == 'messages' then
        cut = true
      else
        table.insert(kept, entry[2][i])
        table.insert(kept, entry[2][i + 1])
      end
    end
    entry[2] = kept
  end
  local spare = EVENTS .. ':compact'
  if cut then
    -- A script is not undone by an error half way: nothing may be in the way of the XADDs.
    redis.call('DEL', spare)
    for _, entry in ipairs(entries) do redis.call('XADD', spare, entry[1], unpack(entry[2])) end
    redis.call('COPY', spare, EVENTS, 'REPLACE')
    redis.call('DEL', spare)
  elseif redis.call('COPY', EVENTS, spare, 'REPLACE') == 1 then
    redis.call('RENAME', spare, EVENTS)
  end
end

local version, owner, messages, event_data = A.version, A.owner, A.messages, A.event
local announce, interrupts = A.announce, A.interrupts
local refused, run = check_claim(version, owner)
if refused then return refused end
count_exhausted(A.exhausted)
local open_raw = run.open
-- Whether the run has notifications from now on.
local noted = (run.noted ~= '0' or #A.plan.notes > 0) and '1' or '0'
local now = now_ms()
-- The interrupts are written with the commit, in its HSET (fields 'i:<id>' of the run).
local waiting, specs, asked = {}, {}, {}
for _, intr in ipairs(interrupts) do
  table.insert(waiting, intr.id)
  table.insert(specs, INTERRUPT .. intr.id)
  table.insert(specs, intr.record)
end
-- Answers given before the park (background jobs that finished first) stand.
local early = #interrupts > 0 and redis.call('HMGET', ANSWERS, unpack(waiting)) or {}
local open, open_set = parse_open(open_raw)
local by_rule, rule_answers = {}, {}
for i, intr in ipairs(interrupts) do
  local iid, expiry = intr.id, intr.expires
  local auto, rule = intr.auto or '', intr.rule or ''
  if not early[i] then
    if auto ~= '' then
      -- Answered by rule, in the park itself: nobody is asked, nothing can answer it twice.
      table.insert(rule_answers, iid)
      table.insert(rule_answers, auto)
      table.insert(by_rule, {auto, rule})
    elseif not open_set[iid] then
      table.insert(open, iid)
      open_set[iid] = true
      for _, name in ipairs(intr.asks or {}) do table.insert(asked, name) end
      if expiry then redis.call('ZADD', DEADLINES, expiry, ID .. ' ' .. iid) end
    end
  end
end
if #rule_answers > 0 then redis.call('HSET', ANSWERS, unpack(rule_answers)) end
local resumes = #open == 0
local open_now, waited = open_field(open), table.concat(waiting, ' ')
local fields = {'open', open_now, 'status', resumes and 'resuming' or 'interrupted'}
-- A parked run with notifications leaves `noted` out (commit_step deletes it): readers
-- take a missing one as "look".
if noted == '0' or resumes then
  table.insert(fields, 'noted')
  table.insert(fields, noted)
end
-- `waiting` only when it says more than `open` (an answer writes it before changing that).
if waited ~= open_now then
  table.insert(fields, 'waiting')
  table.insert(fields, waited)
end
for _, x in ipairs(specs) do table.insert(fields, x) end
local v = commit_step(version, messages, now, run, fields, not resumes)
if resumes then v = v + 1 end
redis.call('ZREM', INDEX.running, ID)
event('run.interrupted', resumes and v - 1 or v, event_data, now)
audit(A.audit, now)
for _, pair in ipairs(by_rule) do
  stat('answers:policy')
  stat('auto_answers:' .. pair[2])
  event('interrupt.auto_answered', resumes and v - 1 or v, pair[1], now)
end
if resumes then
  -- Everything was answered already: on to the resume (a version of its own, as an answer
  -- closing the last open interrupt makes).
  redis.call('HSET', RUN, 'version', v)
  redis.call('ZADD', INDEX.resuming, now, ID)
  event('run.resuming', v, '{}', now)
  return {'ok', v, enqueue('resume', v, now), {}, {}, '1'}
end
redis.call('ZADD', INDEX.interrupted, now, ID)
ask(asked, now)
if announce == '1' then return {'ok', v, enqueue('notify', v, now), {}, {}} end
local planned, dispatch = record_plan(A.plan, EXTRA, v, now, open_set, false)
compact_events()
return {'ok', v, '', planned, dispatch}
