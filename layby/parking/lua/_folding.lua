-- The events of a run that has waited a while, folded out of their stream into a field of
-- the run's hash (fold_events.lua), and read back as the stream held them (read_events.lua).
-- Shared by both, so what a fold writes is read back by the same code that checked it.
--
-- A stream costs a few hundred bytes before its first entry, and the events of a park
-- repeat what the run's hash holds: a parked run would keep both for as long as it waits.
-- Folded, each event is one line of the field `events`:
--   <ms after the line before>-<seq> <code> <version> <what the data is rebuilt from…>
-- (the first line's ms after the run's `created_at`)
-- where the code names an event whose data is rebuilt from the run's hash (its agent, the
-- reason of an interrupt, what a notification is, none of which ever changes once written)
-- and a few words on the line; or, for any other event, or one whose data would not come
-- back byte for byte:
--   <ms after the line before>-<seq> = <version> <type> <data as stored>
-- KEYS[1] the run's hash, KEYS[2] its events (the layout of parking.keys).
local FOLD_RUN, FOLD_EVENTS = KEYS[1], KEYS[2]
local FOLDED = 'events'
-- An interrupt's reason, as its record (i:<id>) stores it: under this short name, left out
-- when it is the implied one (parking.codecs', written in here by parking.scripts).
local REASON, REASON_IMPLIED = __INTERRUPT_REASON__, __INTERRUPT_REASON_IMPLIED__
local CODES = {['run.created'] = 'c', ['run.started'] = 's', ['run.interrupted'] = 'i',
               ['notifications.planned'] = 'p', ['notification.sent'] = 'n'}
local TYPES = {}
for kind, code in pairs(CODES) do TYPES[code] = kind end

local function words(text)
  local found = {}
  for w in string.gmatch(text, '%S+') do table.insert(found, w) end
  return found
end

-- Fields of the run's hash, read once a script.
local read_cache = {}
local function run_field(name)
  if read_cache[name] == nil then
    read_cache[name] = redis.call('HGET', FOLD_RUN, name) or false
  end
  return read_cache[name]
end

local function decoded(raw)
  if not raw then return nil end
  local ok, value = pcall(cjson.decode, raw)
  if ok and type(value) == 'table' then return value end
  return nil
end

-- An event's data, rebuilt from its code and the words after its version (nil: it cannot
-- be). Each is written as the script or the caller that appended the event wrote it.
local REBUILD = {
  c = function()
    local agent = run_field('agent')
    return agent and cjson.encode({agent = agent})
  end,
  s = function(args) return args[1] and cjson.encode({from = args[1]}) end,
  i = function(args)
    -- parking.store's park event, its messages cut (park_run.lua): from, historyTo, and
    -- each interrupt's id and reason, that interrupt's own (i:<id>).
    if #args < 2 then return nil end
    local parts = {}
    for k = 3, #args do
      local spec = decoded(run_field('i:' .. args[k]))
      local reason = spec and (spec[REASON] or REASON_IMPLIED)
      if type(reason) ~= 'string' then return nil end
      table.insert(parts, '{"id":' .. cjson.encode(args[k]) .. ',"reason":'
                          .. cjson.encode(reason) .. '}')
    end
    return '{"from":' .. args[1] .. ',"historyTo":' .. args[2] .. ',"interrupts":['
           .. table.concat(parts, ',') .. ']}'
  end,
  p = function(args)
    if #args == 0 then return nil end
    return cjson.encode({ids = args})
  end,
  n = function(args)
    -- finish_delivery.lua's, from the notification's record (n:<id>) and its attempts.
    local raw = run_field('n:' .. (args[1] or ''))
    local rec = raw and decoded(raw) and decode_note(raw)
    if not rec or not tonumber(args[2]) then return nil end
    return cjson.encode({id = args[1], interruptId = rec.interruptId, reviewer = rec.reviewer,
                         channel = rec.channel, kind = rec.kind,
                         attempts = tonumber(args[2])})
  end,
}

-- What to rebuild an event's data from, read off the data itself.
local WORDS = {
  c = function() return {} end,
  s = function(data) return type(data.from) == 'string' and {data.from} or nil end,
  i = function(data)
    if type(data.interrupts) ~= 'table' then return nil end
    local found = {tostring(data.from), tostring(data.historyTo)}
    for _, intr in ipairs(data.interrupts) do
      if type(intr) ~= 'table' or type(intr.id) ~= 'string' then return nil end
      table.insert(found, intr.id)
    end
    return found
  end,
  p = function(data) return type(data.ids) == 'table' and data.ids or nil end,
  n = function(data)
    return type(data.id) == 'string' and {data.id, tostring(data.attempts)} or nil
  end,
}

