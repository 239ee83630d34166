// Drives layby's AG-UI endpoint with the real @ag-ui/client; prints a JSON report.
// Usage (from a folder holding client.mjs and its node_modules, e.g. tests/agui_node or
// tests/agui_node_0059): node <path to>/drive.mjs <base url> <api key>
import { randomUUID } from "node:crypto";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";

// The client of the folder the script runs in: one driver for every pinned version.
const client = await import(pathToFileURL(resolve(process.cwd(), "client.mjs")).href);
const { HttpAgent, buildResumeArray } = client;
const [base, key] = process.argv.slice(2);
const headers = { Authorization: `Bearer ${key}` };
const sleep = ms => new Promise(done => setTimeout(done, ms));

function agentFor(name) {
  const agent = new HttpAgent({ url: `${base}/agui/${name}`, threadId: `node-${randomUUID()}`,
                                headers });
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

// An expired interrupt: the client refuses to send the resume itself; a client that
// does not check (a reloaded page) sends it and gets RUN_ERROR from the server.
{
  const { agent } = agentFor("demo.expiring");
  say(agent, "deploy");
  await agent.runAgent();
  const [intr] = agent.pendingInterrupts.map(i => ({ ...i }));
  const expiresMs = Date.parse(intr.expiresAt) - Date.now();
  await sleep(Math.max(0, expiresMs) + 500);
  const resume = [{ interruptId: intr.id, status: "resolved", payload: { approved: true } }];
  const refusedByClient = await errorOf(agent.runAgent({ resume }));
  const reloaded = new HttpAgent({ url: `${base}/agui/demo.expiring`, threadId: agent.threadId,
                                   headers });
  const errors = [];
  reloaded.subscribe({ onRunErrorEvent({ event }) { errors.push(event); } });
  const thrown = await errorOf(reloaded.runAgent({ resume }));
  report.expired = { threadId: agent.threadId, interrupt: intr, refusedByClient, thrown,
                     errors };
}

// A replayed resume (a second tab, a retried request): no error, the same result, and
// the transfer happens once (the test reads the ledger).
{
  const { agent } = agentFor("demo.transfer");
  say(agent, "Send 12 to Fay");
  await agent.runAgent();
  const [intr] = agent.pendingInterrupts;
  const resume = [{ interruptId: intr.id, status: "resolved", payload: { approved: true } }];
  const first = await agent.runAgent({ resume });
  const again = new HttpAgent({ url: `${base}/agui/demo.transfer`, threadId: agent.threadId,
                                headers });
  const errors = [];
  again.subscribe({ onRunErrorEvent({ event }) { errors.push(event); } });
  const replayed = await again.runAgent({ resume });
  report.replay = { threadId: agent.threadId, first: first.result ?? null,
                    replayed: replayed.result ?? null, errors };
}

// The interrupt answered through /v1 (another channel); the client reconnects with a
// plain run on the thread and sees the run finish.
{
  const { agent, seen } = agentFor("demo.trivia");
  say(agent, "quiz me");
  await agent.runAgent();
  const [intr] = agent.pendingInterrupts;
  const runId = `agui_${agent.threadId}`;
  const answered = await fetch(`${base}/v1/runs/${runId}/interrupts/${intr.id}`, {
    method: "POST", headers: { ...headers, "Content-Type": "application/json" },
    body: JSON.stringify({ status: "resolved", payload: "Jaws" }) });
  const back = new HttpAgent({ url: `${base}/agui/demo.trivia`, threadId: agent.threadId,
                               headers });
  const errors = [];
  const backSeen = [];
  back.subscribe({ onEvent({ event }) { backSeen.push(event.type); },
                   onRunErrorEvent({ event }) { errors.push(event); } });
  back.addMessage({ id: randomUUID(), role: "user", content: "quiz me" });
  const done = await back.runAgent();
  report.reconnect = { answered: answered.status, result: done.result ?? null, errors,
                       pendingAfter: back.pendingInterrupts.length,
                       last: back.messages.at(-1)?.content ?? null,
                       paused: seen, seen: backSeen };
}

// Every event of a paused run's stream and of its finishing resume, checked one by one
// against this client's own zod schemas (what runAgent does too, but here a rejected
// event is named instead of failing the whole run).
async function rawEvents(agentName, body) {
  const reply = await fetch(`${base}/agui/${agentName}`, {
    method: "POST", body: JSON.stringify(body),
    headers: { ...headers, "Content-Type": "application/json", Accept: "text/event-stream" } });
  const text = await reply.text();
  return text.split("\n\n").filter(f => f.startsWith("data: "))
    .map(f => JSON.parse(f.slice("data: ".length)));
}
{
  const threadId = `node-raw-${randomUUID()}`;
  const input = { threadId, runId: randomUUID(), state: {}, tools: [], context: [],
                  forwardedProps: {} };
  const paused = await rawEvents("demo.transfer", { ...input, messages: [
    { id: randomUUID(), role: "user", content: "Send 3 to Gus" }] });
  const intr = paused.at(-1).outcome.interrupts[0];
  const finished = await rawEvents("demo.transfer", { ...input, messages: [], resume: [
    { interruptId: intr.id, status: "cancelled", metadata: { reason: "no" } }] });
  const rejected = [...paused, ...finished].flatMap(event => {
    const parsed = client.EventSchemas.safeParse(event);
    return parsed.success ? [] : [{ event, error: String(parsed.error) }];
  });
  report.schemas = { paused: paused.map(e => e.type), finished: finished.map(e => e.type),
                     rejected };
}

console.log(JSON.stringify(report));
