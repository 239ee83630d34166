-- A notification's record as its run's hash holds it ('n:<id>'): short names, no id (the
-- field's name says it), the values most of a parked run's notifications have (a request,
-- sent, at its first attempt) left out, for as long as it waits, and when it was sent as
-- ms after it was created. The names and those values are parking.codecs'
-- (NOTE_NAMES, NOTE_IMPLIED), written in here by parking.scripts: one table, which Python
-- reads and writes by too.
local NOTE_NAMES = __NOTE_NAMES__  -- long name → short name
local NOTE_IMPLIED = __NOTE_IMPLIED__  -- short name → the value left out
local NOTE_WIRE = {}
for name, short in pairs(NOTE_NAMES) do NOTE_WIRE[short] = name end
local SENT, CREATED = NOTE_NAMES.sentAt, NOTE_NAMES.createdAt

local function decode_note(raw)
  local rec = {}
  local stored = cjson.decode(raw)
  for short, value in pairs(NOTE_IMPLIED) do rec[NOTE_WIRE[short]] = value end
  for name, value in pairs(stored) do rec[NOTE_WIRE[name] or name] = value end
  if stored[SENT] and stored[CREATED] then rec.sentAt = stored[CREATED] + stored[SENT] end
  return rec
end

local function encode_note(rec)
  local stored = {}
  for name, value in pairs(rec) do
    local short = NOTE_NAMES[name] or name
    if name ~= 'id' and NOTE_IMPLIED[short] ~= value then stored[short] = value end
  end
  if stored[SENT] and stored[CREATED] then
    stored[SENT] = stored[SENT] - stored[CREATED]
  elseif stored[SENT] then  -- no creation time to count from: as it is, under its long name
    stored.sentAt, stored[SENT] = stored[SENT], nil
  end
  return cjson.encode(stored)
end
