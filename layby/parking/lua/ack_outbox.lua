-- ack_outbox: forget outbox entries once published.
-- KEYS: 1 outbox (zset), 2 outbox:entries (hash)
-- ARGV: entry ids
for _, entry_id in ipairs(ARGV) do
  redis.call('ZREM', KEYS[1], entry_id)
  redis.call('HDEL', KEYS[2], entry_id)
end
return #ARGV
