-- fold_events: the events of a run parked for a while moved out of their stream into the
-- run's hash (field `events`, _folding.lua), and the stream deleted. Readers get them back
-- as they were (read_events.lua); later events go to a new stream. A follower blocked on
-- the stream misses nothing: it has read every entry there was (it blocks only when none
-- is left), and the next event wakes it as the new stream's first.
-- KEYS: 1 run, 2 events.
-- Arguments: keep (the most events a run keeps, LAYBY_EVENTS_MAX)
-- Returns 'folded' | 'kept' (an entry that cannot be folded, or one of this very
--         millisecond: the stream stays as it is) |
--         'none' (nothing to fold, or the run is not parked)
local A = args({'keep'})
if redis.call('HGET', FOLD_RUN, 'status') ~= 'interrupted' then return 'none' end
local entries = redis.call('XRANGE', FOLD_EVENTS, '-', '+')
if #entries == 0 then return 'none' end
-- A stream made again numbers its entries from the time alone: an event appended in the
-- millisecond of the newest folded one would get an id at or before it, and a follower
-- past the folded events would never read it. So a stream whose newest entry is of this
-- millisecond is left for a later pass (one of a run that stays parked comes round again
-- only at its next park: it costs memory, never an event).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
if tonumber(string.match(entries[#entries][1], '^%d+')) >= now then return 'kept' end
local lines = folded_lines(run_field(FOLDED))
local last_ms, last_seq, planned = 0, -1, {}
for _, line in ipairs(lines) do planned = planned_after(line[2], planned) end
if #lines > 0 then
  last_ms, last_seq = lines[#lines][1], tonumber(string.match(lines[#lines][2], '^%d+'))
end
for _, entry in ipairs(entries) do
  local ms, tail = fold_line(entry, planned)
  if ms then planned = planned_after(tail, planned) end
  local seq = ms and tonumber(string.match(tail, '^%d+'))
  -- Entries the fold cannot hold, or a stream begun after a fold on a clock behind it.
  if not ms or ms < last_ms or (ms == last_ms and seq <= last_seq) then return 'kept' end
  table.insert(lines, {ms, tail})
  last_ms, last_seq = ms, seq
end
local keep = tonumber(A.keep)
if #lines > keep then
  -- The oldest go; a kept line that names a notification by its place in a plan that
  -- goes names it by its id again.
  local kept, first, seen_plan = {}, #lines - keep + 1, false
  planned = {}
  for k, line in ipairs(lines) do
    if k >= first then
      local seq, code, version, rest = line_parts(line[2])
      local place = code == 'n' and not seen_plan and string.match(rest, '^%^(%d+) ')
      if place then
        line = {line[1], seq .. ' n ' .. version .. ' ' .. planned[tonumber(place)]
                         .. string.sub(rest, #place + 2)}
      end
      seen_plan = seen_plan or code == 'p'
      table.insert(kept, line)
    end
    planned = planned_after(line[2], planned)
  end
  lines = kept
end
redis.call('HSET', FOLD_RUN, FOLDED, folded_text(lines))
redis.call('DEL', FOLD_EVENTS)
return 'folded'
