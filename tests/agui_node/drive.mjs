// Drives layby's AG-UI endpoint with the real @ag-ui/client; prints a JSON report.
// Usage: node drive.mjs <base url> <api key>
import { HttpAgent, buildResumeArray } from "@ag-ui/client";
import { randomUUID } from "node:crypto";

const [base, key] = process.argv.slice(2);

function agentFor(name) {
  const agent = new HttpAgent({ url: `${base}/agui/${name}`, threadId: `node-${randomUUID()}`,
                                headers: { Authorization: `Bearer ${key}` } });
  const seen = [];
  agent.subscribe({
    onEvent({ event }) { seen.push(event.type); },
    onRunFinishedEvent(params) { seen.push(`finished:${params.outcome}`); },
  });
  return { agent, seen };
}

function say(agent, text) {
  agent.addMessage({ id: randomUUID(), role: "user", content: text });
}

async function errorOf(promise) {
  try { await promise; return null; } catch (err) { return String(err?.message ?? err); }
}

const report = {};

// demo.transfer: pause on the confirmation, then resume with approval.
{
  const { agent, seen } = agentFor("demo.transfer");
  say(agent, "Send 30 to Eve");
  const first = await agent.runAgent();
  const interrupts = agent.pendingInterrupts.map(i => ({ ...i }));
  const toolCalls = agent.messages.flatMap(m => m.toolCalls ?? []).map(c => c.id);
  const resume = buildResumeArray(agent.pendingInterrupts,
    { [interrupts[0].id]: { status: "resolved", payload: { approved: true } } });
  const second = await agent.runAgent({ resume });
  report.transfer = {
    firstResult: first.result ?? null, interrupts, toolCalls,
    result: second.result, pendingAfter: agent.pendingInterrupts.length,
    messages: agent.messages.map(m => ({ role: m.role, content: m.content ?? null,
                                         toolCallId: m.toolCallId ?? null })),
    seen,
  };
}

// demo.parallel: a resume answering one of two interrupts fails; both succeeds.
{
  const { agent, seen } = agentFor("demo.parallel");
  say(agent, "pay Carol");
  await agent.runAgent();
  const pending = agent.pendingInterrupts.map(i => ({ ...i }));
  const question = pending.find(i => i.reason === "input_required");
  const approval = pending.find(i => i.reason === "confirmation");
  const partial = await errorOf(agent.runAgent({
    resume: [{ interruptId: question.id, status: "resolved", payload: "main" }] }));
  const done = await agent.runAgent({ resume: [
    { interruptId: question.id, status: "resolved", payload: "main" },
    { interruptId: approval.id, status: "cancelled", metadata: { reason: "no" } }] });
  report.parallel = { reasons: pending.map(i => i.reason).sort(), partial,
                      result: done.result, seen };
}

// Input on a thread with an open interrupt, without resume: an error.
{
  const { agent } = agentFor("demo.trivia");
  say(agent, "quiz me");
  await agent.runAgent();
  const waiting = agent.pendingInterrupts.length;
  say(agent, "again");
  const refusedByClient = await errorOf(agent.runAgent());
  // A client that forgot the interrupt (a reloaded page): the server refuses, RUN_ERROR.
  const reloaded = new HttpAgent({ url: `${base}/agui/demo.trivia`, threadId: agent.threadId,
                                   headers: { Authorization: `Bearer ${key}` } });
  const errors = [];
  reloaded.subscribe({ onRunErrorEvent({ event }) { errors.push(event); } });
  say(reloaded, "again");
  const refused = await errorOf(reloaded.runAgent());
  // It can still resume with the interrupt id it reads from the thread (here: the old agent).
  const done = await reloaded.runAgent({ resume: [
    { interruptId: agent.pendingInterrupts[0].id, status: "resolved", payload: "Alien" }] });
  report.noResume = { waiting, refusedByClient, refused, errors, result: done.result };
}

console.log(JSON.stringify(report));
