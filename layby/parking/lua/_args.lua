-- A script's arguments, by name (prepended by parking/scripts.py to every script, before
-- anything else). The caller (parking.scripts.argv) sends ARGV as name, value, name,
-- value, …; a repeated group (a park's interrupts, an answer's answers, a plan) is one
-- argument, a JSON array or object whose objects have named members, a member that has no
-- value left out (never null: cjson reads null as a value, and a true one). A record the
-- script stores as it is travels as a string inside them: decoded and encoded again, cjson
-- would reorder its keys and write big numbers as 1e+14.
--
-- Every script begins with `local A = args({names…}, {group names…})`: A[name] is the
-- value as Redis hands it (a string), a group's decoded. A call that does not fit is
-- refused before the script writes anything, naming the script and the argument: a name
-- without a value, one missing or given twice, one the script does not read (a caller
-- out of step with the script fails here, not by reading a value under the wrong name),
-- a group that is not JSON.
local SCRIPT = __SCRIPT__

local function refuse(what)
  error(redis.error_reply('ERR ' .. SCRIPT .. ': ' .. what))
end

-- A name as a refusal shows it: one from a caller out of step may be a whole JSON value.
local function shown(name) return string.sub(name, 1, 40) end

local function args(names, groups)
  if #ARGV % 2 ~= 0 then
    refuse('an odd number of ARGV (' .. #ARGV .. '): they go as name, value pairs, and the '
           .. 'last, ' .. shown(ARGV[#ARGV]) .. ', has no value')
  end
  local given = {}
  for i = 1, #ARGV, 2 do
    if given[ARGV[i]] ~= nil then refuse('argument ' .. shown(ARGV[i]) .. ' is given twice') end
    given[ARGV[i]] = ARGV[i + 1]
  end
  local known = {}
  for _, name in ipairs(names) do
    if given[name] == nil then refuse('argument ' .. name .. ' is missing') end
    known[name] = true
  end
  for _, name in ipairs(groups or {}) do
    if given[name] == nil then refuse('argument ' .. name .. ' is missing') end
    local ok, value = pcall(cjson.decode, given[name])
    if not ok or type(value) ~= 'table' then
      refuse('argument ' .. name .. ' is not a JSON array or object')
    end
    given[name] = value
    known[name] = true
  end
  for name in pairs(given) do
    if not known[name] then refuse('argument ' .. shown(name) .. ' is not one it reads') end
  end
  return given
end
