"""The AG-UI endpoint (`POST /agui/{agent}`) through real HTTP on the shared system: a run
that pauses, its resume, several interrupts at once, refusals (missing, partial, expired or
invalid resumes), replayed resumes, reconnecting after an answer given elsewhere; and the
pure translation of layby events into AG-UI events."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from ag_ui.core import RunFinishedEvent

from layby.generation.messages import Message, Part, ToolRequest, ToolResponse, text_message
from layby.http import agui
from layby.wire import Event
from tests.support import npm
from tests.support.harness import API_KEY, LaybySystem, wait_until


def _post(system: LaybySystem, agent: str, thread: str, *, text: str | None = None,
          resume: list[dict[str, Any]] | None = None, run_id: str | None = None,
          key: str | None = "default", deadline_s: float = 30) -> list[dict[str, Any]]:
    """One AG-UI request; the events of its stream (each `data: <json>` frame)."""
    body: dict[str, Any] = {"threadId": thread, "runId": run_id or f"r-{uuid.uuid4().hex[:8]}",
                            "messages": [], "state": {"page": "checkout"}, "tools": [],
                            "context": [], "forwardedProps": {}}
    if text is not None:
        body["messages"] = [{"id": "u1", "role": "user", "content": text}]
    if resume is not None:
        body["resume"] = resume
    api = system.api() if key == "default" else system.api(key=key)
    events: list[dict[str, Any]] = []
    ends = time.monotonic() + deadline_s
    with api, api.stream("POST", f"/agui/{agent}", json=body,
                         headers={"Accept": "text/event-stream"}) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"].startswith("text/event-stream")
        buffer = ""
        for chunk in reply.iter_text():
            assert time.monotonic() < ends, f"stream still open after {deadline_s} s: {events}"
            buffer += chunk
            while "\n\n" in buffer:
                frame, buffer = buffer.split("\n\n", 1)
                if frame.startswith("data: "):
                    events.append(json.loads(frame[len("data: "):]))
    assert events[0]["type"] == "RUN_STARTED", events
    assert events[0]["threadId"] == thread and events[0]["runId"] == body["runId"]
    return events


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def _last(events: list[dict[str, Any]]) -> dict[str, Any]:
    assert _types(events)[-1] in ("RUN_FINISHED", "RUN_ERROR"), _types(events)
    return events[-1]


def _interrupts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    end = _last(events)
    assert end["type"] == "RUN_FINISHED", end
    assert end["outcome"]["type"] == "interrupt", end
    return end["outcome"]["interrupts"]


def _thread() -> str:
    return f"t-{uuid.uuid4()}"


def _run_of(system: LaybySystem, thread: str) -> dict[str, Any]:
    return system.run(agui.thread_run_id(thread))


# -- over HTTP -----------------------------------------------------------------------------


def test_agui_wants_an_api_key(system: LaybySystem) -> None:
    for key in (None, "wrong"):
        with system.api(key=key) as api:
            reply = api.post("/agui/demo.transfer", json={"threadId": "x", "runId": "y",
                                                          "messages": []})
        assert reply.status_code == 401, reply.text


def test_unknown_agent_is_404(system: LaybySystem) -> None:
    with system.api() as api:
        reply = api.post("/agui/nope", json={"threadId": "x", "runId": "y", "messages": []})
    assert reply.status_code == 404, reply.text


def test_transfer_pauses_then_resume_completes(system: LaybySystem) -> None:
    thread = _thread()
    events = _post(system, "demo.transfer", thread, text="Send 250 to Bob")
    types = _types(events)
    assert types[:4] == ["RUN_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"]
    assert types[-3:] == ["STATE_SNAPSHOT", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    (intr,) = _interrupts(events)
    assert set(intr) <= set(agui.AGUI_FIELDS)
    assert intr["reason"] == "confirmation" and intr["message"] == "Send 250 to Bob?"
    assert intr["toolCallId"] == events[1]["toolCallId"]
    assert events[1]["toolCallName"] == "transfer_funds"
    assert intr["responseSchema"]["properties"]["approved"]
    state = events[-3]["snapshot"]
    assert state["page"] == "checkout" and state["layby"]["interrupts"] == [intr["id"]]
    snapshot = events[-2]["messages"]
    assert snapshot[0] == {"id": "u1", "role": "user", "content": "Send 250 to Bob"}
    assert snapshot[1]["toolCalls"][0]["id"] == intr["toolCallId"]
    run = _run_of(system, thread)
    assert run["status"] == "interrupted"

    # The resume reuses the previous runId (CopilotKit does).
    done = _post(system, "demo.transfer", thread, run_id=events[0]["runId"],
                 resume=[{"interruptId": intr["id"], "status": "resolved",
                          "payload": {"approved": True}}])
    types = _types(done)
    assert "TOOL_CALL_START" not in types  # the client has the call already
    result = next(e for e in done if e["type"] == "TOOL_CALL_RESULT")
    assert result["toolCallId"] == intr["toolCallId"] and '"sent"' in result["content"]
    text = "".join(e["delta"] for e in done if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "Sent 250 to Bob."
    end = _last(done)
    assert end["type"] == "RUN_FINISHED" and end["result"] == "Sent 250 to Bob."
    assert "outcome" not in end
    run = _run_of(system, thread)
    assert run["status"] == "completed"
    assert run["interrupts"][0]["answer"]["channel"] == "agui"

    # The same resume again: a replay, not a conflict; it reports the outcome again.
    again = _post(system, "demo.transfer", thread,
                  resume=[{"interruptId": intr["id"], "status": "resolved",
                           "payload": {"approved": True}}])
    assert _last(again)["type"] == "RUN_FINISHED"
    assert _last(again)["result"] == "Sent 250 to Bob."
    # A different answer to what is closed is refused.
    rival = _post(system, "demo.transfer", thread,
                  resume=[{"interruptId": intr["id"], "status": "cancelled"}])
    assert _types(rival) == ["RUN_STARTED", "RUN_ERROR"]
    assert rival[-1]["code"] == "conflict"
    assert len([t for t in system.ledger()["transfers"] if t["run"] == run["id"]]) == 1


def _tool_responses(run: dict[str, Any], call_id: str) -> list[dict[str, Any]]:
    """The tool responses for `call_id` in the run's history (wire form)."""
    return [part["toolResponse"] for message in run["messages"]
            for part in message.get("content", []) if isinstance(part, dict)
            and (part.get("toolResponse") or {}).get("ref") == call_id]


