-- ack_outbox: forget outbox entries once published.
-- KEYS: 1 outbox (zset), 2 outbox:entries (hash)
-- ARGV: entry ids
-- Writes outbox, outbox:entries. Returns how many ids it was given.
local OUTBOX, OUTBOX_ENTRIES = KEYS[1], KEYS[2]
local entry_ids = ARGV
for _, entry_id in ipairs(entry_ids) do
  redis.call('ZREM', OUTBOX, entry_id)
  redis.call('HDEL', OUTBOX_ENTRIES, entry_id)
end
return #entry_ids
