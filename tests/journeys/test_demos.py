"""Every demo agent end to end, through the HTTP API, on a real worker and Valkey."""

from __future__ import annotations

from tests.support.harness import LaybySystem


def _single_open(system: LaybySystem, run_id: str) -> dict:
    run = system.wait_status(run_id, "interrupted")
    waiting = system.open_interrupts(run)
    assert len(waiting) == 1, run["interrupts"]
    return waiting[0]


def test_trivia_right_answer(system: LaybySystem) -> None:
    run = system.start_run("demo.trivia", "Ask me a movie question")
    question = _single_open(system, run["id"])
    assert question["reason"] == "input_required"
    assert question["responseSchema"]["enum"][0] == "Jaws"
    assert "water" in question["message"]
    reply = system.answer(run["id"], question["id"], payload="Jaws")
    assert reply.status_code == 200, reply.text
    done = system.wait_status(run["id"], "completed")
    assert done["result"].startswith("Right!")
    answered = done["interrupts"][0]
    assert answered["state"] == "resolved"
    assert answered["answer"]["channel"] == "api"
    assert answered["answer"]["answeredBy"].startswith("api-key:")
    tool_message = done["messages"][-2]
    assert tool_message["role"] == "tool"
    assert tool_message["content"][0]["toolResponse"]["output"] == "Jaws"


def test_trivia_wrong_answer_and_choice_outside_the_list(system: LaybySystem) -> None:
    run = system.start_run("demo.trivia", "quiz me")
    question = _single_open(system, run["id"])
    refused = system.answer(run["id"], question["id"], payload="Titanic")
    assert refused.status_code == 422
    assert "Titanic" in refused.text
    assert system.run(run["id"])["status"] == "interrupted"
    assert system.answer(run["id"], question["id"], payload="Alien").status_code == 200
    done = system.wait_status(run["id"], "completed")
    assert "you said Alien" in done["result"]


def test_transfer_approved_executes_once(system: LaybySystem) -> None:
    run = system.start_run("demo.transfer", "Send 250 to Bob")
    approval = _single_open(system, run["id"])
    assert approval["reason"] == "confirmation"
    assert approval["toolInput"] == {"to": "Bob", "amount": 250}
    assert system.answer(run["id"], approval["id"], payload={"approved": True}).status_code == 200
    done = system.wait_status(run["id"], "completed")
    assert done["result"] == "Sent 250 to Bob."
    mine = [t for t in system.ledger()["transfers"] if t["run"] == run["id"]]
    assert [(t["to"], t["amount"]) for t in mine] == [("Bob", 250)]


def test_transfer_replace_input_changes_the_amount(system: LaybySystem) -> None:
    run = system.start_run("demo.transfer", "Send 250 to Bob")
    approval = _single_open(system, run["id"])
    bad = system.answer(run["id"], approval["id"], payload={"approved": True},
                        metadata={"replaceInput": {"to": "Bob", "amount": -5}})
    assert bad.status_code == 422
    assert "replaceInput" in bad.text
    ok = system.answer(run["id"], approval["id"], payload={"approved": True},
                       metadata={"replaceInput": {"to": "Bob", "amount": 100}})
    assert ok.status_code == 200, ok.text
    done = system.wait_status(run["id"], "completed")
    assert done["result"] == "Sent 100 to Bob."
    mine = [t["amount"] for t in system.ledger()["transfers"] if t["run"] == run["id"]]
    assert mine == [100]
    request = done["messages"][1]["content"][0]
    assert request["toolRequest"]["input"]["amount"] == 100
    assert int(request["metadata"]["replacedInput"]["amount"]) == 250  # the model's original


def test_transfer_cancelled_sends_nothing(system: LaybySystem) -> None:
    run = system.start_run("demo.transfer", "Send 75 to Eve")
    approval = _single_open(system, run["id"])
    reply = system.answer(run["id"], approval["id"], status="cancelled",
                          metadata={"reason": "Eve is not a known payee"})
    assert reply.status_code == 200
    done = system.wait_status(run["id"], "completed")
    assert "Transfer cancelled: Eve is not a known payee" in done["result"]
    assert done["interrupts"][0]["state"] == "cancelled"
    assert not [t for t in system.ledger()["transfers"] if t["run"] == run["id"]]


def test_parallel_resumes_only_when_both_are_answered(system: LaybySystem) -> None:
    run = system.start_run("demo.parallel", "pay Carol")
    parked = system.wait_status(run["id"], "interrupted")
    waiting = {i["toolName"]: i for i in system.open_interrupts(parked)}
    assert set(waiting) == {"ask_question", "transfer_funds"}
    model_message = parked["messages"][-1]
    pending = [p for p in model_message["content"] if "pendingOutput" in (p.get("metadata") or {})]
    assert [p["toolRequest"]["name"] for p in pending] == ["check_balance"]

    first = system.answer(run["id"], waiting["ask_question"]["id"], payload="savings")
    assert first.status_code == 200 and first.json()["resumed"] is False
    assert system.run(run["id"])["status"] == "interrupted"

    second = system.answer(run["id"], waiting["transfer_funds"]["id"], payload={"approved": True})
    assert second.status_code == 200 and second.json()["resumed"] is True
    done = system.wait_status(run["id"], "completed")
    assert done["result"] == "Paying from savings; transfer sent; balance was 1000."
    ledger = system.ledger()
    assert len([c for c in ledger["calls"] if c["run"] == run["id"]]) == 1
    assert len([t for t in ledger["transfers"] if t["run"] == run["id"]]) == 1
    responses = done["messages"][-2]["content"]
    sources = {p["toolResponse"]["name"]: (p.get("metadata") or {}) for p in responses}
    assert sources["check_balance"] == {"source": "pending"}
    assert sources["ask_question"] == {"interruptResponse": True}


def test_bbq_asks_one_question_after_another(system: LaybySystem) -> None:
    run = system.start_run("demo.bbq", "Plan a BBQ for Saturday")
    answers = iter(["12", "vegetarian", "charcoal"])
    for expected in ("How many guests", "dietary", "Charcoal or gas"):
        question = _single_open(system, run["id"])
        assert expected in question["message"]
        assert system.answer(run["id"], question["id"], payload=next(answers)).status_code == 200
        system.wait_status(run["id"], "interrupted", "completed")
    done = system.wait_status(run["id"], "completed")
    assert done["result"].startswith("BBQ plan: 12 guests, vegetarian menu, on a charcoal grill")
    assert [i["state"] for i in done["interrupts"]] == ["resolved"] * 3


def test_report_background_job_resumes_the_run(system: LaybySystem) -> None:
    run = system.start_run("demo.report", "quarterly churn analysis")
    done = system.wait_status(run["id"], "completed", timeout=30)
    assert done["result"].startswith("Report on quarterly churn analysis: 3 findings")
    job = done["interrupts"][0]
    assert job["reason"] == "layby:background_job"
    assert job["state"] == "resolved"
    assert job["answer"]["channel"] == "job"
    assert job["answer"]["answeredBy"] == "job:demo.compile_report"


def test_expiring_approval_ends_not_approved(system: LaybySystem) -> None:
    run = system.start_run("demo.expiring", "ship it")
    approval = _single_open(system, run["id"])
    assert approval["expiresAt"]
    done = system.wait_status(run["id"], "completed", timeout=20)
    assert "not approved in time" in done["result"]
    assert done["interrupts"][0]["state"] == "expired"
    assert done["interrupts"][0]["answer"]["channel"] == "expiry"
    late = system.answer(run["id"], approval["id"], payload={"approved": True})
    assert late.status_code == 409
