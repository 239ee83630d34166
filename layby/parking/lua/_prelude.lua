-- Shared by every transition script (prepended by parking/scripts.py: each gets the
-- definitions it uses, `scripts.used_of`).
--
-- KEYS, the same for every script that changes a run (parking.keys.Keys.for_scripts),
-- named here once; scripts use the names, and add KEYS from EXTRA on (documented in their
-- header). Their arguments come by name (_args.lua). User JSON (messages, payloads) is
-- stored and returned as opaque strings: cjson would round numbers and confuse empty arrays
-- with objects.
local RUN, ANSWERS = KEYS[1], KEYS[2]                         -- hashes
local CHECKPOINTS, EVENTS = KEYS[3], KEYS[4]                  -- hash, stream (capped)
local OUTBOX, OUTBOX_ENTRIES = KEYS[5], KEYS[6]               -- zset (due ms), hash (JSON)
local LEASES, DEADLINES = KEYS[7], KEYS[8]                    -- zsets (lease end, expiry ms)
local SHARD_INDEX = {queued = KEYS[9], running = KEYS[10], interrupted = KEYS[11],  -- zsets
                     resuming = KEYS[12], completed = KEYS[13], failed = KEYS[14],  -- of run
                     cancelled = KEYS[15], retrying = KEYS[20]}                     -- ids by
                                                                                    -- state
local NOTIFY_DUE, STATS = KEYS[16], KEYS[17]                  -- zset, hash
local REVIEW = KEYS[18]  -- hash: approvals, delegations, escalations (parking.keys)
local QUEUES = KEYS[19]  -- hash: "<queue>:sent", "<queue>:taken" (parking.keys)
local RETRIES = KEYS[21]  -- zset: retrying runs by when their next try is due (ms)
local EXTRA = 22  -- the first of the KEYS a script adds (an idempotency key, grant keys)
-- A run of a tenant other than `default` is in its tenant's indexes instead of the shard's
-- own: `<shard base>:t:<tenant>:index:<state>`, in the run's slot (the shard's hash tag),
-- named here from the shard's (parking.keys `ShardKeys.of_tenant`). They are not among the
-- KEYS, which every caller would then have to read the run for first. INDEX[state] is the
-- run's own index of that state; RUN_TENANT its tenant (false: `default`), read once
-- (create_run gives it; a script whose first read of the run takes `tenant` sets it, as
-- HMGET gives it: false for `default`).
local RUN_TENANT = nil
local function run_tenant()
  if RUN_TENANT == nil then RUN_TENANT = redis.call('HGET', RUN, 'tenant') or false end
  return RUN_TENANT
end
local INDEX = setmetatable({}, {__index = function(_, state)
  local own = SHARD_INDEX[state]
  local tenant = own and run_tenant()
  if not tenant then return own end
  return (string.gsub(own, ':index:' .. state .. '$', ':t:' .. tenant .. ':index:' .. state))
end})
-- The shard's registry of its tenants (other than `default`).
local TENANTS = (string.gsub(SHARD_INDEX.queued, ':index:queued$', ':tenants'))
-- The shard's audit trail (a stream): who did what, written by the transition it records
-- (`entries`: JSON strings, layby.control.audit, each kept as it is), entries older than
-- the audit's retention trimmed as new ones come. Kept in the sharded layout only (a run of
-- the legacy one, of a store moving from layby 0.2.0, has none).
local AUDIT = (string.gsub(SHARD_INDEX.queued, ':index:queued$', ':audit'))
local AUDIT_KEEP_MS = __AUDIT_KEEP_MS__
local function audit(entries, now)
  if not string.find(SHARD_INDEX.queued, ':{', 1, true) then return end
  for _, entry in ipairs(entries or {}) do
    redis.call('XADD', AUDIT, 'MINID', '~', now - AUDIT_KEEP_MS, '*', 'e', entry)
  end
end
-- What a finished run keeps until retention (the run's own keys; `finish` drops the
-- checkpoints).
local RUN_KEYS = {RUN, ANSWERS, EVENTS, REVIEW}
-- The run's id, read off its key (`<prefix>:{<run id>}:run`, or in the sharded layout
-- `<prefix>:{<shard tag>}:<run id>:run`): no call needed.
local ID = string.match(RUN, ':{([^}]*)}:run$') or string.match(RUN, ':([^:{}]+):run$')