def test_copilotkit_duplicate_tool_message_is_not_applied_twice(system: LaybySystem) -> None:
    """CopilotKit resumes a `tool_call` interrupt with `resume` AND a tool message for the
    same toolCallId in `messages`; the resume entry is the answer, the tool message is not
    applied again (no second run, nothing added to history)."""
    thread = _thread()
    events = _post(system, "demo.transfer", thread, text="Send 40 to Hal")
    (intr,) = _interrupts(events)
    call_id = intr["toolCallId"]
    snapshot = next(e for e in events if e["type"] == "MESSAGES_SNAPSHOT")["messages"]
    body = {"threadId": thread, "runId": events[0]["runId"], "state": {}, "tools": [],
            "context": [], "forwardedProps": {},
            # What CopilotKit sends: the thread as it knows it, plus the tool message for
            # the interrupted call (here with a different content than the resume payload).
            "messages": [*snapshot, {"id": "tool-dup", "role": "tool", "toolCallId": call_id,
                                     "content": json.dumps({"approved": False})}],
            "resume": [{"interruptId": intr["id"], "status": "resolved",
                        "payload": {"approved": True}}]}
    with system.api() as api:
        reply = api.post("/agui/demo.transfer", json=body,
                         headers={"Accept": "text/event-stream"})
    assert reply.status_code == 200, reply.text
    done = [json.loads(f[len("data: "):]) for f in reply.text.split("\n\n")
            if f.startswith("data: ")]
    end = _last(done)
    assert end["type"] == "RUN_FINISHED" and end["result"] == "Sent 40 to Hal.", done
    results = [e for e in done if e["type"] == "TOOL_CALL_RESULT"]
    assert [e["toolCallId"] for e in results] == [call_id]
    run = _run_of(system, thread)
    assert run["status"] == "completed"
    (response,) = _tool_responses(run, call_id)
    assert "sent" in json.dumps(response["output"])
    assert run["interrupts"][0]["state"] == "resolved"
    assert run["interrupts"][0]["answer"]["payload"] == {"approved": True}
    transfers = [t for t in system.ledger()["transfers"] if t["run"] == run["id"]]
    assert len(transfers) == 1
    # Only one run behind the thread: the tool message did not start another.
    assert len([m for m in run["messages"] if m["role"] == "user"]) == 1

    # The same request again (CopilotKit retrying): a replay; still one response, one
    # transfer.
    with system.api() as api:
        again = api.post("/agui/demo.transfer", json=body,
                         headers={"Accept": "text/event-stream"})
    assert '"RUN_FINISHED"' in again.text and '"RUN_ERROR"' not in again.text, again.text
    run = _run_of(system, thread)
    assert len(_tool_responses(run, call_id)) == 1
    assert len([t for t in system.ledger()["transfers"] if t["run"] == run["id"]]) == 1


