-- find_due: which of the sorted sets given hold a member that is due, so that a sweep with
-- nothing to do asks once where it would read every shard's outbox, due notifications,
-- deadlines, retries, leases and waiting runs (539 commands a pass at 48 shards).
-- KEYS: sorted sets scored by a moment (ms)
-- Arguments: lags (a JSON array, one a key: a member of KEYS[i] is due once its score is
--   lags[i] ms or more before now, by the server's clock)
-- Returns the positions (from 1) of the keys holding a member due.
local A = args({}, {'lags'})
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lags, due = A.lags, {}
if #lags ~= #KEYS then
  refuse('lags has ' .. #lags .. ' values for ' .. #KEYS .. ' keys: give one lag per key')
end
for i = 1, #KEYS do
  if redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', now - lags[i], 'LIMIT', 0, 1)[1] then
    table.insert(due, i)
  end
end
return due