-- The reviewers' request index (`parking.store.inbox`): per name an interrupt asks (a
-- reviewer's id, a group's name, "*" for the default group; escalation levels' and
-- hand-overs' names too), the shard's waiting runs that ask it, `<shard base>:asks:<name>`
-- (zset, by when first asked). The run keeps the names it is under (its field `asks`, a JSON
-- array), so that leaving `interrupted` takes it out of each (`unask`). Kept in the sharded
-- layout only (a run still in the legacy one, of a store moving from layby 0.2.0, is put in
-- it by migration 2: parking.migrations.asks).
local ASKS = (string.gsub(SHARD_INDEX.queued, ':index:queued$', ':asks:'))
local ASKS_KEPT = string.find(SHARD_INDEX.queued, ':{', 1, true) ~= nil
local function ask(names, now)
  if #names == 0 or not ASKS_KEPT then return end
  local kept = redis.call('HGET', RUN, 'asks')
  local all, seen = kept and cjson.decode(kept) or {}, {}
  for _, name in ipairs(all) do seen[name] = true end
  for _, name in ipairs(names) do
    if not seen[name] then
      seen[name] = true
      table.insert(all, name)
      redis.call('ZADD', ASKS .. name, 'NX', now, ID)
    end
  end
  redis.call('HSET', RUN, 'asks', cjson.encode(all))
end
local function unask()
  local kept = redis.call('HGET', RUN, 'asks')
  if not kept then return end
  for _, name in ipairs(cjson.decode(kept)) do redis.call('ZREM', ASKS .. name, ID) end
  redis.call('HDEL', RUN, 'asks')
end
-- A hand-over's reviewer, asked from now on (`record`: Delegation JSON).
local function ask_handed(record, now) ask({cjson.decode(record).to}, now) end

local FINISHED = {completed = true, failed = true, cancelled = true}
local EVENTS_MAX = __EVENTS_MAX__
local OUTBOX_GRACE_MS = __OUTBOX_GRACE_MS__

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function run_id() return ID end