def test_first_post_is_idempotent_on_the_thread(system: LaybySystem) -> None:
    thread = _thread()
    first = _post(system, "demo.transfer", thread, text="Send 5 to Ann")
    (intr,) = _interrupts(first)
    # The same input again on a paused thread: an error; the interrupt stays open.
    again = _post(system, "demo.transfer", thread, text="Send 5 to Ann")
    assert _types(again) == ["RUN_STARTED", "RUN_ERROR"]
    assert again[-1]["code"] == "conflict" and intr["id"] in again[-1]["message"]
    assert again[-1]["metadata"]["layby"]["open"] == [intr["id"]]
    run = _run_of(system, thread)
    assert [i["state"] for i in run["interrupts"]] == ["open"]
    # Another agent on the same thread is refused.
    other = _post(system, "demo.trivia", thread, text="quiz me")
    assert _types(other) == ["RUN_STARTED", "RUN_ERROR"]


def test_parallel_resume_must_answer_both(system: LaybySystem) -> None:
    thread = _thread()
    events = _post(system, "demo.parallel", thread, text="pay Carol")
    starts = [e for e in events if e["type"] == "TOOL_CALL_START"]
    assert [e["toolCallName"] for e in starts] == ["ask_question", "transfer_funds",
                                                   "check_balance"]
    intrs = _interrupts(events)
    assert sorted(i["reason"] for i in intrs) == ["confirmation", "input_required"]
    question = next(i for i in intrs if i["reason"] == "input_required")
    approval = next(i for i in intrs if i["reason"] == "confirmation")

    one = _post(system, "demo.parallel", thread,
                resume=[{"interruptId": question["id"], "status": "resolved",
                         "payload": "savings"}])
    assert _types(one) == ["RUN_STARTED", "RUN_ERROR"]
    assert "every open interrupt" in one[-1]["message"]
    run = _run_of(system, thread)
    assert [i["state"] for i in run["interrupts"]] == ["open", "open"]

    done = _post(system, "demo.parallel", thread,
                 resume=[{"interruptId": question["id"], "status": "resolved",
                          "payload": "savings"},
                         {"interruptId": approval["id"], "status": "resolved",
                          "payload": {"approved": True}}])
    results = {e["toolCallId"] for e in done if e["type"] == "TOOL_CALL_RESULT"}
    assert results == {e["toolCallId"] for e in starts}
    end = _last(done)
    assert end["type"] == "RUN_FINISHED"
    assert end["result"] == "Paying from savings; transfer sent; balance was 1000."


