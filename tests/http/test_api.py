"""The HTTP API's contract, through real HTTP on the shared system: keys, refusals
(404/409/422), resume, idempotency, listing, cancel, interrupts that come back, limits,
server-sent events and the published OpenAPI document."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import httpx
import redis

from tests.support import sse
from tests.support.harness import API_KEY, LaybySystem

TOO_BIG = 600 * 1024  # over LAYBY_MAX_ANSWER_BYTES (256 KiB by default)
JSON_TYPE = "application/json"


def _parked(system: LaybySystem, agent: str, text: str, count: int = 1
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    run = system.start_run(agent, text)
    parked = system.wait_status(run["id"], "interrupted")
    waiting = system.open_interrupts(parked)
    assert len(waiting) == count, parked["interrupts"]
    return parked, waiting


def _refused(reply: httpx.Response, status: int) -> dict[str, Any]:
    """The reply is the JSON error a client can show: status, code and a message."""
    assert reply.status_code == status, f"{reply.status_code}: {reply.text[:500]}"
    assert reply.headers["content-type"].startswith("application/json"), reply.headers
    error = reply.json()["error"]
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    return error


def _post(system: LaybySystem, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
    with system.api() as api:
        if body is not None:
            kwargs["json"] = body
        return api.post(path, **kwargs)


def _latest_start(api: httpx.Client) -> str:
    """When the newest run was created (a new run is also the most recently updated)."""
    runs = api.get("/v1/runs", params={"limit": 50}).json()["runs"]
    return max(r["createdAt"] for r in runs)


# -- keys ------------------------------------------------------------------------------


# Authorization headers that carry no valid key, as raw bytes: none, unknown, a key one
# character too long, non-ASCII (hmac.compare_digest raised TypeError on it: a 500), a
# scheme with no key, a key with no scheme, and a key longer than any configured.
REFUSED_AUTHORIZATIONS = (None, b"Bearer wrong-key", f"Bearer {API_KEY}x".encode(),
                          "Bearer été".encode(), b"Bearer \xff\xfe", b"Bearer", b"Bearer a b",
                          b"Basic " + API_KEY.encode(), API_KEY.encode(),
                          b"Bearer " + b"k" * 600)


def test_every_keyed_route_refuses_every_bad_authorization_with_401(system: LaybySystem
                                                                     ) -> None:
    with system.api(key=None) as anonymous:
        spec = anonymous.get("/openapi.json").json()
    routes = [(method, path) for path, ops in spec["paths"].items()
              if path.startswith(("/v1", "/agui")) for method in ops]
    assert len(routes) >= 9 and any(p.startswith("/agui") for _, p in routes), routes
    run = system.start_run("demo.trivia", "quiz me")  # a real run: no 404 to hide behind
    for method, template in routes:
        path = (template.replace("{run_id}", run["id"]).replace("{interrupt_id}", "int_x")
                .replace("{agent}", "demo.trivia"))
        for authorization in REFUSED_AUTHORIZATIONS:
            headers = {"content-type": "application/json"}
            if authorization is not None:
                headers["authorization"] = authorization  # type: ignore[assignment]
            with system.api(key=None) as api:
                # A valid-looking body and a broken one: neither gets past the key check.
                for content in (b'{"status": "resolved", "payload": "Jaws"}', b"{broken"):
                    reply = api.request(method.upper(), path, content=content,
                                        headers=headers)
                    error = _refused(reply, 401)
                    assert reply.headers["www-authenticate"] == "Bearer", (method, path)
                    assert "Authorization: Bearer" in error["message"]
    with system.api() as api:
        assert api.get("/v1/runs").status_code == 200
    # None of those requests answered or cancelled anything.
    parked = system.wait_status(run["id"], "interrupted")
    assert [i["state"] for i in parked["interrupts"]] == ["open"]


def test_a_key_in_another_scheme_is_refused(system: LaybySystem) -> None:
    for header in (f"Basic {API_KEY}", API_KEY, f"Bearer  {API_KEY}x"):
        reply = httpx.get(f"{system.base_url}/v1/runs", headers={"Authorization": header})
        _refused(reply, 401)


# -- 404 --------------------------------------------------------------------------------


def test_unknown_run_is_404_on_every_run_route(system: LaybySystem) -> None:
    with system.api() as api:
        replies = [api.get("/v1/runs/run_does_not_exist"),
                   api.get("/v1/runs/run_does_not_exist/events"),
                   api.post("/v1/runs/run_does_not_exist/cancel"),
                   api.post("/v1/runs/run_does_not_exist/interrupts/int_x",
                            json={"status": "resolved", "payload": "Jaws"}),
                   api.post("/v1/runs/run_does_not_exist/resume", json={"resume": [
                       {"interruptId": "int_x", "status": "resolved", "payload": "Jaws"}]})]
    for reply in replies:
        error = _refused(reply, 404)
        assert "run_does_not_exist" in error["message"]


def test_answer_naming_an_unknown_interrupt_is_refused(system: LaybySystem) -> None:
    run, (question,) = _parked(system, "demo.trivia", "quiz me")
    error = _refused(system.answer(run["id"], "int_not_a_real_one", payload="Jaws"), 404)
    assert "int_not_a_real_one" in error["message"]
    assert error["detail"]["interruptId"] == "int_not_a_real_one"
    # In a resume too, even next to a valid entry; nothing of it is recorded.
    reply = _post(system, f"/v1/runs/{run['id']}/resume", {"resume": [
        {"interruptId": question["id"], "status": "resolved", "payload": "Jaws"},
        {"interruptId": "int_not_a_real_one", "status": "resolved", "payload": "Jaws"}]})
    _refused(reply, 404)
    still = system.run(run["id"])
    assert still["status"] == "interrupted"
    assert system.open_interrupts(still)[0]["id"] == question["id"]
    assert system.answer(run["id"], question["id"], payload="Jaws").status_code == 200
    assert system.wait_status(run["id"], "completed")["result"].startswith("Right!")


def test_unknown_agent_is_404_naming_the_known_ones(system: LaybySystem) -> None:
    reply = _post(system, "/v1/runs", {"agent": "demo.nope", "input": "hello"})
    error = _refused(reply, 404)
    assert "demo.nope" in error["message"]
    assert "demo.trivia" in error["message"]
    assert {"demo.trivia", "demo.transfer", "test.twice"} <= set(error["detail"]["agents"])


# -- 409 --------------------------------------------------------------------------------


def test_second_answer_is_refused_naming_who_answered_first(system: LaybySystem) -> None:
    run, (question,) = _parked(system, "demo.trivia", "quiz me")
    first = system.answer(run["id"], question["id"], payload="Alien")
    assert first.status_code == 200, first.text
    second = system.answer(run["id"], question["id"], payload="Jaws")
    error = _refused(second, 409)
    recorded = error["detail"]["answer"]
    assert recorded["answeredBy"].startswith("api-key:")
    assert recorded["channel"] == "api"
    assert recorded["payload"] == "Alien"
    assert recorded["answeredBy"] in error["message"] and "api" in error["message"]
    done = system.wait_status(run["id"], "completed")
    assert "you said Alien" in done["result"]  # the first answer is the one that counts


def test_answer_after_the_run_completed_is_refused(system: LaybySystem) -> None:
    run, (question,) = _parked(system, "demo.trivia", "quiz me")
    assert system.answer(run["id"], question["id"], payload="Jaws").status_code == 200
    done = system.wait_status(run["id"], "completed")
    late = system.answer(run["id"], question["id"], payload="Alien")
    error = _refused(late, 409)
    assert error["detail"]["answer"]["payload"] == "Jaws"
    after = system.run(run["id"])
    assert after["status"] == "completed" and after["result"] == done["result"]
    assert after["updatedAt"] == done["updatedAt"]


def test_cancel_of_a_finished_run_is_refused(system: LaybySystem) -> None:
    run, (question,) = _parked(system, "demo.trivia", "quiz me")
    system.answer(run["id"], question["id"], payload="Jaws")
    system.wait_status(run["id"], "completed")
    error = _refused(_post(system, f"/v1/runs/{run['id']}/cancel"), 409)
    assert error["detail"]["status"] == "completed"
    assert system.run(run["id"])["status"] == "completed"


# -- 422 --------------------------------------------------------------------------------


def test_payload_outside_the_schema_lists_errors_and_leaves_it_open(system: LaybySystem
                                                                    ) -> None:
    run, (approval,) = _parked(system, "demo.transfer", "Send 30 to Dan")
    reply = system.answer(run["id"], approval["id"], payload={"approved": "yes please"})
    error = _refused(reply, 422)
    assert error["detail"]["interruptId"] == approval["id"]
    paths = {e["path"] for e in error["detail"]["errors"]}
    assert "/approved" in paths, error
    assert all(e["message"] for e in error["detail"]["errors"])
    missing = _refused(system.answer(run["id"], approval["id"], payload={"note": "hi"}), 422)
    assert any("approved" in e["message"] for e in missing["detail"]["errors"])
    still = system.run(run["id"])
    assert still["status"] == "interrupted"
    assert system.open_interrupts(still)[0].get("answer") is None
    ok = system.answer(run["id"], approval["id"], payload={"approved": True})
    assert ok.status_code == 200, ok.text
    assert system.wait_status(run["id"], "completed")["result"] == "Sent 30 to Dan."


def test_malformed_answers_are_refused_and_change_nothing(system: LaybySystem) -> None:
    run, (question,) = _parked(system, "demo.trivia", "quiz me")
    path = f"/v1/runs/{run['id']}/interrupts/{question['id']}"
    with system.api() as api:
        broken = api.post(path, content=b'{"status": "resolved", "payload": ',
                          headers={"content-type": "application/json"})
        wrong_status = api.post(path, json={"status": "approved", "payload": "Jaws"})
        no_status = api.post(path, json={"payload": "Jaws"})
        unknown_field = api.post(path, json={"status": "resolved", "payload": "Jaws",
                                             "approve": True})
        metadata_not_object = api.post(path, json={"status": "resolved", "payload": "Jaws",
                                                   "metadata": ["x"]})
    assert _refused(broken, 422)["detail"][0]["message"] == (
        "the body is not valid JSON: Expecting value at line 1, column 35")
    assert "/status" in {e["path"] for e in _refused(wrong_status, 422)["detail"]}
    assert "/status" in {e["path"] for e in _refused(no_status, 422)["detail"]}
    assert "/approve" in {e["path"] for e in _refused(unknown_field, 422)["detail"]}
    assert "/metadata" in {e["path"] for e in _refused(metadata_not_object, 422)["detail"]}
    assert system.open_interrupts(system.run(run["id"]))[0]["id"] == question["id"]
    assert not [e for e in sse.history(system, run["id"]) if e["event"] == "interrupt.answered"]


def test_start_requests_need_an_agent_and_exactly_one_of_input_or_messages(
        system: LaybySystem) -> None:
    message = {"role": "user", "content": [{"text": "quiz me"}]}
    cases = {
        "no agent": {"input": "quiz me"},
        "neither": {"agent": "demo.trivia"},
        "both": {"agent": "demo.trivia", "input": "quiz me", "messages": [message]},
        "empty messages": {"agent": "demo.trivia", "messages": []},
        "bad role": {"agent": "demo.trivia",
                     "messages": [{"role": "wizard", "content": [{"text": "hi"}]}]},
        "metadata not an object": {"agent": "demo.trivia", "input": "x", "metadata": [1]},
    }
    with system.api() as api:
        before = _latest_start(api)
        for name, body in cases.items():
            error = _refused(api.post("/v1/runs", json=body), 422)
            assert error["message"], name
        assert _latest_start(api) == before, "a refused start request created a run"
    both = _refused(_post(system, "/v1/runs", cases["both"]), 422)
    assert "input" in json.dumps(both) and "messages" in json.dumps(both)
    assert "/agent" in {e["path"] for e in _refused(_post(system, "/v1/runs",
                                                          cases["no agent"]), 422)["detail"]}


def test_resume_must_cover_every_open_interrupt(system: LaybySystem) -> None:
    run, waiting = _parked(system, "demo.parallel", "pay Carol", count=2)
    ids = {i["toolName"]: i["id"] for i in waiting}
    resume = f"/v1/runs/{run['id']}/resume"
    one = {"interruptId": ids["ask_question"], "status": "resolved", "payload": "main"}
    other = {"interruptId": ids["transfer_funds"], "status": "resolved",
             "payload": {"approved": True}}

    partial = _refused(_post(system, resume, {"resume": [one]}), 422)
    assert ids["transfer_funds"] in partial["message"]
    assert sorted(partial["detail"]["open"]) == sorted(ids.values())
    duplicate = _refused(_post(system, resume, {"resume": [one, one]}), 422)
    assert ids["ask_question"] in duplicate["message"]
    empty = _refused(_post(system, resume, {"resume": []}), 422)
    assert "/resume" in {e["path"] for e in empty["detail"]}
    invalid_one = dict(one, payload="the piggy bank")  # not one of the choices
    mixed = _refused(_post(system, resume, {"resume": [invalid_one, other]}), 422)
    assert mixed["detail"]["interruptId"] == ids["ask_question"]

    still = system.run(run["id"])
    assert still["status"] == "interrupted"
    assert sorted(i["id"] for i in system.open_interrupts(still)) == sorted(ids.values())
    assert all("answer" not in i for i in still["interrupts"]), "a refused resume was recorded"
    assert not [e for e in sse.history(system, run["id"]) if e["event"] == "interrupt.answered"]

    both = _post(system, resume, {"resume": [one, other]})
    assert both.status_code == 200, both.text
    assert both.json()["resumed"] is True
    done = system.wait_status(run["id"], "completed")
    assert done["result"] == "Paying from main; transfer sent; balance was 1000."
    assert {i["state"] for i in done["interrupts"]} == {"resolved"}
    assert [t for t in system.ledger()["transfers"] if t["run"] == run["id"]] != []


# -- idempotency, messages, listing ------------------------------------------------------


def test_idempotency_key_returns_the_same_run(system: LaybySystem) -> None:
    tag = uuid.uuid4().hex
    body = {"agent": "demo.trivia", "input": "quiz me", "metadata": {"tag": tag}}
    key = {"Idempotency-Key": f"order-{tag}"}
    first = _post(system, "/v1/runs", body, headers=key)
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    again = _post(system, "/v1/runs", body, headers=key)
    assert again.status_code == 202
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]

    # The same key from several clients at once still makes one run.
    racing_key = {"Idempotency-Key": f"race-{tag}"}
    barrier = threading.Barrier(8)
    ids: list[str] = []

    def post() -> None:
        with system.api() as api:
            barrier.wait(timeout=20)
            ids.append(api.post("/v1/runs", json=body, headers=racing_key).json()["id"])

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(ids) == 8 and len(set(ids)) == 1, ids

    with system.api() as api:
        listed = api.get("/v1/runs", params={"limit": 100}).json()["runs"]
        mine = [r["id"] for r in listed if r["agent"] == "demo.trivia"
                and r["createdAt"] >= first.json()["createdAt"]
                and api.get(f"/v1/runs/{r['id']}").json()["metadata"].get("tag") == tag]
    assert sorted(mine) == sorted({first.json()["id"], ids[0]}), mine


def test_a_run_can_start_from_a_message_history(system: LaybySystem) -> None:
    history = [{"role": "user", "content": [{"text": "I'd like a movie question"}]}]
    reply = _post(system, "/v1/runs", {"agent": "demo.trivia", "messages": history})
    assert reply.status_code == 202, reply.text
    run = reply.json()
    assert run["messages"] == history
    parked = system.wait_status(run["id"], "interrupted")
    assert parked["messages"][0] == history[0]
    question = system.open_interrupts(parked)[0]
    assert system.answer(run["id"], question["id"], payload="Jaws").status_code == 200
    assert system.wait_status(run["id"], "completed")["result"].startswith("Right!")


def test_list_runs_by_status(system: LaybySystem) -> None:
    waiting, _ = _parked(system, "demo.trivia", "quiz me")
    done, (question,) = _parked(system, "demo.trivia", "quiz me too")
    system.answer(done["id"], question["id"], payload="Jaws")
    system.wait_status(done["id"], "completed")
    with system.api() as api:
        interrupted = api.get("/v1/runs", params={"status": "interrupted", "limit": 500})
        completed = api.get("/v1/runs", params={"status": "completed", "limit": 500})
        bogus = api.get("/v1/runs", params={"status": "sleeping"})
        too_many = api.get("/v1/runs", params={"limit": 100000})
    assert interrupted.status_code == 200
    parked_ids = {r["id"]: r for r in interrupted.json()["runs"]}
    assert waiting["id"] in parked_ids and done["id"] not in parked_ids
    assert parked_ids[waiting["id"]]["openInterrupts"] == 1
    assert {r["status"] for r in interrupted.json()["runs"]} == {"interrupted"}
    assert done["id"] in {r["id"] for r in completed.json()["runs"]}
    assert "/status" in {e["path"] for e in _refused(bogus, 422)["detail"]}
    _refused(too_many, 422)


# -- cancel ------------------------------------------------------------------------------


def test_cancel_a_parked_run(system: LaybySystem) -> None:
    run, (approval,) = _parked(system, "demo.transfer", "Send 900 to Mallory")
    reply = _post(system, f"/v1/runs/{run['id']}/cancel", {"reason": "customer called back"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == "cancelled"
    cancelled = system.run(run["id"])
    assert cancelled["status"] == "cancelled"
    assert cancelled["error"]["code"] == "cancelled"
    assert cancelled["error"]["message"] == "customer called back"
    assert cancelled["error"]["by"].startswith("api-key:")
    assert cancelled["interrupts"][0]["state"] == "cancelled"
    late = _refused(system.answer(run["id"], approval["id"], payload={"approved": True}), 409)
    assert "cancelled" in late["message"]
    _refused(_post(system, f"/v1/runs/{run['id']}/cancel"), 409)
    time.sleep(1)  # had anything been queued, a worker would have taken it by now
    assert system.run(run["id"])["status"] == "cancelled"
    assert not [t for t in system.ledger()["transfers"] if t["run"] == run["id"]]
    with system.api() as api:
        listed = api.get("/v1/runs", params={"status": "cancelled", "limit": 500}).json()
    assert run["id"] in {r["id"] for r in listed["runs"]}


# -- interrupts that come back, and runs that never end -----------------------------------


def test_a_restarted_tool_that_interrupts_again_parks_again(system: LaybySystem) -> None:
    run, (first,) = _parked(system, "test.twice", "go")
    assert first["message"] == "Approve launch?"
    assert system.answer(run["id"], first["id"], payload={"ok": True}).status_code == 200
    # The answer moved the run to resuming before it returned: this is the second park.
    again = system.wait_status(run["id"], "interrupted", "completed")
    (second,) = system.open_interrupts(again)
    assert second["id"] != first["id"]
    assert second["message"] == "Second sign-off for launch?"
    assert _by_state(again) == {first["id"]: "resolved", second["id"]: "open"}
    assert _refused(system.answer(run["id"], first["id"], payload={"ok": True}), 409)
    bad = system.answer(run["id"], second["id"], payload={"second": False})
    assert _refused(bad, 422)["detail"]["errors"]
    assert system.answer(run["id"], second["id"], payload={"second": True}).status_code == 200
    done = system.wait_status(run["id"], "completed")
    assert done["result"] == "Result: launch"
    assert _by_state(done) == {first["id"]: "resolved", second["id"]: "resolved"}


def _by_state(run: dict[str, Any]) -> dict[str, str]:
    return {i["id"]: i["state"] for i in run["interrupts"]}


def test_max_turns_fails_the_run_with_a_clear_error(system: LaybySystem) -> None:
    run = system.start_run("test.loop", "loop forever")
    failed = system.wait_status(run["id"], "failed", "completed")
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "max_turns"
    assert "test.loop" in failed["error"]["message"]
    assert "limit of 3 model turns" in failed["error"]["message"]
    assert failed["interrupts"] == []
    events = [e["event"] for e in sse.history(system, run["id"])]
    assert events[-1] == "run.failed"


# -- limits and hostile input ------------------------------------------------------------


def test_a_body_that_is_not_json_says_where_and_a_wrong_content_type_says_so(
        system: LaybySystem) -> None:
    """What was observed: a malformed body said "the body at 26: JSON decode error"; a body
    sent without Content-Type (or as curl -d sends it) said "Input should be a valid
    dictionary". Now the first gives line and column, the others name the header to send."""
    broken = b'{"agent": "demo.trivia",\n "input": Quiz me}'
    good = json.dumps({"agent": "demo.trivia", "input": "Quiz me"}).encode()
    system.start_run("demo.trivia", "Quiz me")  # the newest run, until one is wrongly made
    with system.api() as api:
        before = _latest_start(api)
        malformed = _refused(api.post("/v1/runs", content=broken,
                                      headers={"content-type": JSON_TYPE}), 422)
        untyped = _refused(api.post("/v1/runs", content=good), 422)
        as_curl_d = _refused(api.post("/v1/runs", content=good, headers={
            "content-type": "application/x-www-form-urlencoded"}), 422)
        as_text = _refused(api.post("/v1/runs", content=good,
                                    headers={"content-type": "text/plain"}), 422)
        empty = _refused(api.post("/v1/runs", headers={"content-type": JSON_TYPE}), 422)
        answered = _refused(api.post("/v1/runs/nope/interrupts/nope", content=b'{"status": }',
                                     headers={"content-type": JSON_TYPE}), 422)
        assert _latest_start(api) == before, "a refused start request created a run"

    assert malformed["message"] == ("the body is not valid JSON: Expecting value at line 2, "
                                    "column 11"), malformed
    assert malformed["detail"] == [{"path": "/", "message": malformed["message"]}]
    assert untyped["message"] == ("the body must be JSON, sent with the header "
                                  "`Content-Type: application/json`; this request has no "
                                  "Content-Type"), untyped
    assert "Content-Type 'application/x-www-form-urlencoded' (what `curl -d` sends" in \
        as_curl_d["message"], as_curl_d
    assert "this request has Content-Type 'text/plain'" in as_text["message"], as_text
    assert empty["message"] == "the body is empty: send one JSON object", empty
    assert "at line 1, column 12" in answered["message"], answered
    for error in (malformed, untyped, as_curl_d, as_text, empty):
        assert "valid dictionary" not in error["message"] and "decode error" not in \
            error["message"]


