-- answer_interrupts: record answers to open interrupts; the answer that closes the last
-- one moves interrupted → resuming and queues exactly one resume. An interrupt that needs
-- several approvals takes each reviewer's approval once and closes on the last one needed
-- (or on anyone's decline, which is an ordinary answer here).
-- Reads run (with its interrupts), answers, open, review. Writes answers, open, deadlines,
-- events, review (approvals), notifications and notify:due (skipped), stats; with the last
-- answer run, index, outbox.
-- Arguments: require_all ('1' if the answers must cover every open interrupt), allow_early
--   ('1' to keep an answer for an interrupt not parked yet: a background job that finished
--   first), answers (JSON, each {id: the interrupt's, answer: Answer JSON (a string), need:
--   the approvals it needs, voter: who approves (left out, or '', when the answer is not an
--   approval counted toward several), deadline: false when the interrupt has none to drop}),
--   audit (JSON: the answers' audit entries, strings; written when they are recorded),
--   slack ('1' to queue the update of the run's Slack messages: `slack_update`), trace (the
--   answer's trace context, a traceparent, or '': the resume continues it)
-- Returns {'ok', version, outbox entry or '', {}, {}, '1' if the run resumes, when (ms),
--          the id of the last event written, the Slack update's outbox entry or ''} |
--         {'early'} |
--         {'missing'} | {'finished', status} |
--         {'unknown', id} |
--         {'conflict', id, first answer JSON or '', run status} | {'incomplete', open ids…}
--         | {'again', id, this reviewer's earlier approval JSON}
local A = args({'require_all', 'allow_early', 'slack', 'trace'}, {'answers', 'audit'})
local require_all, allow_early, given = A.require_all, A.allow_early, A.answers
local run = redis.call('HMGET', RUN, 'status', 'version', 'updated_at', 'open', 'noted',
                      'waiting', 'tenant')
local status = run[1]
if not status then return {'missing'} end
RUN_TENANT = run[7]
-- A finished run takes no early answers: its keys already count down to expiry.
if FINISHED[status] and allow_early == '1' then return {'finished', status} end
local n = #given
local open_ids, open = parse_open(run[4])
-- Everything is checked before anything is written.
for _, a in ipairs(given) do
  local iid, voter = a.id, a.voter or ''
  if not open[iid] then
    if not has_interrupt(iid) then
      if allow_early == '1' then
        redis.call('HSETNX', ANSWERS, iid, a.answer)
        return {'early'}
      end
      return {'unknown', iid}
    end
    return {'conflict', iid, redis.call('HGET', ANSWERS, iid) or '', status}
  end
  if voter ~= '' then
    local earlier = redis.call('HGET', REVIEW, 'approval:' .. iid .. ':' .. voter)
    if earlier then return {'again', iid, earlier} end
  end
end
if require_all == '1' and #open_ids ~= n then
  table.insert(open_ids, 1, 'incomplete')
  return open_ids
end
local now = now_ms()
audit(A.audit, now)
local answers, ids, counted = {}, {}, false
for _, a in ipairs(given) do
  table.insert(ids, a.id)
  counted = counted or (a.voter or '') ~= ''
end
for _, a in ipairs(given) do
  local iid, answer, need, voter = a.id, a.answer, a.need, a.voter or ''
  local closes = true
  if voter ~= '' then
    redis.call('HSET', REVIEW, 'approval:' .. iid .. ':' .. voter, answer)
    local got = redis.call('HINCRBY', REVIEW, 'approvals:' .. iid, 1)
    if got < tonumber(need) then
      closes = false
      event('interrupt.approved', run[2],
            cjson.encode({interruptId = iid, by = voter, approvals = got,
                          requiredApprovals = tonumber(need)}), now)
    end
  end
  if closes then table.insert(answers, {iid, answer, a.deadline ~= false}) end
end
if #answers == 0 then
  return {'ok', run[2], '', {}, {}, '0', now, LAST_EVENT,
          slack_update(A.slack, ids, counted, now)}
end
local v, entry, resumed = apply_answers(answers, now, run, A.trace)
return {'ok', v, entry, {}, {}, resumed and '1' or '0', now, LAST_EVENT,
        slack_update(A.slack, ids, counted, now)}
