-- beat_worker: a layby process says it is alive, and what it is: its entry in workers is
-- pushed to now + lease, and workers:about says its kind, the newest store format its code
-- knows and its release. Celery's main process of a worker beats (it holds the messages it
-- has reserved: the sweeper requeues what waited when one dies), and so do the gateway and
-- the reply listener (their entries only tell which formats live processes read). The
-- reply says which format the store writes now, and its layout: a process picks up a
-- switch at its beat.
-- KEYS: 1 workers (zset: name → lease end, ms), 2 workers:about (hash), 3 format (hash)
-- Arguments: worker (its name), lease_ms, about ("<kind> <newest format> <release>")
-- Returns {lease end, the store's format version or '', the format written or '', the
-- server's time (ms), then the format key's fields as parking.formats.FIELDS names them
-- ('' for each absent)}.
local A = args({'worker', 'lease_ms', 'about'})
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(A.lease_ms)
redis.call('ZADD', KEYS[1], until_ms, A.worker)
redis.call('HSET', KEYS[2], A.worker, A.about)
local format = redis.call('HMGET', KEYS[3], 'version', 'writing', 'migrating', 'shards',
                          'sharded_at')
local reply = {until_ms, format[1] or '', format[2] or format[1] or '',
               until_ms - tonumber(A.lease_ms)}
for i = 1, 5 do reply[4 + i] = format[i] or '' end
return reply
