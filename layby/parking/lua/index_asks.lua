-- index_asks: a run parked in the legacy layout, put in the reviewers' request index once
-- moved (`layby migrate`, migration 2: parking.migrations.asks): under each name its open
-- interrupts ask, as park_run puts a run parked in the sharded layout (the prelude's `ask`).
-- Idempotent: names it is under already stay, and a run that no longer waits is left out
-- (its leaving took it out of the index).
-- KEYS: 1 the run's hash, 2… the index of each name (`<p>:{<shard>}:asks:<name>`), in the
--   order of `names`
-- Arguments: names (JSON array, the names its open interrupts ask: parking.store.inbox
--   names_asked, and whom they were handed to)
-- Returns 'indexed' | 'none' (it does not wait, or is under every name already)
local A = args({}, {'names'})
local run = redis.call('HMGET', KEYS[1], 'status', 'asks', 'updated_at')
if run[1] ~= 'interrupted' then return 'none' end
local id = string.match(KEYS[1], ':([^:{}]+):run$')
local all, seen = run[2] and cjson.decode(run[2]) or {}, {}
for _, name in ipairs(all) do seen[name] = true end
local added = false
for i, name in ipairs(A.names) do
  if not seen[name] then
    seen[name] = true
    table.insert(all, name)
    redis.call('ZADD', KEYS[i + 1], 'NX', tonumber(run[3]) or 0, id)
    added = true
  end
end
if not added then return 'none' end
redis.call('HSET', KEYS[1], 'asks', cjson.encode(all))
return 'indexed'
