-- record_audit: what a caller did, or tried, that changes no run (a refusal, a run token
-- minted), kept in a shard's audit trail (the run's shard, or the caller's).
-- KEYS: 1 the shard's audit stream (parking.keys)
-- Arguments: keep_ms (how long entries are kept), entries (JSON: audit entries, strings)
-- Returns the number written
local A = args({'keep_ms'}, {'entries'})
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, entry in ipairs(A.entries) do
  redis.call('XADD', KEYS[1], 'MINID', '~', now - tonumber(A.keep_ms), '*', 'e', entry)
end
return #A.entries
