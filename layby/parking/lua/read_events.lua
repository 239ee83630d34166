-- read_events: a run's events after an id, the folded ones (_folding.lua) first, then its
-- stream's, as the stream holds them: {id, {field, value, …}} each. One moment: a fold
-- between two reads would hide the events it moves.
-- KEYS: 1 run, 2 events.
-- Arguments: after (a stream id; '0-0' for all), count (the most to return)
local A = args({'after', 'count'})
local after, count = A.after, tonumber(A.count)
local after_ms, after_seq = split_id(after)
local found = unfold(run_field(FOLDED), after_ms, after_seq, count)
if #found < count then
  local start = after == '0-0' and '-' or '(' .. after
  for _, entry in ipairs(redis.call('XRANGE', FOLD_EVENTS, start, '+', 'COUNT',
                                    count - #found)) do
    table.insert(found, entry)
  end
end
return found
