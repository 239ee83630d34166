-- Shared by every transition script (prepended by parking/scripts.py).
--
-- KEYS, the same for every script that changes a run (parking.keys.Keys.for_scripts),
-- named here once; scripts use the names, and add KEYS from 22 on (documented in their
-- header). User JSON (messages, payloads) is stored and returned as opaque strings: cjson
-- would round numbers and confuse empty arrays with objects.
local RUN, INTERRUPTS, ANSWERS, OPEN = KEYS[1], KEYS[2], KEYS[3], KEYS[4]  -- hash hash hash set
local CHECKPOINTS, EVENTS = KEYS[5], KEYS[6]                  -- hash, stream (capped)
local OUTBOX, OUTBOX_ENTRIES = KEYS[7], KEYS[8]               -- zset (due ms), hash (JSON)
local LEASES, DEADLINES = KEYS[9], KEYS[10]                   -- zsets (lease end, expiry ms)
local INDEX = {queued = KEYS[11], running = KEYS[12], interrupted = KEYS[13],  -- zsets of
               resuming = KEYS[14], completed = KEYS[15], failed = KEYS[16],  -- run ids by
               cancelled = KEYS[17]}                                          -- state
local NOTIFICATIONS, NOTIFY_DUE, STATS = KEYS[18], KEYS[19], KEYS[20]  -- hash, zset, hash
local REVIEW = KEYS[21]  -- hash: approvals, delegations, escalations (parking.keys)
-- What a finished run keeps until retention (the run's own keys).
local RUN_KEYS = {RUN, INTERRUPTS, ANSWERS, OPEN, CHECKPOINTS, EVENTS, NOTIFICATIONS, REVIEW}
-- The run's id, read off its key (`<prefix>:{<run id>}:run`): no call needed.
local ID = string.match(RUN, ':{([^}]*)}:run$')

local FINISHED = {completed = true, failed = true, cancelled = true}
local EVENTS_MAX = __EVENTS_MAX__
local OUTBOX_GRACE_MS = __OUTBOX_GRACE_MS__

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function run_id() return ID end

-- `old`: the status the caller read, when it read it (saves a call).
local function set_status(new, now, old)
  if old == nil then old = redis.call('HGET', RUN, 'status') end
  if old and INDEX[old] then redis.call('ZREM', INDEX[old], ID) end
  redis.call('ZADD', INDEX[new], now, ID)
  redis.call('HSET', RUN, 'status', new, 'updated_at', now)
end

local function event(kind, version, data, now)
  redis.call('XADD', EVENTS, 'MAXLEN', '~', EVENTS_MAX, '*',
             'type', kind, 'version', version, 'at', now, 'data', data or '{}')
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
  local pushed = push(kind, ID, version, note)
  if pushed and kind ~= 'notify' then return '' end
  local task = TASKS[kind]
  local args = note and {ID, note} or {ID, tonumber(version)}
  local entry = cjson.encode({id = entry_id, task = task.task, queue = task.queue,
                              args = args})
  redis.call('HSET', OUTBOX_ENTRIES, entry_id, entry)
  redis.call('ZADD', OUTBOX, now + (pushed and LOST_MESSAGE_MS or OUTBOX_GRACE_MS), entry_id)
  return pushed and '' or entry
end

-- A notification due now: its delivery pushed (due again only if the message was lost) and
-- true, or, with the broker elsewhere, false: the caller dispatches it, and the sweeper's
-- copy waits out the grace time.
local function deliver_now(nid, now)
  local pushed = push('deliver', ID, nil, nid)
  redis.call('ZADD', NOTIFY_DUE, now + (pushed and LOST_MESSAGE_MS or OUTBOX_GRACE_MS),
             ID .. ' ' .. nid)
  return pushed
end

local function bump(now)
  local v = redis.call('HINCRBY', RUN, 'version', 1)
  redis.call('HSET', RUN, 'updated_at', now, 'attempts', 0)
  return v
end

local function release_lease()
  redis.call('HDEL', RUN, 'lease_owner', 'lease_until')
  redis.call('ZREM', LEASES, ID)
end

-- The caller must hold the claim on `version` (see claim_run.lua).
local function check_claim(version, owner)
  local st = redis.call('HMGET', RUN, 'status', 'version', 'lease_owner')
  if not st[2] then return {'missing'} end
  if st[1] ~= 'running' or st[2] ~= version or st[3] ~= owner then
    return {'stale', st[1] or '', st[2] or '', st[3] or ''}
  end
  return nil
end

-- A step's commit: the claim released, the messages and the next version written at once
-- (the caller checked the claim, so the version is `version` + 1).
local function commit_step(version, messages, now, extra)
  local v = tonumber(version) + 1
  redis.call('HSET', RUN, 'messages', messages, 'version', v, 'updated_at', now,
             'attempts', 0, unpack(extra or {}))
  redis.call('HDEL', RUN, 'lease_owner', 'lease_until')
  redis.call('ZREM', LEASES, ID)
  redis.call('DEL', CHECKPOINTS)
  return v
end

local function close_open_interrupts()
  local id = run_id()
  for _, iid in ipairs(redis.call('SMEMBERS', OPEN)) do
    redis.call('ZREM', DEADLINES, id .. ' ' .. iid)
  end
  redis.call('DEL', OPEN)
end

-- Notifications not sent yet of closed interrupts (`closed`: a set of their ids; nil for
-- every interrupt), or only those to one `reviewer` (who handed the request on), are
-- skipped now, not when their time comes, so operators never see them as pending. One
-- pass over the run's notifications, however many interrupts closed.
local function skip_notifications(closed, reviewer)
  local raw = redis.call('HGETALL', NOTIFICATIONS)
  for i = 1, #raw, 2 do
    local rec = cjson.decode(raw[i + 1])
    if (rec.state == 'pending' or rec.state == 'retrying')
        and (closed == nil or closed[rec.interruptId])
        and (reviewer == nil or rec.reviewer == reviewer) then
      rec.state = 'skipped'
      redis.call('HSET', NOTIFICATIONS, raw[i], cjson.encode(rec))
      redis.call('ZREM', NOTIFY_DUE, run_id() .. ' ' .. raw[i])
    end
  end
end

-- `lease_held`: the caller knows the run holds a claim to release ('running'); nil: check.
local function finish(status, now, retention_s, old_status)
  skip_notifications(nil)
  set_status(status, now, old_status)
  release_lease()
  close_open_interrupts()
  redis.call('DEL', CHECKPOINTS)
  -- EXPIRE on a key that does not exist does nothing: no need to look first.
  for _, key in ipairs(RUN_KEYS) do redis.call('EXPIRE', key, retention_s) end
end

-- Counters read by /metrics (parking.keys documents the fields).
local function stat(field, by) redis.call('HINCRBY', STATS, field, by or 1) end

-- A notification out of attempts, for good: on its record and the run's events, and
-- counted for /metrics. The run stays parked (answers still come through other channels).
local function fail_notification(nid, rec, member, err, v, now)
  rec.state = 'failed'
  rec.lastError = err
  redis.call('HSET', NOTIFICATIONS, nid, cjson.encode(rec))
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

-- Record answers (each {interrupt id, answer JSON}, all checked to be open); resume if
-- none stays open. Returns the new version, the outbox entry ('' while it waits, or when
-- the resume was pushed) and whether the run resumes.
local function apply_answers(answers, now)
  local id = run_id()
  -- While a run is interrupted its updated_at is when it parked: answers are not changes
  -- of status.
  local parked_at = nil
  if redis.call('HGET', RUN, 'status') == 'interrupted' then
    parked_at = tonumber(redis.call('HGET', RUN, 'updated_at'))
  end
  local closed = {}
  for _, pair in ipairs(answers) do
    local ok, decoded = pcall(cjson.decode, pair[2])
    local channel = (ok and type(decoded) == 'table' and type(decoded.channel) == 'string'
                     and decoded.channel) or 'unknown'
    stat('answers:' .. channel)
    if parked_at then observe('answer', now - parked_at) end
    redis.call('SREM', OPEN, pair[1])
    redis.call('HSET', ANSWERS, pair[1], pair[2])
    redis.call('ZREM', DEADLINES, id .. ' ' .. pair[1])
    closed[pair[1]] = true
    event('interrupt.answered', redis.call('HGET', RUN, 'version'), pair[2], now)
  end
  skip_notifications(closed)
  if redis.call('SCARD', OPEN) == 0
      and redis.call('HGET', RUN, 'status') == 'interrupted' then
    local v = bump(now)
    set_status('resuming', now, 'interrupted')
    event('run.resuming', v, '{}', now)
    return v, enqueue('resume', v, now), true
  end
  return tonumber(redis.call('HGET', RUN, 'version')), '', false
end

-- Record the announcements planned for the run's open interrupts, from ARGV[base] on
-- (parking.store.plan_argv lays them out: counts n, g, d, then n triples notification id,
-- Notification JSON, when to send (ms; '' for now), g pairs grant JSON, its lifetime (ms),
-- d triples interrupt id, the reviewer away, Delegation JSON), the grants' keys from
-- KEYS[grant_key] on. A notification planned before (same id) is left as it is, so
-- planning again after a crash sends nothing twice; its grant is stored only with a new
-- notification; a hand-over is recorded once per reviewer and interrupt. Requests due now
-- are delivered (`deliver_now`). Returns the ids planned by this call, and those the
-- caller must dispatch itself (the broker elsewhere).
local function record_plan(base, grant_key, version, now)
  local n, g, d = tonumber(ARGV[base]), tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
  local first = base + 3
  local base_grants, base_handovers = first + 3 * n, first + 3 * n + 2 * g
  for k = 0, d - 1 do
    local iid, from, record = ARGV[base_handovers + 3 * k], ARGV[base_handovers + 3 * k + 1],
                              ARGV[base_handovers + 3 * k + 2]
    if redis.call('SISMEMBER', OPEN, iid) == 1
        and redis.call('HSETNX', REVIEW, 'delegated:' .. iid .. ':' .. from, record) == 1 then
      event('interrupt.delegated', version, record, now)
    end
  end
  local planned, dispatch = {}, {}
  for i = 0, n - 1 do
    local nid, raw, at = ARGV[first + 3 * i], ARGV[first + 3 * i + 1], ARGV[first + 3 * i + 2]
    if redis.call('HEXISTS', NOTIFICATIONS, nid) == 0 then
      local rec = cjson.decode(raw)
      rec.due = (at == '') and now or tonumber(at)
      rec.createdAt = now
      redis.call('HSET', NOTIFICATIONS, nid, cjson.encode(rec))
      if at ~= '' then
        redis.call('ZADD', NOTIFY_DUE, rec.due, ID .. ' ' .. nid)
      elseif not deliver_now(nid, now) then
        table.insert(dispatch, nid)
      end
      table.insert(planned, nid)
    end
  end
  if #planned > 0 then
    for j = 0, g - 1 do
      redis.call('SET', KEYS[grant_key + j], ARGV[base_grants + 2 * j], 'PX',
                 ARGV[base_grants + 2 * j + 1], 'NX')
    end
    event('notifications.planned', version, cjson.encode({ids = planned}), now)
  end
  return planned, dispatch
end