def test_a_background_job_beside_a_question_is_not_asked_of_the_client(
        system: LaybySystem) -> None:
    """One turn starts a report (a background job) and asks a question: the client is asked
    only the question, its resume answers only that, and the run completes once the job has
    answered itself."""
    thread = _thread()
    events = _post(system, "test.mixed", thread, text="report")
    (question,) = _interrupts(events)
    assert question["reason"] == "input_required" and question["message"] == "Which format?"

    done = _post(system, "test.mixed", thread,
                 resume=[{"interruptId": question["id"], "status": "resolved",
                          "payload": "pdf"}])

    assert _types(done)[-1] == "RUN_FINISHED"
    assert (_last(done).get("outcome") or {}).get("type") != "interrupt", _last(done)
    run = system.wait_status(_run_of(system, thread)["id"], "completed", timeout=30)
    assert run["result"] == "Report on sales as pdf."
    answers = {i["reason"]: i["answer"]["channel"] for i in run["interrupts"]}
    assert answers == {"input_required": "agui", "layby:background_job": "job"}


def test_invalid_answer_is_an_error_and_stays_open(system: LaybySystem) -> None:
    thread = _thread()
    (intr,) = _interrupts(_post(system, "demo.transfer", thread, text="Send 7 to Dan"))
    bad = _post(system, "demo.transfer", thread,
                resume=[{"interruptId": intr["id"], "status": "resolved",
                         "payload": {"approved": "yes please"}}])
    assert _types(bad) == ["RUN_STARTED", "RUN_ERROR"] and bad[-1]["code"] == "invalid"
    unknown = _post(system, "demo.transfer", thread,
                    resume=[{"interruptId": "int_nope", "status": "cancelled"}])
    assert _types(unknown) == ["RUN_STARTED", "RUN_ERROR"]
    assert [i["state"] for i in _run_of(system, thread)["interrupts"]] == ["open"]
    declined = _post(system, "demo.transfer", thread,
                     resume=[{"interruptId": intr["id"], "status": "cancelled",
                              "metadata": {"reason": "not today"}}])
    assert _last(declined)["result"] == ("Transfer cancelled: not today. No money was sent.")


def test_resume_on_unknown_thread(system: LaybySystem) -> None:
    events = _post(system, "demo.transfer", _thread(),
                   resume=[{"interruptId": "int_x", "status": "cancelled"}])
    assert _types(events) == ["RUN_STARTED", "RUN_ERROR"] and events[-1]["code"] == "notfound"
    empty = _post(system, "demo.transfer", _thread())
    assert _types(empty) == ["RUN_STARTED", "RUN_ERROR"] and empty[-1]["code"] == "invalid"


def test_expired_answer_is_an_error(system: LaybySystem) -> None:
    # The shared system runs with LAYBY_DEMO_EXPIRY_S=2 (tests.support.harness.BASE_ENV).
    thread = _thread()
    (intr,) = _interrupts(_post(system, "demo.expiring", thread, text="deploy"))
    expires_at = datetime.fromisoformat(intr["expiresAt"].replace("Z", "+00:00"))
    wait_until(lambda: datetime.now(UTC) > expires_at + timedelta(seconds=0.5), 30,
               what="the interrupt to expire")
    late = _post(system, "demo.expiring", thread,
                 resume=[{"interruptId": intr["id"], "status": "resolved",
                          "payload": {"approved": True}}])
    assert _types(late) == ["RUN_STARTED", "RUN_ERROR"] and late[-1]["code"] == "conflict"
    assert "expired" in late[-1]["message"]
    # The expiry policy (cancel) applied, not the late answer; a reconnect reports it.
    run = system.wait_status(agui.thread_run_id(thread), "completed")
    assert run["interrupts"][0]["state"] != "resolved"
    back = _post(system, "demo.expiring", thread)
    assert _last(back)["type"] == "RUN_FINISHED"
    assert "not approved in time" in _last(back)["result"]


