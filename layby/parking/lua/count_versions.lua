-- count_versions: how many of the runs given each agent version has, counted where the
-- runs are, so that a reader of many (/metrics, layby doctor) gets a few lines back a page
-- rather than a reply per run.
-- KEYS: run hashes (a page of a state's index).
-- Arguments: none (any given is refused)
-- Returns {agent, version ('' unknown), pinned ('1' or ''), count, …}; runs gone (past
-- retention) are left out.
local A = args({})
local counts, order = {}, {}
for i = 1, #KEYS do
  local f = redis.call('HMGET', KEYS[i], 'agent', 'agent_version', 'pinned')
  if f[1] then
    local key = f[1] .. '\n' .. (f[2] or '') .. '\n' .. (f[3] or '')
    if not counts[key] then
      counts[key] = 0
      table.insert(order, key)
    end
    counts[key] = counts[key] + 1
  end
end
local out = {}
for _, key in ipairs(order) do
  local agent, version, pinned = string.match(key, '^(.*)\n(.*)\n(.*)$')
  table.insert(out, agent)
  table.insert(out, version)
  table.insert(out, pinned)
  table.insert(out, counts[key])
end
return out
