-- switch_format: the store's processes start writing format `to` (the next one), once no
-- live process's code is older than it (`force`: now, whatever is alive: `layby migrate
-- --finish`, when the operator knows them gone). A process of an older release that
-- starts after the switch refuses the store (parking.formats); one alive now reads it
-- only if its code knows `to`, hence the check.
-- A store in the legacy layout gets the shard count of the sharded one it moves to,
-- `shards` (the switching process's LAYBY_STORE_SHARDS; format 2 is that layout), and its
-- layout instant `sharded_at`, `layout_after_ms` after the switch: from then on every
-- process makes and moves runs there (parking.formats). One that has a count keeps it.
-- KEYS: 1 workers (zset: name → lease end, ms), 2 workers:about (hash), 3 format (hash)
-- Arguments: to, force ('1' or '0'), shards ('' none), layout_after_ms
-- Returns {'switched'} | {'already', the format written} | {'older', name, about, …}
--       | {'unversioned'} (no format yet) | {'not_next', the format written}
local A = args({'to', 'force', 'shards', 'layout_after_ms'})
local format = redis.call('HMGET', KEYS[3], 'version', 'writing')
if not format[1] then return {'unversioned'} end
local written = tonumber(format[2] or format[1])
local to = tonumber(A.to)
if written >= to then return {'already', tostring(written)} end
if to ~= written + 1 then return {'not_next', tostring(written)} end
if A.force ~= '1' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local older = {}
  for _, name in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
    local about = redis.call('HGET', KEYS[2], name) or ''
    local newest = tonumber(string.match(about, '^%S+ (%d+)'))
    -- A process that says no format is of a release before formats were announced.
    if not newest or newest < to then
      table.insert(older, name)
      table.insert(older, about)
    end
  end
  if #older > 0 then
    table.insert(older, 1, 'older')
    return older
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- When: a migration waits until every process has seen it (parking.formats.FRESH_S).
redis.call('HSET', KEYS[3], 'writing', to, 'switched_at', now)
if A.shards ~= '' and redis.call('HSETNX', KEYS[3], 'shards', A.shards) == 1 then
  redis.call('HSET', KEYS[3], 'sharded_at', now + tonumber(A.layout_after_ms))
end
return {'switched'}
