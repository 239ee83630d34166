-- move_run: a run of a store of format 1 moving to the sharded layout (format 2), moved
-- out of the legacy layout into its shard of the sharded one, whole and at once: its own
-- keys (renamed: their lifetimes kept), its entry in the index of its state and its lease
-- (their scores kept), the deadlines of its interrupts, its notifications due and its
-- outbox entries (its steps', "<run>:<kind>:<version>", and its deliveries', the
-- notifications' ids). Its `sent` is dropped: the number its step's message took counts
-- in the legacy shard's queues, not in its new shard's, and a waiting run without one is
-- judged as one queued by a layby before 0.3.0 (`store.deadlines.gone_from_queue`). What no run
-- carries (idempotency keys, grants, counters) `layby migrate` moves (migration 2).
-- Every process moves a run so before anything else it does with it, once the store is
-- past its layout instant (`parking.formats`); `layby migrate` moves the rest.
-- The two layouts' keys are of many cluster slots: a store in the legacy layout is never on
-- a cluster. (The tests move runs back, the KEYS swapped, to make a store of 0.2.0.)
-- KEYS: 1-21 the run's keys in the layout it leaves, 22-42 in the one it goes to, each as
--   `Keys.for_scripts` lays them out (lua/_prelude.lua names them)
-- Arguments: none
-- Returns {'moved'} | {'there'} (it is in the layout it goes to) | {'missing'} (in neither)
local A = args({})
local PARTS = {run = 1, answers = 2, checkpoints = 3, events = 4, outbox = 5,
               entries = 6, leases = 7, deadlines = 8, due = 16, review = 18, retries = 21}
local SIDE = 21  -- KEYS of each side
local STATES = {9, 10, 11, 12, 13, 14, 15, 20}  -- the indexes, by state, of each side

local function side(base)
  local keys = {index = {}}
  for name, at in pairs(PARTS) do keys[name] = KEYS[base + at] end
  for i, at in ipairs(STATES) do keys.index[i] = KEYS[base + at] end
  return keys
end

local FROM, TO = side(0), side(SIDE)
if redis.call('EXISTS', FROM.run) == 0 then
  return {redis.call('EXISTS', TO.run) == 1 and 'there' or 'missing'}
end
-- The run's id, read off its key in either layout (as lua/_prelude.lua reads it).
local ID = string.match(FROM.run, ':{([^}]*)}:run$') or string.match(FROM.run, ':([^:{}]+):run$')

local function move(from, to, member)
  local score = redis.call('ZSCORE', from, member)
  if score then
    redis.call('ZREM', from, member)
    redis.call('ZADD', to, score, member)
  end
end

local function move_entry(entry_id)
  local entry = redis.call('HGET', FROM.entries, entry_id)
  if entry then
    redis.call('HDEL', FROM.entries, entry_id)
    redis.call('HSET', TO.entries, entry_id, entry)
  end
  move(FROM.outbox, TO.outbox, entry_id)
end

-- The ids of the run's fields named `prefix` .. id (its interrupts, its notifications).
local function ids_of(prefix)
  local ids, cursor = {}, '0'
  repeat
    local page = redis.call('HSCAN', FROM.run, cursor, 'MATCH', prefix .. '*', 'COUNT', 1000)
    cursor = page[1]
    for i = 1, #page[2], 2 do table.insert(ids, string.sub(page[2][i], #prefix + 1)) end
  until cursor == '0'
  return ids
end

for i = 1, #STATES do move(FROM.index[i], TO.index[i], ID) end
move(FROM.leases, TO.leases, ID)
move(FROM.retries, TO.retries, ID)
for _, iid in ipairs(ids_of('i:')) do move(FROM.deadlines, TO.deadlines, ID .. ' ' .. iid) end
for _, nid in ipairs(ids_of('n:')) do
  move(FROM.due, TO.due, ID .. ' ' .. nid)
  move_entry(nid)
end
local cursor = '0'
repeat
  local page = redis.call('HSCAN', FROM.entries, cursor, 'MATCH', ID .. ':*', 'COUNT', 1000)
  cursor = page[1]
  for i = 1, #page[2], 2 do move_entry(page[2][i]) end
until cursor == '0'
for _, part in ipairs({'run', 'answers', 'checkpoints', 'events', 'review'}) do
  if redis.call('EXISTS', FROM[part]) == 1 then redis.call('RENAME', FROM[part], TO[part]) end
end
redis.call('HDEL', TO.run, 'sent')
return {'moved'}