-- A run's interrupts and notifications are fields of its hash, 'i:<interrupt id>' and
-- 'n:<notification id>': as keys of their own they cost more than they hold, for as long
-- as the run waits. (The scripts' headers name them "interrupts" and "notifications".)
local INTERRUPT, NOTE = 'i:', 'n:'

local function note_of(nid) return redis.call('HGET', RUN, NOTE .. nid) end

local function save_note(nid, rec)
  redis.call('HSET', RUN, NOTE .. nid, encode_note(rec))
end

-- The run's notifications: their ids in order, and id → record JSON. (Scanned for, not
-- HGETALL: the run's history is in the same hash, and may be long.)
local function notes_of_run()
  local ids, found = {}, {}
  local cursor = '0'
  repeat
    local page = redis.call('HSCAN', RUN, cursor, 'MATCH', NOTE .. '*', 'COUNT', 1000)
    cursor = page[1]
    for i = 1, #page[2], 2 do
      local nid = string.sub(page[2][i], 3)
      if not found[nid] then table.insert(ids, nid) end
      found[nid] = page[2][i + 1]
    end
  until cursor == '0'
  return ids, found
end

local function has_interrupt(iid)
  return redis.call('HEXISTS', RUN, INTERRUPT .. iid) == 1
end

-- The Interrupt JSON of each of `ids` ('' for one not found), in order.
local function interrupts_of(ids)
  local names = {}
  for i, iid in ipairs(ids) do names[i] = INTERRUPT .. iid end
  local found = redis.call('HMGET', RUN, unpack(names))
  for i = 1, #ids do found[i] = found[i] or '' end
  return found
end

-- `old`: the status the caller read, when it read it (saves a call).
local function set_status(new, now, old)
  if old == nil then old = redis.call('HGET', RUN, 'status') end
  if old and INDEX[old] then redis.call('ZREM', INDEX[old], ID) end
  redis.call('ZADD', INDEX[new], now, ID)
  redis.call('HSET', RUN, 'status', new, 'updated_at', now)
end

-- Appends to the run's events; returns the new entry's id (LAST_EVENT keeps the latest,
-- which transitions return so their caller can follow the stream from after them). When it
-- happened is the id's time, the server's clock as this script runs (`now` too): not
-- written again in each entry, which a parked run would hold for as long as it waits.
-- `messages` (a step's event: the messages it added, a JSON array; '' or nil: none) is a
-- field of its own beside `data`, so that a park drops it without looking into the data
-- (park_run.lua); readers give it back inside the data (parking.events).
local LAST_EVENT = ''
local function event(kind, version, data, now, messages)
  if messages and messages ~= '' then
    LAST_EVENT = redis.call('XADD', EVENTS, 'MAXLEN', '~', EVENTS_MAX, '*', 'type', kind,
                            'version', version, 'data', data or '{}', 'messages', messages)
  else
    LAST_EVENT = redis.call('XADD', EVENTS, 'MAXLEN', '~', EVENTS_MAX, '*',
                            'type', kind, 'version', version, 'data', data or '{}')
  end
  return LAST_EVENT
end

-- Queue the task of `kind` (turn, resume, notify: args run id and version; deliver: run id
-- and the notification id `note`). With the broker on this server the message goes on its
-- queue now, in this script (`_queue.lua`), and '' is returned. Otherwise it goes to the
-- outbox: the entry is returned as JSON for the caller, which publishes it and acks it,
-- and the sweeper publishes what stays past the grace time. A notify task acks its entry
-- itself once it planned (so one that fails is sent again): pushed, its entry waits as
-- long as a lost message would.
local function enqueue(kind, version, now, note)
  local entry_id = note or (ID .. ':' .. kind .. ':' .. version)
  -- The agent is shown in Flower beside the ids. A pinned run's steps go to the queue of
  -- the version it started on, read by the workers that host it.
  local run = redis.call('HMGET', RUN, 'agent', 'pinned', 'agent_version', 'trace')
  local agent = run[1]
  local suffix = (run[2] == '1' and (kind == 'turn' or kind == 'resume'))
                 and ('@' .. run[3]) or ''
  local task = TASKS[kind]
  if kind == 'turn' or kind == 'resume' then
    -- The step's message takes the next number of its queue: once a claim took a later
    -- one, or the queue is empty, it is no longer there (the sweeper's lost-message check);
    -- before, it waits its turn, however long the queue.
    local queue = task.queue .. suffix
    local n = redis.call('HINCRBY', QUEUES, queue .. ':sent', 1)
    redis.call('HSET', RUN, 'sent', queue .. ' ' .. n)
  end
  local trace = run[4] or nil
  local pushed = push(kind, ID, version, note, now, agent, suffix, trace)
  if pushed and kind ~= 'notify' then return '' end
  local args = note and {ID, note} or {ID, tonumber(version)}
  local entry = cjson.encode({id = entry_id, task = task.task, queue = task.queue .. suffix,
                              args = args, agent = agent or nil, trace = trace})
  redis.call('HSET', OUTBOX_ENTRIES, entry_id, entry)
  redis.call('ZADD', OUTBOX, now + (pushed and LOST_MESSAGE_MS or OUTBOX_GRACE_MS), entry_id)
  return pushed and '' or entry
end

-- The update of the run's Slack messages after a change to its interrupts `ids` (a
-- non-empty array; `approval`: an approval of a quorum was counted), when the caller wants
-- it (`wanted`, '1': Slack is configured) and the store knows the task: an outbox entry in
-- the transition's own step, so that a caller that dies after the commit loses no update
-- (the sweeper publishes it after the grace time). Never pushed here, whoever the broker
-- is: its arguments are no message made ahead. Returns the entry, or ''.
local function slack_update(wanted, ids, approval, now)
  local task = TASKS['slack']
  if wanted ~= '1' or not task or #ids == 0 then return '' end
  local entry_id = ID .. ':slack:' .. (LAST_EVENT ~= '' and LAST_EVENT or now)
  local entry = cjson.encode({id = entry_id, task = task.task, queue = task.queue,
                              args = {ID, ids, approval},
                              agent = redis.call('HGET', RUN, 'agent') or nil})
  redis.call('HSET', OUTBOX_ENTRIES, entry_id, entry)
  redis.call('ZADD', OUTBOX, now + OUTBOX_GRACE_MS, entry_id)
  return entry
end

-- A notification due now: its delivery pushed (due again only if the message was lost) and
-- true, or, with the broker elsewhere, false: the caller dispatches it, and the sweeper's
-- copy waits out the grace time.
local function deliver_now(nid, now)
  local run = redis.call('HMGET', RUN, 'agent', 'trace')
  local pushed = push('deliver', ID, nil, nid, now, run[1], nil, run[2] or nil)
  redis.call('ZADD', NOTIFY_DUE, now + (pushed and LOST_MESSAGE_MS or OUTBOX_GRACE_MS),
             ID .. ' ' .. nid)
  return pushed
end

-- (`sent` too: a run that holds or held a claim has no message waiting in a queue.)
local function release_lease()
  redis.call('HDEL', RUN, 'lease_owner', 'lease_until', 'sent')
  redis.call('ZREM', LEASES, ID)
end

-- The run's open interrupts are its field `open` (ids, space-separated). Returns the ids
-- in order, and a set.
local function parse_open(raw)
  local ids, set = {}, {}
  for iid in string.gmatch(raw or '', '%S+') do
    table.insert(ids, iid)
    set[iid] = true
  end
  return ids, set
end

local function read_open() return parse_open(redis.call('HGET', RUN, 'open')) end

-- `ids` as the run's `open` field (to HSET).
local function open_field(ids) return table.concat(ids, ' ') end

local function without(ids, gone)
  local kept = {}
  for _, iid in ipairs(ids) do if not gone[iid] then table.insert(kept, iid) end end
  return kept
end

-- The caller must hold the claim on `version` (see claim_run.lua). Returns nil and the run
-- as the commit needs it ({status, version, owner, checkpointed, open, noted}) when it does.
local function check_claim(version, owner)
  local st = redis.call('HMGET', RUN, 'status', 'version', 'lease_owner', 'checkpointed',
                        'open', 'noted', 'retry_at', 'tenant')
  if not st[2] then return {'missing'} end
  RUN_TENANT = st[8]
  if st[1] ~= 'running' or st[2] ~= version or st[3] ~= owner then
    return {'stale', st[1] or '', st[2] or '', st[3] or ''}
  end
  return nil, {checkpointed = st[4] == '1', open = st[5], noted = st[6],
               retried = (st[7] or '') ~= ''}
end

-- A step that waited to try failed tool calls again commits: what it waited for is over.
local function forget_retry(run)
  if run.retried then redis.call('HDEL', RUN, 'retry', 'retry_at') end
end

-- Tools whose calls ran out of attempts in the step being committed (`exhausted`: their
-- names, a decoded JSON array), counted for /metrics.
local function count_exhausted(exhausted)
  for _, name in ipairs(exhausted or {}) do
    redis.call('HINCRBY', STATS, 'tool_retries_exhausted:' .. name, 1)
  end
end

-- A step's commit: the claim released, the messages and the next version written at once
-- (the caller checked the claim, so the version is `version` + 1), with `extra` fields.
-- `run`: as check_claim read it (its checkpoints, to drop now; a retry's wait, forgotten). `parks`: the run now waits,
-- maybe for days: its claim's fields (and `checkpointed`, and `sent`, its last message's
-- number) are deleted rather than emptied (readers take them as absent either way), for
-- bytes it would hold all that time (`sent` took the bench's parked hash from 896 bytes to
-- the allocator's next size, 1,024).
local function commit_step(version, messages, now, run, extra, parks)
  local checkpointed = run.checkpointed
  forget_retry(run)
  local v = tonumber(version) + 1
  -- `waiting` is a park's: any other commit leaves nothing to wait on (a park's own
  -- value, in `extra`, wins; a park that leaves it out waits on its open interrupts).
  if parks then
    redis.call('HDEL', RUN, 'attempts', 'lease_owner', 'lease_until', 'checkpointed',
               'waiting', 'noted', 'sent')
    redis.call('HSET', RUN, 'messages', messages, 'version', v, 'updated_at', now,
               unpack(extra or {}))
  else
    redis.call('HSET', RUN, 'messages', messages, 'version', v, 'updated_at', now,
               'attempts', 0, 'lease_owner', '', 'lease_until', 0, 'checkpointed', '',
               'waiting', '', unpack(extra or {}))
  end
  redis.call('ZREM', LEASES, ID)
  if checkpointed then redis.call('DEL', CHECKPOINTS) end
  return v
end

local function drop_deadlines(ids)
  for _, iid in ipairs(ids) do redis.call('ZREM', DEADLINES, ID .. ' ' .. iid) end
end

-- Notifications not sent yet of closed interrupts (`closed`: a set of their ids; nil for
-- every interrupt), or only those to one `reviewer` (who handed the request on), are
-- skipped now, not when their time comes, so operators never see them as pending. One
-- pass over the run's notifications, however many interrupts closed. `noted`: the run's
-- field, '0' while it has none (absent once it has some: look).
local function skip_notifications(closed, reviewer, noted)
  if noted == '0' then return end
  local ids, found = notes_of_run()
  for _, nid in ipairs(ids) do
    local rec = decode_note(found[nid])
    if (rec.state == 'pending' or rec.state == 'retrying')
        and (closed == nil or closed[rec.interruptId])
        and (reviewer == nil or rec.reviewer == reviewer) then
      rec.state = 'skipped'
      save_note(nid, rec)
      redis.call('ZREM', NOTIFY_DUE, ID .. ' ' .. nid)
    end
  end
end

-- The end of a run, in two parts around the caller's write of the run: `ending` drops what
-- waits (deadlines, notifications not sent, the open interrupts) and returns the run's
-- fields to write; `count_down` moves it in the index and starts its keys' retention.
-- `run`: {open, noted} as read.
local function ending(status, now, run)
  skip_notifications(nil, nil, run.noted)
  drop_deadlines(parse_open(run.open))
  unask()
  return {'status', status, 'updated_at', now, 'open', open_field({})}
end

-- Counters read by /metrics (parking.keys documents the fields).
local function stat(field, by) redis.call('HINCRBY', STATS, field, by or 1) end

-- A failed run, counted by its error's code (layby's own codes: a short fixed set).
local function count_failure(error_json)
  local ok, err = pcall(cjson.decode, error_json)
  local code = ok and type(err) == 'table' and type(err.code) == 'string' and err.code
  stat('failed:' .. (code or 'unknown'))
end

local function count_down(status, old_status, now, retention_s)
  stat('finished:' .. status)
  if old_status and INDEX[old_status] then redis.call('ZREM', INDEX[old_status], ID) end
  redis.call('ZADD', INDEX[status], now, ID)
  -- EXPIRE on a key that does not exist does nothing: no need to look first.
  for _, key in ipairs(RUN_KEYS) do redis.call('EXPIRE', key, retention_s) end
end

-- The end of a run that holds no claim of the caller's (fail, cancel, expire): its claim,
-- if any, released and its checkpoints dropped too. `run`: {open, noted} as read.
local function finish(status, now, retention_s, old_status, run, extra)
  local fields = ending(status, now, run)
  for _, x in ipairs(extra or {}) do table.insert(fields, x) end
  redis.call('HSET', RUN, unpack(fields))
  release_lease()
  redis.call('DEL', CHECKPOINTS)
  -- A run that waited to try a tool call again waits no more.
  if redis.call('ZREM', RETRIES, ID) == 1 then redis.call('HDEL', RUN, 'retry', 'retry_at') end
  count_down(status, old_status, now, retention_s)
end


-- A notification out of attempts, for good: on its record and the run's events, and
-- counted for /metrics. The run stays parked (answers still come through other channels).
local function fail_notification(nid, rec, member, err, v, now)
  rec.state = 'failed'
  rec.lastError = err
  save_note(nid, rec)
  redis.call('ZREM', NOTIFY_DUE, member)
  stat('notifications_failed')
  event('notification.failed', v, cjson.encode({id = nid, interruptId = rec.interruptId,
        reviewer = rec.reviewer, channel = rec.channel, kind = rec.kind,
        attempts = rec.attempts, error = err}), now)
end

-- A latency for a Prometheus histogram: its sum and count, and one count in the first
-- bucket (upper bounds in seconds) that holds it; /metrics makes the buckets cumulative.
local LATENCY_BUCKETS_S = __LATENCY_BUCKETS_S__  -- parking.scripts.LATENCY_BUCKETS_S
local function observe(what, ms)
  ms = math.max(0, ms)
  stat(what .. '_latency_ms_sum', ms)
  stat(what .. '_latency_count')
  for _, bound in ipairs(LATENCY_BUCKETS_S[what]) do
    if ms <= bound * 1000 then
      stat(what .. '_latency_le:' .. bound)
      return
    end
  end
end

-- Record answers (each {interrupt id, answer JSON, true when it may have a deadline}, all
-- checked to be open); resume if none stays open. `run`: the run's status, version,
-- updated_at, open, noted and waiting fields as the caller read them; `trace`: the trace
-- context of who answered (a traceparent; '' or nil: none). Returns the new version, the
-- outbox entry ('' while it waits, or when the resume was pushed) and whether the run
-- resumes.
local function apply_answers(answers, now, run, trace)
  local status, version, updated_at, open_raw = run[1], run[2], run[3], run[4]
  -- While a run is interrupted its updated_at is when it parked: answers are not changes
  -- of status.
  local parked_at = status == 'interrupted' and tonumber(updated_at) or nil
  local closed = {}
  for _, answer in ipairs(answers) do
    local iid, text, deadline = answer[1], answer[2], answer[3]
    local ok, decoded = pcall(cjson.decode, text)
    local channel = (ok and type(decoded) == 'table' and type(decoded.channel) == 'string'
                     and decoded.channel) or 'unknown'
    stat('answers:' .. channel)
    if parked_at then observe('answer', now - parked_at) end
    redis.call('HSET', ANSWERS, iid, text)
    if deadline then redis.call('ZREM', DEADLINES, ID .. ' ' .. iid) end
    closed[iid] = true
    event('interrupt.answered', version, text, now)
  end
  skip_notifications(closed, nil, run[5])
  local before = parse_open(open_raw)
  local open = without(before, closed)
  local field = open_field(open)
  -- A park that waited on its open interrupts alone left `waiting` out (park_run.lua):
  -- written now, before the first answer changes `open`, for the resume to read.
  local waiting = (status == 'interrupted' and not run[6])
                  and {'waiting', table.concat(before, ' ')} or {}
  if #open == 0 and status == 'interrupted' then
    local v = tonumber(version) + 1
    redis.call('HSET', RUN, 'open', field, 'version', v, 'status', 'resuming',
               'updated_at', now, 'attempts', 0, unpack(waiting))
    unask()
    -- The resume and the steps after it continue the answer's trace; the one they parked
    -- in stays in `trace_was`, for the resumed step's link back to it.
    if trace and trace ~= '' then
      redis.call('HSET', RUN, 'trace_was', redis.call('HGET', RUN, 'trace') or '',
                 'trace', trace)
    end
    redis.call('ZREM', INDEX.interrupted, ID)
    redis.call('ZADD', INDEX.resuming, now, ID)
    event('run.resuming', v, '{}', now)
    return v, enqueue('resume', v, now), true
  end
  redis.call('HSET', RUN, 'open', field, unpack(waiting))
  return tonumber(version), '', false
end

-- Record `plan`, the announcements planned for the run's open interrupts (one argument of
-- the script, decoded; `parking.store.outbox:plan_args` makes it): {notes: each {id,
-- record: Notification JSON (a string), at: when to send (ms; left out for now)}, grants: each
-- {grant: Grant.stored (a string), ttl_ms: its lifetime}, handovers: each {interrupt_id,
-- reviewer: the one away, record: Delegation JSON (a string)}}, the grants' keys from
-- KEYS[grant_key] on, in the order of `grants`. A notification planned before (same id) is
-- left as it is, so planning again after a crash sends nothing twice; its grant is stored
-- only with a new notification; a hand-over is recorded once per reviewer and interrupt.
-- Requests due now are delivered (`deliver_now`). `open`: the set of open interrupt ids;
-- `mark`: drop the run's `noted` field ('0') when something was planned (the park does it
-- itself). Returns the ids planned by this call, and those the caller must dispatch itself
-- (the broker elsewhere).
local function record_plan(plan, grant_key, version, now, open, mark)
  for _, handover in ipairs(plan.handovers) do
    local iid, from, record = handover.interrupt_id, handover.reviewer, handover.record
    if open[iid]
        and redis.call('HSETNX', REVIEW, 'delegated:' .. iid .. ':' .. from, record) == 1 then
      event('interrupt.delegated', version, record, now)
      ask_handed(record, now)
    end
  end
  local planned, dispatch = {}, {}
  for _, note in ipairs(plan.notes) do
    local nid, at = note.id, note.at
    local rec = cjson.decode(note.record)
    rec.due = at or now
    rec.createdAt = now
    -- Written only if new (one call for the check and the write).
    local new = redis.call('HSETNX', RUN, NOTE .. nid, encode_note(rec)) == 1
    if new then
      if at then
        redis.call('ZADD', NOTIFY_DUE, rec.due, ID .. ' ' .. nid)
      elseif not deliver_now(nid, now) then
        table.insert(dispatch, nid)
      end
      table.insert(planned, nid)
    end
  end
  if #planned > 0 then
    if mark then redis.call('HDEL', RUN, 'noted') end
    for j, grant in ipairs(plan.grants) do
      redis.call('SET', KEYS[grant_key + j - 1], grant.grant, 'PX', grant.ttl_ms, 'NX')
    end
    event('notifications.planned', version, cjson.encode({ids = planned}), now)
  end
  return planned, dispatch
end
