-- move_key: a string of the legacy shard (an idempotency key, a grant) moved to its shard
-- of the sharded layout (`layby migrate`, migration 2), its lifetime kept; one there already
-- (written since the store moved) is kept, and the legacy one deleted.
-- KEYS: 1 the key it leaves, 2 the key it goes to
-- Arguments: none
-- Returns 'moved' | 'kept' (one was there) | 'none' (nothing to move)
local A = args({})
if redis.call('EXISTS', KEYS[1]) == 0 then return 'none' end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('DEL', KEYS[1])
  return 'kept'
end
redis.call('RENAME', KEYS[1], KEYS[2])
return 'moved'
