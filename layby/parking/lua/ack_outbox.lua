-- ack_outbox: forget outbox entries once published.
-- KEYS: 1 outbox (zset), 2 outbox:entries (hash)
-- Arguments: ids (JSON: the entry ids)
-- Writes outbox, outbox:entries. Returns how many ids it was given.
local A = args({}, {'ids'})
local OUTBOX, OUTBOX_ENTRIES = KEYS[1], KEYS[2]
local entry_ids = A.ids
for _, entry_id in ipairs(entry_ids) do
  redis.call('ZREM', OUTBOX, entry_id)
  redis.call('HDEL', OUTBOX_ENTRIES, entry_id)
end
return #entry_ids
