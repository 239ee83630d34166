-- Shared by every transition script (prepended by parking/scripts.py).
--
-- KEYS, the same for every script that changes a run (parking.keys.Keys.for_scripts):
--   1 run (hash)        2 interrupts (hash)   3 answers (hash)     4 open (set)
--   5 checkpoints (hash) 6 events (stream)    7 outbox (zset)      8 outbox:entries (hash)
--   9 leases (zset)     10 deadlines (zset)  11..17 index:<status> (zset), in the order
--   queued running interrupted resuming completed failed cancelled
--  18 notifications (hash)   19 notify:due (zset)   20 stats (hash: counters for /metrics)
-- Scripts may add KEYS from 21 on; they document those and their ARGV in their header.
-- User JSON (messages, payloads) is stored and returned as opaque strings: cjson would
-- round numbers and confuse empty arrays with objects.

local INDEX = {queued = 11, running = 12, interrupted = 13, resuming = 14,
               completed = 15, failed = 16, cancelled = 17}
local FINISHED = {completed = true, failed = true, cancelled = true}
local EVENTS_MAX = __EVENTS_MAX__
local OUTBOX_GRACE_MS = __OUTBOX_GRACE_MS__

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function run_id() return redis.call('HGET', KEYS[1], 'id') end

local function set_status(new, now)
  local old = redis.call('HGET', KEYS[1], 'status')
  local id = run_id()
  if old and INDEX[old] then redis.call('ZREM', KEYS[INDEX[old]], id) end
  redis.call('ZADD', KEYS[INDEX[new]], now, id)
  redis.call('HSET', KEYS[1], 'status', new, 'updated_at', now)
end

local function event(kind, version, data, now)
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', EVENTS_MAX, '*',
             'type', kind, 'version', version, 'at', now, 'data', data or '{}')
end

-- Queue a task to publish after this script; returns the entry as JSON for the caller,
-- which publishes it and acks it. The sweeper republishes what stays past the grace time.
local function outbox(kind, task, queue, version, now)
  local id = run_id()
  local entry_id = id .. ':' .. kind .. ':' .. version
  local entry = cjson.encode({id = entry_id, task = task, queue = queue,
                              args = {id, tonumber(version)}})
  redis.call('HSET', KEYS[8], entry_id, entry)
  redis.call('ZADD', KEYS[7], now + OUTBOX_GRACE_MS, entry_id)
  return entry
end

local function bump(now)
  local v = redis.call('HINCRBY', KEYS[1], 'version', 1)
  redis.call('HSET', KEYS[1], 'updated_at', now, 'attempts', 0)
  return v
end

local function release_lease()
  redis.call('HDEL', KEYS[1], 'lease_owner', 'lease_until')
  redis.call('ZREM', KEYS[9], run_id())
end

-- The caller must hold the claim on `version` (see claim_run.lua).
local function check_claim(version, owner)
  if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
  local st = redis.call('HMGET', KEYS[1], 'status', 'version', 'lease_owner')
  if st[1] ~= 'running' or st[2] ~= version or st[3] ~= owner then
    return {'stale', st[1] or '', st[2] or '', st[3] or ''}
  end
  return nil
end

local function close_open_interrupts()
  local id = run_id()
  for _, iid in ipairs(redis.call('SMEMBERS', KEYS[4])) do
    redis.call('ZREM', KEYS[10], id .. ' ' .. iid)
  end
  redis.call('DEL', KEYS[4])
end

-- Notifications not sent yet of closed interrupts (`closed`: a set of their ids; nil for
-- every interrupt) are skipped now, not when their time comes, so operators never see them
-- as pending. One pass over the run's notifications, however many interrupts closed.
local function skip_notifications(closed)
  local raw = redis.call('HGETALL', KEYS[18])
  for i = 1, #raw, 2 do
    local rec = cjson.decode(raw[i + 1])
    if (rec.state == 'pending' or rec.state == 'retrying')
        and (closed == nil or closed[rec.interruptId]) then
      rec.state = 'skipped'
      redis.call('HSET', KEYS[18], raw[i], cjson.encode(rec))
      redis.call('ZREM', KEYS[19], run_id() .. ' ' .. raw[i])
    end
  end
end

local function finish(status, now, retention_s)
  skip_notifications(nil)
  set_status(status, now)
  release_lease()
  close_open_interrupts()
  redis.call('DEL', KEYS[5])
  for _, i in ipairs({1, 2, 3, 4, 5, 6, 18}) do
    if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('EXPIRE', KEYS[i], retention_s) end
  end
end

-- Counters read by /metrics (parking.keys documents the fields).
local function stat(field, by) redis.call('HINCRBY', KEYS[20], field, by or 1) end

-- A notification out of attempts, for good: on its record and the run's events, and
-- counted for /metrics. The run stays parked (answers still come through other channels).
local function fail_notification(nid, rec, member, err, v, now)
  rec.state = 'failed'
  rec.lastError = err
  redis.call('HSET', KEYS[18], nid, cjson.encode(rec))
  redis.call('ZREM', KEYS[19], member)
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
-- none stays open. Returns the new version and the outbox entry ('' while it waits).
local function apply_answers(answers, resume_task, queue, now)
  local id = run_id()
  -- While a run is interrupted its updated_at is when it parked: answers are not changes
  -- of status.
  local parked_at = nil
  if redis.call('HGET', KEYS[1], 'status') == 'interrupted' then
    parked_at = tonumber(redis.call('HGET', KEYS[1], 'updated_at'))
  end
  local closed = {}
  for _, pair in ipairs(answers) do
    local ok, decoded = pcall(cjson.decode, pair[2])
    local channel = (ok and type(decoded) == 'table' and type(decoded.channel) == 'string'
                     and decoded.channel) or 'unknown'
    stat('answers:' .. channel)
    if parked_at then observe('answer', now - parked_at) end
    redis.call('SREM', KEYS[4], pair[1])
    redis.call('HSET', KEYS[3], pair[1], pair[2])
    redis.call('ZREM', KEYS[10], id .. ' ' .. pair[1])
    closed[pair[1]] = true
    event('interrupt.answered', redis.call('HGET', KEYS[1], 'version'), pair[2], now)
  end
  skip_notifications(closed)
  if redis.call('SCARD', KEYS[4]) == 0
      and redis.call('HGET', KEYS[1], 'status') == 'interrupted' then
    local v = bump(now)
    set_status('resuming', now)
    event('run.resuming', v, '{}', now)
    return v, outbox('resume', resume_task, queue, v, now)
  end
  return tonumber(redis.call('HGET', KEYS[1], 'version')), ''
end
