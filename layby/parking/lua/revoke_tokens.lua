-- revoke_tokens: the run's run tokens minted until now are refused from now on (checked
-- against `tokens_after` where the run is read for them: layby.control.commands).
-- Reads run. Writes run (tokens_after), events.
-- Arguments: by (who revoked them), audit (JSON: its audit entries, strings)
-- Returns {'ok', revoked at (ms)} | {'missing'}
local A = args({'by'}, {'audit'})
local version = redis.call('HGET', RUN, 'version')
if not version then return {'missing'} end
local now = now_ms()
redis.call('HSET', RUN, 'tokens_after', now)
event('run.tokens_revoked', version, cjson.encode({by = A.by}), now)
audit(A.audit, now)
return {'ok', now}
