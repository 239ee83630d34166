"""Many people answering at once: exactly one answer per interrupt wins, exactly one resume
is queued, and the approved action happens once. Real threads, real HTTP, real Valkey."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import httpx

from tests.support import sse
from tests.support.harness import LaybySystem

CROWD = 50


def _all_at_once(system: LaybySystem, requests: list[tuple[str, dict[str, Any]]]
                 ) -> list[httpx.Response]:
    """POST every (path, body) from its own thread and client, released together."""
    barrier = threading.Barrier(len(requests))
    replies: list[httpx.Response | BaseException | None] = [None] * len(requests)

    def post(n: int, path: str, body: dict[str, Any]) -> None:
        try:
            with system.api() as api:
                api.get("/v1/agents")  # connect and authenticate before the start line
                barrier.wait(timeout=30)
                replies[n] = api.post(path, json=body)
        except BaseException as exc:  # noqa: BLE001  (reported below, with the others)
            replies[n] = exc

    threads = [threading.Thread(target=post, args=(n, path, body))
               for n, (path, body) in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    failed = [r for r in replies if not isinstance(r, httpx.Response)]
    assert not failed, failed[:3]
    return replies  # type: ignore[return-value]


def _parked(system: LaybySystem, agent: str, text: str) -> dict[str, Any]:
    run = system.start_run(agent, text)
    return system.wait_status(run["id"], "interrupted")


def test_fifty_approvals_of_one_transfer_move_the_money_once(system: LaybySystem) -> None:
    parked = _parked(system, "demo.transfer", "Send 500 to Rita")
    (approval,) = system.open_interrupts(parked)
    path = f"/v1/runs/{parked['id']}/interrupts/{approval['id']}"
    replies = _all_at_once(system, [
        (path, {"status": "resolved", "payload": {"approved": True, "note": f"reviewer {n}"}})
        for n in range(CROWD)])

    codes = Counter(r.status_code for r in replies)
    assert codes == {200: 1, 409: CROWD - 1}, codes
    (winner,) = [n for n, r in enumerate(replies) if r.status_code == 200]
    assert replies[winner].json()["resumed"] is True
    for r in replies:
        if r.status_code == 409:  # every loser is told the same first answer
            first = r.json()["error"]["detail"]["answer"]
            assert first["payload"]["note"] == f"reviewer {winner}"
            assert first["channel"] == "api"

    done = system.wait_status(parked["id"], "completed")
    assert done["result"] == "Sent 500 to Rita."
    assert done["interrupts"][0]["answer"]["payload"]["note"] == f"reviewer {winner}"
    kinds = Counter(e["event"] for e in sse.history(system, parked["id"]))
    assert kinds["interrupt.answered"] == 1 and kinds["run.resuming"] == 1, kinds
    assert kinds["run.completed"] == 1
    transfers = [t for t in system.ledger()["transfers"] if t["run"] == parked["id"]]
    assert [(t["to"], t["amount"]) for t in transfers] == [("Rita", 500)]


def test_fifty_answers_over_two_interrupts_resume_once(system: LaybySystem) -> None:
    parked = _parked(system, "demo.parallel", "pay Carol")
    waiting = {i["toolName"]: i["id"] for i in system.open_interrupts(parked)}
    assert set(waiting) == {"ask_question", "transfer_funds"}
    base = f"/v1/runs/{parked['id']}/interrupts"
    requests = []
    for n in range(CROWD):
        if n % 2:
            requests.append((f"{base}/{waiting['ask_question']}",
                             {"status": "resolved", "payload": ["main", "savings"][n % 4 // 2]}))
        else:
            requests.append((f"{base}/{waiting['transfer_funds']}",
                             {"status": "resolved", "payload": {"approved": True}}))
    replies = _all_at_once(system, requests)

    wins = {tool: [r for (path, _), r in zip(requests, replies, strict=True)
                   if path.endswith(iid) and r.status_code == 200]
            for tool, iid in waiting.items()}
    assert {tool: len(won) for tool, won in wins.items()} == {"ask_question": 1,
                                                             "transfer_funds": 1}
    assert Counter(r.status_code for r in replies) == {200: 2, 409: CROWD - 2}
    # The second of the two winning answers closed the set and queued the one resume.
    assert sorted(won[0].json()["resumed"] for won in wins.values()) == [False, True]

    done = system.wait_status(parked["id"], "completed")
    chosen = next(i for i in done["interrupts"] if i["toolName"] == "ask_question")
    account = chosen["answer"]["payload"]
    assert done["result"] == f"Paying from {account}; transfer sent; balance was 1000."
    kinds = Counter(e["event"] for e in sse.history(system, parked["id"]))
    assert kinds["interrupt.answered"] == 2 and kinds["run.resuming"] == 1, kinds
    ledger = system.ledger()
    assert len([t for t in ledger["transfers"] if t["run"] == parked["id"]]) == 1
    assert len([c for c in ledger["calls"] if c["run"] == parked["id"]]) == 1
