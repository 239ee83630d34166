-- move_members: members of one shard's sorted set moved to another's (their scores kept; a
-- member there already keeps the later score), each with its fields of the hashes given
-- beside it (a field there already is kept): what `layby migrate` finds left in the legacy
-- shard once every run moved (migration 2): entries of the outbox (and their records),
-- deadlines, notifications due, leases and index entries of runs now in that shard, the
-- process registry (and what each process said it is, and hosts). With `drop`, they are
-- deleted instead (their runs are gone: as the sweeper would prune them).
-- KEYS: 1 the sorted set they leave, 2 the one they go to, then pairs of hashes (the one
--   they leave, the one they go to)
-- Arguments: members (JSON array), drop ('1' or '0')
-- Returns how many of them were there.
local A = args({'drop'}, {'members'})
local drop = A.drop == '1'
local moved = 0
for _, member in ipairs(A.members) do
  local score = redis.call('ZSCORE', KEYS[1], member)
  if score then
    moved = moved + 1
    redis.call('ZREM', KEYS[1], member)
    if not drop then redis.call('ZADD', KEYS[2], 'GT', score, member) end
  end
  for i = 3, #KEYS, 2 do
    local value = redis.call('HGET', KEYS[i], member)
    if value then
      redis.call('HDEL', KEYS[i], member)
      if not drop then redis.call('HSETNX', KEYS[i + 1], member, value) end
    end
  end
end
return moved