def test_hostile_requests_get_json_errors_never_5xx(system: LaybySystem) -> None:
    run, (approval,) = _parked(system, "demo.transfer", "Send 10 to Zed")
    rid, iid = run["id"], approval["id"]
    routes = {
        "start": ("/v1/runs", lambda v: {"agent": "demo.transfer", "input": v}),
        "answer": (f"/v1/runs/{rid}/interrupts/{iid}",
                   lambda v: {"status": "resolved", "payload": {"approved": True, "note": v}}),
        "resume": (f"/v1/runs/{rid}/resume", lambda v: {"resume": [
            {"interruptId": iid, "status": "resolved", "payload": {"approved": True,
                                                                   "note": v}}]}),
        "cancel": (f"/v1/runs/{rid}/cancel", lambda v: {"reason": v}),
    }
    deep: Any = "bottom"
    for _ in range(300):
        deep = [deep]

    def raw(route: str, value_json: str) -> bytes:
        marker = "__VALUE__"
        return json.dumps(routes[route][1](marker)).replace(f'"{marker}"', value_json).encode()

    bodies: dict[str, Any] = {
        "huge value": lambda r: (json.dumps(routes[r][1]("x" * TOO_BIG)).encode(), JSON_TYPE),
        "huge unicode value": lambda r: (json.dumps(routes[r][1]("☃" * (TOO_BIG // 3)),
                                                    ensure_ascii=False).encode(), JSON_TYPE),
        "deeply nested value": lambda r: (json.dumps(routes[r][1](deep)).encode(), JSON_TYPE),
        "nesting past the parser": lambda r: (b"[" * 100_000 + b"]" * 100_000, JSON_TYPE),
        "lone surrogate": lambda r: (raw(r, '"\\ud800 oops"'), JSON_TYPE),
        "lone surrogate in a key": lambda r: (raw(r, '{"\\udfff": 1}'), JSON_TYPE),
        "not json": lambda r: (b"{this is not json", JSON_TYPE),
        "truncated": lambda r: (json.dumps(routes[r][1]("x")).encode()[:-3], JSON_TYPE),
        "binary": lambda r: (bytes(range(256)) * 4, JSON_TYPE),
        "json array": lambda r: (b"[1, 2, 3]", JSON_TYPE),
        "json string": lambda r: (b'"resolved"', JSON_TYPE),
        "json number": lambda r: (b"1e999", JSON_TYPE),
        "json true": lambda r: (b"true", JSON_TYPE),
        "unknown fields": lambda r: (b'{"bogus": {"nested": [1, {"x": null}]}}', JSON_TYPE),
        "wrong types": lambda r: (json.dumps({"agent": 7, "input": None, "status": 3,
                                              "resume": "all", "reason": {"x": 1},
                                              "messages": "hi"}).encode(), JSON_TYPE),
        "NaN": lambda r: (raw(r, "NaN"), JSON_TYPE),
        "form encoded": lambda r: (b"status=resolved&payload=yes",
                                   "application/x-www-form-urlencoded"),
        "xml": lambda r: (b"<answer>yes</answer>", "application/xml"),
        "json as text/plain": lambda r: (json.dumps(routes[r][1]("x")).encode(), "text/plain"),
    }
    failures = []
    log_seen = len(system.procs["gateway"].output())
    with system.api() as api:
        for name, make in bodies.items():
            for route, (path, _) in routes.items():
                content, content_type = make(route)
                reply = api.post(path, content=content, headers={"content-type": content_type})
                failures += _check_refusal(f"{name} → {route}", reply)
        weird_ids = ["☃", "💥" * 50, "a" * 4000, "run with spaces", "{run}", "..", "%2F",
                     "%00", "'; DROP TABLE runs; --", "\u202eevil"]
        for weird in weird_ids:
            quoted = httpx.URL(f"/v1/runs/{weird}").raw_path.decode()
            checks = [
                (f"answer run {weird[:20]!r}", api.post(f"{quoted}/interrupts/{iid}", json={
                    "status": "resolved", "payload": {"approved": True}})),
                (f"answer interrupt {weird[:20]!r}", api.post(
                    f"/v1/runs/{rid}/interrupts/{quoted.rsplit('/', 1)[1]}",
                    json={"status": "resolved", "payload": {"approved": True}})),
                (f"resume {weird[:20]!r}", api.post(f"{quoted}/resume", json={"resume": [
                    {"interruptId": weird, "status": "cancelled"}]})),
                (f"cancel {weird[:20]!r}", api.post(f"{quoted}/cancel")),
                (f"start agent {weird[:20]!r}", api.post("/v1/runs", json={
                    "agent": weird, "input": "x"})),
                (f"idempotency key {weird[:20]!r}", api.post("/v1/runs", json={
                    "agent": "demo.nope", "input": "x"},
                    headers={"Idempotency-Key": weird.encode()})),
            ]
            for label, reply in checks:
                failures += _check_refusal(label, reply)
        latest_start = _latest_start(api)
    assert not failures, "\n".join(failures)
    assert "Traceback" not in system.procs["gateway"].output()[log_seen:]
    still = system.run(rid)
    assert still["status"] == "interrupted", "a hostile request changed the run"
    assert system.open_interrupts(still)[0]["id"] == iid
    assert latest_start == run["createdAt"], "a hostile request started a run"
    ok = system.answer(rid, iid, payload={"approved": True, "note": "still fine"})
    assert ok.status_code == 200, ok.text


def _check_refusal(label: str, reply: httpx.Response) -> list[str]:
    if not 400 <= reply.status_code < 500:
        return [f"{label}: {reply.status_code} {reply.text[:200]}"]
    try:
        error = reply.json()["error"]
        assert error["message"] and error["code"]
    except Exception:  # noqa: BLE001
        return [f"{label}: {reply.status_code} without a JSON error: {reply.text[:200]}"]
    return []


def test_the_size_limit_names_itself(system: LaybySystem) -> None:
    run, (approval,) = _parked(system, "demo.transfer", "Send 11 to Zed")
    reply = system.answer(run["id"], approval["id"],
                          payload={"approved": True, "note": "x" * TOO_BIG})
    error = _refused(reply, 413)
    assert "LAYBY_MAX_ANSWER_BYTES" in error["message"]
    start = _post(system, "/v1/runs", {"agent": "demo.trivia", "input": "x" * TOO_BIG})
    assert "LAYBY_MAX_ANSWER_BYTES" in _refused(start, 413)["message"]
    assert system.open_interrupts(system.run(run["id"]))[0]["id"] == approval["id"]


# -- events (SSE) ------------------------------------------------------------------------


def test_event_stream_follows_a_run_to_its_end(system: LaybySystem) -> None:
    run, (question,) = _parked(system, "demo.trivia", "quiz me")
    seen: list[dict[str, Any]] = []
    with system.api() as api, api.stream("GET", f"/v1/runs/{run['id']}/events") as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        for event in sse.parse(stream.iter_lines()):
            seen.append(event)
            if event["event"] == "run.interrupted":  # answered while the stream is open
                assert system.answer(run["id"], question["id"], payload="Jaws").status_code == 200
    # The loop ended: the server closed the stream after the final event.
    types = [e["event"] for e in seen]
    assert types[0] == "run.created" and types[-1] == "run.completed", types
    order = ["run.created", "run.started", "run.interrupted", "interrupt.answered",
             "run.resuming", "run.started", "run.completed"]
    assert [t for t in types if t in order] == order, types
    assert all(e["id"] == e["data"]["id"] and e["event"] == e["data"]["type"] for e in seen)
    keys = [sse.id_key(e["id"]) for e in seen]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    answered = seen[types.index("interrupt.answered")]["data"]["data"]
    assert answered["interruptId"] == question["id"] and answered["payload"] == "Jaws"
    assert seen[-1]["data"]["data"]["result"].startswith("Right!")


def test_last_event_id_resumes_after_that_event(system: LaybySystem) -> None:
    run, (question,) = _parked(system, "demo.trivia", "quiz me")
    system.answer(run["id"], question["id"], payload="Jaws")
    system.wait_status(run["id"], "completed")
    full = sse.history(system, run["id"])
    cut = [e["event"] for e in full].index("run.interrupted")
    rest = sse.history(system, run["id"], last_event_id=full[cut]["id"])
    assert [e["id"] for e in rest] == [e["id"] for e in full[cut + 1:]]
    assert rest[0]["event"] == "interrupt.answered"
    # Following (the default) a finished run from an id also ends at the final event.
    with system.api() as api, api.stream("GET", f"/v1/runs/{run['id']}/events",
                                         headers={"Last-Event-ID": full[-2]["id"]}) as stream:
        tail = list(sse.parse(stream.iter_lines(), deadline_s=10))
    assert [e["id"] for e in tail] == [full[-1]["id"]]


def test_a_run_started_as_a_stream_is_followed_in_the_same_request(
        system: LaybySystem) -> None:
    key = f"stream-{uuid.uuid4().hex}"
    seen: list[dict[str, Any]] = []
    events = {"Idempotency-Key": key, "Accept": "text/event-stream"}
    with system.api() as api, api.stream("POST", "/v1/runs", json={
            "agent": "demo.trivia", "input": "quiz me"}, headers=events) as stream:
        assert stream.status_code == 202
        assert stream.headers["content-type"].startswith("text/event-stream")
        run_id = stream.headers["location"].removeprefix("/v1/runs/")
        for event in sse.parse(stream.iter_lines()):
            seen.append(event)
            if event["event"] == "run.interrupted":
                [question] = event["data"]["data"]["interrupts"]
                assert system.answer(run_id, question["id"], payload="Jaws").status_code == 200
    types = [e["event"] for e in seen]
    assert types[0] == "run.created" and types[-1] == "run.completed", types
    assert [e["id"] for e in seen] == [e["id"] for e in sse.history(system, run_id)]
    assert system.run(run_id)["result"].startswith("Right!")
    with system.api() as api:
        # The same key: the same run, replayed from its first event, and said so.
        with api.stream("POST", "/v1/runs", params={"follow": "false"},
                        json={"agent": "demo.trivia", "input": "quiz me"},
                        headers=events) as again:
            assert again.headers["location"] == f"/v1/runs/{run_id}"
            assert again.headers["idempotent-replayed"] == "true"
            assert [e["id"] for e in sse.parse(again.iter_lines())] == [e["id"] for e in seen]
        # Without the Accept, the same start answers with the run.
        plain = api.post("/v1/runs", json={"agent": "demo.trivia", "input": "quiz me"},
                         headers={"Idempotency-Key": key})
        assert plain.status_code == 202 and plain.json()["id"] == run_id
        assert plain.headers["location"] == f"/v1/runs/{run_id}"
        # Refusals are JSON, before any stream starts.
        unknown = api.post("/v1/runs", json={"agent": "demo.nobody", "input": "hi"},
                           headers={"Accept": "text/event-stream"})
        empty = api.post("/v1/runs", json={"agent": "demo.trivia", "messages": []},
                         headers={"Accept": "text/event-stream"})
    assert "demo.trivia" in _refused(unknown, 404)["message"]
    assert "messages" in _refused(empty, 422)["message"]


def test_a_follower_that_hangs_up_frees_the_read_it_waited_in(system: LaybySystem) -> None:
    """A client that closes its event stream while the run waits: the gateway stops
    following for it then, not when the run ends (a waiting read holds a Redis
    connection, and a parked run may wait for days)."""
    run, _ = _parked(system, "demo.trivia", "quiz me")
    server = redis.Redis.from_url(system.redis_url)

    def reads_waiting() -> int:
        return sum(1 for c in server.client_list()
                   if c.get("cmd") == "xread" and "b" in c.get("flags", ""))

    def until(count: int) -> None:
        deadline = time.monotonic() + 10
        while reads_waiting() != count:
            assert time.monotonic() < deadline, f"{reads_waiting()} reads wait, not {count}"
            time.sleep(0.05)

    before = reads_waiting()
    with system.api() as api, api.stream("GET", f"/v1/runs/{run['id']}/events") as stream:
        # Held, not dropped at the break: a reader that goes away closes the connection.
        events = sse.parse(stream.iter_lines())
        for event in events:
            if event["event"] == "run.interrupted":
                break
        until(before + 1)
    until(before)
    del events
    server.close()
    assert system.run(run["id"])["status"] == "interrupted"


def test_event_stream_refusals_come_before_streaming(system: LaybySystem) -> None:
    run = system.start_run("demo.trivia", "quiz me")
    with system.api() as api:
        unknown = api.get("/v1/runs/run_nobody_made/events")
        garbage = api.get(f"/v1/runs/{run['id']}/events", headers={"Last-Event-ID": "yesterday"})
    assert "run_nobody_made" in _refused(unknown, 404)["message"]
    assert "Last-Event-ID" in _refused(garbage, 422)["message"]


# -- OpenAPI -----------------------------------------------------------------------------


def test_openapi_lists_the_v1_routes(system: LaybySystem) -> None:
    spec = httpx.get(f"{system.base_url}/openapi.json", timeout=10).json()
    paths = spec["paths"]
    expected = {
        "/v1/runs": {"get", "post"},
        "/v1/runs/{run_id}": {"get"},
        "/v1/runs/{run_id}/interrupts/{interrupt_id}": {"post"},
        "/v1/runs/{run_id}/resume": {"post"},
        "/v1/runs/{run_id}/cancel": {"post"},
        "/v1/runs/{run_id}/events": {"get"},
    }
    for path, methods in expected.items():
        assert path in paths, sorted(paths)
        assert methods <= set(paths[path]), (path, paths[path])
        for method in methods:
            assert paths[path][method].get("security"), f"{method} {path} is not marked secured"
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    start = paths["/v1/runs"]["post"]
    assert {"application/json", "text/event-stream"} <= start["responses"]["202"]["content"].keys()
    assert any(p["name"].lower() == "idempotency-key" for p in start["parameters"])


def test_a_page_too_deep_and_a_wrong_method_are_told_what_is_allowed(
        system: LaybySystem) -> None:
    with system.api() as api:
        deep = api.get("/v1/runs", params={"offset": 9223372036854775759})
        wrong = api.delete("/v1/runs")
    assert deep.status_code == 422, deep.text
    error = deep.json()["error"]
    assert "past 1000" in error["message"] and "nextCursor" in error["message"]
    assert error["detail"] == {"maxOffset": 1000}
    assert wrong.status_code == 405
    assert set(wrong.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}
    assert wrong.json()["error"]["code"] == "method_not_allowed"


def test_an_answer_retried_with_its_idempotency_key_gets_the_first_reply(
        system: LaybySystem) -> None:
    """A client that lost the reply (or got a 503) sends the same answer again with the
    same Idempotency-Key: it is its own answer, not a rival's 409."""
    run_id = system.start_run("demo.trivia", "Quiz me")["id"]
    question = system.open_interrupts(system.wait_status(run_id, "interrupted"))[0]
    path = f"/v1/runs/{run_id}/interrupts/{question['id']}"
    with system.api() as api:
        first = api.post(path, json={"status": "resolved", "payload": "Jaws"},
                         headers={"Idempotency-Key": "answer-1"})
        again = api.post(path, json={"status": "resolved", "payload": "Jaws"},
                         headers={"Idempotency-Key": "answer-1"})
        other = api.post(path, json={"status": "resolved", "payload": "Alien"},
                         headers={"Idempotency-Key": "answer-1"})
        unkeyed = api.post(path, json={"status": "resolved", "payload": "Jaws"})
    assert first.status_code == 200 and first.json()["resumed"] is True
    assert again.status_code == 200, again.text
    assert again.json()["resumed"] is True
    assert again.json()["run"]["interrupts"][0]["answer"]["payload"] == "Jaws"
    assert other.status_code == 409 and "Idempotency-Key" in other.json()["error"]["message"]
    assert unkeyed.status_code == 409  # without the key, a second answer is a rival's
    assert system.wait_status(run_id, "completed")["result"] == "Right! It was Jaws (1975)."


def test_an_answer_after_the_server_lost_its_scripts_is_recorded_once(
        system: LaybySystem) -> None:
    """A restarted (or flushed) Redis has none of layby's scripts loaded: the answer, which
    sends its script and its reply's reads together, loads the script and goes again."""
    run_id = system.start_run("demo.trivia", "Quiz me")["id"]
    question = system.open_interrupts(system.wait_status(run_id, "interrupted"))[0]
    with redis.Redis.from_url(system.redis_url) as r:
        r.script_flush()
    reply = system.answer(run_id, question["id"], payload="Jaws")
    assert reply.status_code == 200, reply.text
    answered = reply.json()
    assert answered["resumed"] is True
    [interrupt] = answered["run"]["interrupts"]
    assert interrupt["state"] == "resolved" and interrupt["answer"]["payload"] == "Jaws"
    done = system.wait_status(run_id, "completed")
    assert done["result"] == "Right! It was Jaws (1975)."
    assert [e["event"] for e in sse.history(system, run_id)].count("interrupt.answered") == 1