def test_reconnect_after_an_answer_through_v1(system: LaybySystem) -> None:
    thread = _thread()
    events = _post(system, "demo.trivia", thread, text="quiz me")
    assert [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"] == [
        "Here is a question for you."]
    (intr,) = _interrupts(events)
    assert intr["reason"] == "input_required"
    reply = system.answer(agui.thread_run_id(thread), intr["id"], payload="Jaws")
    assert reply.status_code == 200, reply.text
    back = _post(system, "demo.trivia", thread, text="quiz me")
    assert "TEXT_MESSAGE_START" in _types(back)
    end = _last(back)
    assert end["type"] == "RUN_FINISHED" and end["result"] == "Right! It was Jaws (1975)."
    # The AG-UI resume with the answer given through /v1 is a replay: it follows too.
    replay = _post(system, "demo.trivia", thread,
                   resume=[{"interruptId": intr["id"], "status": "resolved",
                            "payload": "Jaws"}])
    assert _last(replay)["result"] == "Right! It was Jaws (1975)."


def test_bbq_pauses_three_times(system: LaybySystem) -> None:
    thread = _thread()
    events = _post(system, "demo.bbq", thread, text="plan a bbq")
    for answer in ("12", "vegan", "gas"):
        (intr,) = _interrupts(events)
        events = _post(system, "demo.bbq", thread,
                       resume=[{"interruptId": intr["id"], "status": "resolved",
                                "payload": answer}])
    assert _last(events)["result"].startswith("BBQ plan: 12 guests, vegan menu, on a gas")


def test_a_tool_tried_again_is_told_to_the_client_and_the_stream_goes_on(
        system: LaybySystem) -> None:
    """test.exporter's tool asks to be tried again in a second: the stream says so in a
    CUSTOM event (which call, which attempt comes, the error, when), then follows the run
    to its end."""
    events = _post(system, "test.exporter", _thread(), text="1")
    [told] = [e for e in events if e["type"] == "CUSTOM"]
    assert told["name"] == "layby:tool_retry"
    [call] = told["value"]["calls"]
    assert (call["toolName"], call["attempt"], call["maxAttempts"]) == ("export_day", 2, 5)
    assert call["lastError"] == "RetryLater: exporter busy"
    assert told["value"]["nextAttemptAt"].endswith("Z")
    results = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert len(results) == 1 and results[0]["toolCallId"] == call["toolCallId"]
    assert _last(events)["type"] == "RUN_FINISHED"
    assert _last(events)["result"].startswith("exported on attempt 2")


# -- translation (pure) --------------------------------------------------------------------


def test_thread_run_ids() -> None:
    assert agui.thread_run_id("abc-1") == "agui_abc-1"
    odd = agui.thread_run_id("thread with spaces/and slashes")
    assert odd.startswith("agui.") and len(odd) == 45
    assert agui.thread_run_id("x" * 200).startswith("agui.")


def _event(kind: str, data: Any) -> Event:
    return Event(id="1-0", type=kind, version=1, at="2025-01-01T00:00:00.000Z", data=data)


