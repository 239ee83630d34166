-- A notification's record as its run's hash holds it ('n:<id>'): short names, no id (the
-- field's name says it), the kind left out when it is a request, the state when it is
-- sent and the attempts when one (what a parked run's notifications most often are, for
-- as long as it waits), when it was sent as ms after it was created. parking.compact
-- reads it (NOTE_NAMES there: the same names). A record an older layby wrote, under the
-- long names, reads the same.
local NOTE_NAMES = {kind = 'k', token = 't', interruptId = 'i', state = 's', attempts = 'a',
                    channel = 'c', sentAt = 'sa', reviewer = 'r', createdAt = 'ca', due = 'd',
                    level = 'l', lastError = 'e'}
local NOTE_WIRE = {}
for name, short in pairs(NOTE_NAMES) do NOTE_WIRE[short] = name end

local function decode_note(raw)
  local rec = {}
  local stored = cjson.decode(raw)
  for name, value in pairs(stored) do rec[NOTE_WIRE[name] or name] = value end
  -- (A record under the long names, an older layby's, has them all.)
  if rec.kind == nil then rec.kind = 'request' end
  if rec.state == nil then rec.state = 'sent' end
  if rec.attempts == nil then rec.attempts = 1 end
  if stored.sa and stored.ca then rec.sentAt = stored.ca + stored.sa end
  return rec
end

local function encode_note(rec)
  local stored = {}
  for name, value in pairs(rec) do
    if name ~= 'id' and not (name == 'kind' and value == 'request')
        and not (name == 'state' and value == 'sent')
        and not (name == 'attempts' and tonumber(value) == 1) then
      stored[NOTE_NAMES[name] or name] = value
    end
  end
  if stored.sa and stored.ca then
    stored.sa = stored.sa - stored.ca
  elseif stored.sa then  -- no creation time to count from: as it is, under its long name
    stored.sentAt, stored.sa = stored.sa, nil
  end
  return cjson.encode(stored)
end
