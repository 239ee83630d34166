-- merge_stats: the legacy shard's counters (`stats`) added to a shard's of the sharded
-- layout and deleted (`layby migrate`, migration 2): /metrics sums the shards' counters,
-- so the sums stay what they were.
-- KEYS: 1 the counters it leaves, 2 those it adds them to
-- Arguments: none
-- Returns how many counters were added.
local A = args({})
local found = redis.call('HGETALL', KEYS[1])
for i = 1, #found, 2 do redis.call('HINCRBY', KEYS[2], found[i], found[i + 1]) end
redis.call('DEL', KEYS[1])
return #found / 2