def test_translate_messages_and_pause() -> None:
    cursor = agui.Cursor("t", "r", "run_1", seen=0)
    model = Message(role="model", content=[
        Part(text="Checking."),
        Part(tool_request=ToolRequest(name="ask", ref="c1", input={"q": 1}),
             metadata={"interrupt": {"id": "int_1"}})])
    spec = {"id": "int_1", "reason": "input_required", "message": "?", "toolCallId": "c1",
            "toolName": "ask", "mode": "respond", "turn": 0}
    out, ending = agui.translate(cursor, _event("run.interrupted", {
        "from": 1, "messages": [model.wire()], "interrupts": [spec]}))
    assert ending == "pause" and cursor.seen == 2
    assert [e.type.value for e in out] == [
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"]
    history = [text_message("user", "hi"), model]
    pause = agui.pause_events(cursor, history, [spec], {"a": 1}, "u-9")
    finished = pause[-1]
    assert isinstance(finished, RunFinishedEvent)
    wire = finished.model_dump(mode="json", by_alias=True)
    assert wire["outcome"] == {"type": "interrupt", "interrupts": [
        {"id": "int_1", "reason": "input_required", "message": "?", "toolCallId": "c1"}]}
    msgs = pause[1].model_dump(mode="json", by_alias=True)["messages"]
    assert msgs[0]["id"] == "u-9" and msgs[1]["toolCalls"][0]["function"]["arguments"] == \
        '{"q": 1}'

    # The resume rewrites the parked message (index 1): not sent again; the tool message is.
    tool = Message(role="tool", content=[Part(tool_response=ToolResponse(
        name="ask", ref="c1", output="Jaws"))])
    done = text_message("model", "Right.")
    out, ending = agui.translate(cursor, _event("turn.committed", {
        "from": 1, "messages": [model.wire(), tool.wire()]}))
    assert ending is None
    assert [e.type.value for e in out] == ["TOOL_CALL_RESULT"]
    assert out[0].content == "Jaws" and out[0].tool_call_id == "c1"
    out, ending = agui.translate(cursor, _event("run.completed", {
        "from": 3, "messages": [done.wire()], "result": "Right."}))
    assert ending == "end" and out[-1].result == "Right."
    out, ending = agui.translate(cursor, _event("run.failed", {"code": "model_error",
                                                               "message": "boom"}))
    assert ending == "end" and out[-1].code == "model_error"


def test_a_client_reconnecting_while_a_job_runs_follows_it(system: LaybySystem) -> None:
    """demo.report waits on its background job: a client that reconnects meanwhile is not
    asked to answer anything; its stream follows the run to the report."""
    thread = _thread()
    with system.api() as api:  # starts the thread's run; the stream is left at once
        body = {"threadId": thread, "runId": "r-start", "state": {}, "tools": [],
                "context": [], "forwardedProps": {},
                "messages": [{"id": "u1", "role": "user", "content": "sales"}]}
        with api.stream("POST", "/agui/demo.report", json=body) as reply:
            assert reply.status_code == 200
    system.wait_status(_run_of(system, thread)["id"], "interrupted", "completed")

    events = _post(system, "demo.report", thread)

    assert "RUN_ERROR" not in _types(events), events
    assert _last(events)["type"] == "RUN_FINISHED"
    assert "Report on sales" in _last(events)["result"]


def test_background_job_parks_are_followed() -> None:
    cursor = agui.Cursor("t", "r", "run_1")
    job = {"id": "int_j", "reason": "layby:background_job", "toolCallId": "c1"}
    _, ending = agui.translate(cursor, _event("run.interrupted", {
        "from": 1, "messages": [], "interrupts": [job]}))
    assert ending is None


# -- the real @ag-ui/client ----------------------------------------------------------------

NODE_DIR = Path(__file__).resolve().parent / "agui_node"  # @ag-ui/client 1.0.x, drive.mjs
# @ag-ui/client 0.0.59: the version CopilotKit's React package pins (same driver).
NODE_DIR_0059 = Path(__file__).resolve().parent / "agui_node_0059"


def _drive(system: LaybySystem, folder: Path) -> dict[str, Any]:
    """Run drive.mjs with the client installed in `folder`; its JSON report."""
    npm.installed(folder, "@ag-ui/client", "the AG-UI client's tests")
    version = json.loads((folder / "node_modules" / "@ag-ui" / "client" /
                          "package.json").read_text())["version"]
    pinned = json.loads((folder / "package.json").read_text())["dependencies"]["@ag-ui/client"]
    assert version.startswith(pinned.rstrip("x").rstrip(".")), (version, pinned)
    done = subprocess.run(["node", str(NODE_DIR / "drive.mjs"), system.base_url, API_KEY],
                          cwd=folder, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("folder", [NODE_DIR, NODE_DIR_0059], ids=["client-1.0", "client-0.0.59"])
def test_real_agui_client(system: LaybySystem, folder: Path) -> None:
    report = _drive(system, folder)

    transfer = report["transfer"]
    (intr,) = transfer["interrupts"]
    assert intr["reason"] == "confirmation" and intr["message"] == "Send 30 to Eve?"
    assert transfer["toolCalls"] == [intr["toolCallId"]]
    assert transfer["result"] == "Sent 30 to Eve." and transfer["pendingAfter"] == 0
    assert "finished:interrupt" in transfer["seen"] and "finished:success" in transfer["seen"]
    assert [m["role"] for m in transfer["messages"]] == ["user", "assistant", "tool",
                                                          "assistant"]
    assert transfer["messages"][-1]["content"] == "Sent 30 to Eve."

    parallel = report["parallel"]
    assert parallel["reasons"] == ["confirmation", "input_required"]
    # The client itself refuses a resume that leaves one open (the server too, see above).
    assert parallel["partial"] and "not addressed by resume" in parallel["partial"]
    assert parallel["result"] == ("Paying from main; transfer declined; "
                                  "balance was 1000.")

    assert report["noResume"]["waiting"] == 1
    no_resume = report["noResume"]
    # The client refuses input while it knows of a pending interrupt; a client that forgot
    # it (a reloaded page) gets RUN_ERROR from the server (runAgent itself resolves).
    assert "not addressed by resume" in no_resume["refusedByClient"]
    (error,) = no_resume["errors"]
    assert error["code"] == "conflict" and "resume" in error["message"]
    assert no_resume["result"].startswith("Not quite: you said Alien")

    # An expired interrupt: the client refuses to send it; a client that sends it anyway
    # gets RUN_ERROR (runAgent resolves), and the expiry policy applied.
    expired = report["expired"]
    assert expired["refusedByClient"] and "expired" in expired["refusedByClient"]
    (error,) = expired["errors"]
    assert error["code"] == "conflict" and "expired" in error["message"]
    run = system.wait_status(agui.thread_run_id(expired["threadId"]), "completed")
    assert run["interrupts"][0]["state"] != "resolved"

    # A replayed resume: no error, the same result, one transfer.
    replay = report["replay"]
    assert replay["errors"] == []
    assert replay["first"] == replay["replayed"] == "Sent 12 to Fay."
    run_id = agui.thread_run_id(replay["threadId"])
    assert len([t for t in system.ledger()["transfers"] if t["run"] == run_id]) == 1

    # Answered through /v1, then a plain run on the thread: the client sees it finish.
    reconnect = report["reconnect"]
    assert reconnect["answered"] == 200 and reconnect["errors"] == []
    assert reconnect["result"] == reconnect["last"] == "Right! It was Jaws (1975)."
    assert reconnect["pendingAfter"] == 0 and "RUN_FINISHED" in reconnect["seen"]

    # Every event of a paused and of a finished (declined) run passes the client's schemas.
    schemas = report["schemas"]
    assert schemas["rejected"] == []
    assert schemas["paused"][0] == "RUN_STARTED" and schemas["paused"][-1] == "RUN_FINISHED"
    assert schemas["finished"][-1] == "RUN_FINISHED"
    assert "TOOL_CALL_RESULT" in schemas["finished"]


def test_a_call_stored_without_a_ref_keeps_one_id_from_request_to_result() -> None:
    # A history written without refs (a client's, or the scripted model's): the request's
    # TOOL_CALL_* events, its result, and the MESSAGES_SNAPSHOT must name the same call.
    from layby.generation.messages import Message, Part, ToolRequest, ToolResponse
    from layby.http.agui import agui_messages, message_events

    history = [Message(role="user", content=[Part(text="hi")]),
               Message(role="model", content=[Part(tool_request=ToolRequest(name="lookup"))]),
               Message(role="tool", content=[Part(tool_response=ToolResponse(
                   name="lookup", output="found"))])]
    asked = {e.tool_call_id for e in message_events("run_x", 1, history[1])}
    answered = {e.tool_call_id for e in message_events("run_x", 2, history[2])}
    snapshot = agui_messages("run_x", history)
    assert len(asked) == 1 and asked == answered
    assert [c.id for c in snapshot[1].tool_calls] == [*asked]
    assert snapshot[2].tool_call_id in asked
