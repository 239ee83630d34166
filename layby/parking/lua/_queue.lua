-- Task messages pushed by the scripts themselves (prepended by parking/scripts.py to the
-- run scripts and to the global ones that queue tasks).
--
-- When the broker is this server, a script that commits a transition puts the next task on
-- its queue in the same atomic step: the message is in the server's data (and append-only
-- file) exactly when the change is, so nothing is published after the commit and nothing
-- is published twice. The messages come made (layby.broker_config.messages) with
-- placeholders: @@R@@ run id, @@V@@ version, @@N@@ notification id, @@T@@ task id,
-- @@D@@ delivery tag, @@A@@ the run's agent as Flower shows it before the ids, @@S@@ the
-- queue's suffix (a pinned run's steps go to `<queue>@<version>`), @@P@@ the run's trace
-- context (its `trace` field, a W3C traceparent, or '').

-- By kind (turn, resume, notify, deliver): the task and its queue, and, when the broker is
-- this server, `key` (the queue's list) and `message` (its pieces, for `fill`).
local TASKS = __TASKS__
-- A pushed message is in its queue for good: only a lost server loses it, so whatever
-- watches for a lost one (notify:due, the outbox of notify tasks) waits this long.
local LOST_MESSAGE_MS = __LOST_MESSAGE_MS__

-- A message is made of pieces (parking/scripts.py): its text between placeholders at odd
-- places, and at even places the letter of the value that goes there.
local function fill(pieces, values)
  local out = {}
  for i = 1, #pieces do
    out[i] = (i % 2 == 0) and values[pieces[i]] or pieces[i]
  end
  return table.concat(out)
end

-- What comes before the ids in the arguments Flower shows (argsrepr): `agent=<name> `,
-- escaped for the JSON header it lands in; nothing when the agent is not known here.
local function shown_agent(agent)
  if not agent or agent == '' then return '' end
  return 'agent=' .. string.sub(cjson.encode(agent), 2, -2) .. ' '
end

-- Push the task of `kind` for `run` (at `version`, or about notification `note`) of
-- `agent` (or nil) at `now` (ms), onto its queue with `suffix` ('@<version>' or nil), in
-- the trace `trace` (a traceparent, or nil); false when the broker is elsewhere.
-- kombu's delivery tag must be unique among messages in flight: the task id and the moment
-- make it so (a task id is pushed again only by a requeue, long after).
local function push(kind, run, version, note, now, agent, suffix, trace)
  local task = TASKS[kind]
  if not task.message then return false end
  local task_id = note or (run .. ':' .. kind .. ':' .. version)
  redis.call('LPUSH', task.key .. (suffix or ''),
             fill(task.message, {R = run, V = tostring(version or ''), N = note or '',
                                 T = task_id, D = task_id .. ':' .. now,
                                 A = shown_agent(agent), S = suffix or '',
                                 P = trace or ''}))
  return true
end
