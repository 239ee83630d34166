-- A notification's record as its run's hash holds it ('n:<id>'): short names, no id (the
-- field's name says it), the kind left out when it is a request. parking.compact reads it
-- (NOTE_NAMES there: the same names). A record an older layby wrote, under the long names,
-- reads the same.
local NOTE_NAMES = {kind = 'k', token = 't', interruptId = 'i', state = 's', attempts = 'a',
                    channel = 'c', sentAt = 'sa', reviewer = 'r', createdAt = 'ca', due = 'd',
                    level = 'l', lastError = 'e'}
local NOTE_WIRE = {}
for name, short in pairs(NOTE_NAMES) do NOTE_WIRE[short] = name end

local function decode_note(raw)
  local rec = {}
  for name, value in pairs(cjson.decode(raw)) do rec[NOTE_WIRE[name] or name] = value end
  if rec.kind == nil then rec.kind = 'request' end
  return rec
end

local function encode_note(rec)
  local stored = {}
  for name, value in pairs(rec) do
    if name ~= 'id' and not (name == 'kind' and value == 'request') then
      stored[NOTE_NAMES[name] or name] = value
    end
  end
  return cjson.encode(stored)
end