-- A stream id's time and sequence ('<ms>' alone, as a Last-Event-ID may be: sequence 0).
local function split_id(id)
  local ms, seq = string.match(id, '^(%d+)-?(%d*)$')
  return tonumber(ms) or 0, tonumber(seq) or 0
end

-- A line's code, version and words (after its time).
local function line_parts(tail)
  return string.match(tail, '^(%d+) (%S+) (%S+) ?(.*)$')
end

-- A notification sent is most often one the line of the last plan names: its place there
-- ('^<k>') stands for its id. `planned`: that line's ids, kept up to date by the caller
-- of `fold_line` and by `unfold`.
local function planned_after(tail, planned)
  local _, code, _, rest = line_parts(tail)
  return code == 'p' and words(rest) or planned
end

-- A stream entry ({id, {field, value, …}}) as a folded line's time (ms) and what follows
-- its time; nil when the entry holds more than a type, a version and one line of data
-- (and a step's messages: dropped, as a park drops them, for the run's history holds
-- them and readers fill them in from there).
local function fold_line(entry, planned)
  local fields, got = entry[2], {}
  for k = 1, #fields, 2 do got[fields[k]] = fields[k + 1] end
  local kind, version, data = got.type, got.version, got.data
  if #fields ~= (got.messages and 8 or 6) or not kind or not version or not data
      or string.find(data, '\n', 1, true) or string.find(kind, '%s')
      or string.find(version, '%s') then
    return nil
  end
  local ms, seq = split_id(entry[1])
  local head = seq .. ' '
  local code = CODES[kind]
  local value = code and decoded(data)
  local args = value and WORDS[code](value)
  if args then
    local clean = true
    for _, w in ipairs(args) do
      if type(w) ~= 'string' or w == '' or string.find(w, '%s') then clean = false end
    end
    if clean and REBUILD[code](args) == data then
      for k, nid in ipairs(code == 'n' and planned or {}) do
        if nid == args[1] then args[1] = '^' .. k end
      end
      return ms, head .. code .. ' ' .. version .. (#args > 0 and ' ' .. table.concat(args, ' ')
                                                      or '')
    end
  end
  return ms, head .. '= ' .. version .. ' ' .. kind .. ' ' .. data
end

-- The first line's time is after the run's creation (its first event's, mostly: 0).
local function fold_base() return tonumber(run_field('created_at')) or 0 end

-- The folded lines, each {time (ms), what follows its time}.
local function folded_lines(text)
  local found, ms = {}, fold_base()
  for line in string.gmatch(text or '', '[^\n]+') do
    local delta, tail = string.match(line, '^(-?%d+)-(.*)$')
    ms = ms + tonumber(delta)
    table.insert(found, {ms, tail})
  end
  return found
end

-- Lines ({time, tail}) as the field holds them: each time after the one before.
local function folded_text(lines)
  local out, before = {}, fold_base()
  for _, line in ipairs(lines) do
    table.insert(out, (line[1] - before) .. '-' .. line[2])
    before = line[1]
  end
  return table.concat(out, '\n')
end

-- The folded events as stream entries ({id, {'type', …, 'version', …, 'data', …}}), in
-- order, those after `after_ms`-`after_seq` alone, at most `count`.
local function unfold(text, after_ms, after_seq, count)
  local entries, planned = {}, {}
  for _, line in ipairs(folded_lines(text)) do
    if #entries >= count then break end
    local ms = line[1]
    local seq, code, version, rest = line_parts(line[2])
    seq = tonumber(seq)
    planned = planned_after(line[2], planned)
    if ms > after_ms or (ms == after_ms and seq > after_seq) then
      local kind, data
      if code == '=' then
        kind, data = string.match(rest, '^(%S+) (.*)$')
      else
        local args = words(rest)
        local k = code == 'n' and string.match(args[1] or '', '^%^(%d+)$')
        if k then args[1] = planned[tonumber(k)] end
        kind, data = TYPES[code], REBUILD[code](args)
      end
      table.insert(entries, {ms .. '-' .. seq, {'type', kind, 'version', version,
                                                'data', data or '{}'}})
    end
  end
  return entries
end
