-- beat_worker: a worker process (Celery's main process, which holds the messages it has
-- reserved) says it is alive: its entry in workers is pushed to now + lease.
-- KEYS: 1 workers (zset: worker name → lease end, ms)
-- Arguments: worker (its name), lease_ms
-- Returns the lease end.
local A = args({'worker', 'lease_ms'})
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(A.lease_ms)
redis.call('ZADD', KEYS[1], until_ms, A.worker)
return until_ms
