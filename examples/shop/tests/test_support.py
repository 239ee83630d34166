"""The shop's support agent against a real layby (layby's test kit: Valkey, a worker, the
sweeper and the gateway, started once for the session)."""

from __future__ import annotations

import refund_script
from layby import CONFIRMATION, Client, Status
from layby.testing import LaybyServer


def test_a_large_refund_waits_for_approval_then_renders_the_credit_note(
        layby_client: Client) -> None:
    run = layby_client.start("shop.support", input="Refund 250 on order 42")
    run = layby_client.wait(run.id, until={"interrupted"})
    question = run.open_interrupts[0]
    assert question.message == "Why would you like a refund?"
    layby_client.answer(run.id, question.id, payload="it arrived broken")

    run = layby_client.wait(run.id, until={"interrupted"})
    approval = run.open_interrupts[0]
    assert approval.reason == CONFIRMATION
    assert approval.message == 'Allow refund(order="42", amount=250)?'
    layby_client.answer(run.id, approval.id, payload={"approved": True})

    done = layby_client.wait(run.id, timeout=60)
    assert done.status is Status.COMPLETED
    assert done.result == ("Refunded 250 on order 42 (it arrived broken); "
                           "credit note CN-42.")


def test_a_small_refund_needs_no_approval(layby_client: Client) -> None:
    run = layby_client.start("shop.support", input="Refund 20 on order 7")
    run = layby_client.wait(run.id, until={"interrupted"})
    layby_client.answer(run.id, run.open_interrupts[0].id, payload="wrong size")
    done = layby_client.wait(run.id, timeout=60)
    assert done.result == "Refunded 20 on order 7 (wrong size); credit note CN-7."
    assert [i.reason for i in done.interrupts] == ["input_required", "layby:background_job"]


def test_a_declined_refund_is_not_made(layby_client: Client) -> None:
    run = layby_client.start("shop.support", input="Refund 900 on order 9")
    run = layby_client.wait(run.id, until={"interrupted"})
    layby_client.answer(run.id, run.open_interrupts[0].id, payload="changed my mind")
    run = layby_client.wait(run.id, until={"interrupted"})
    layby_client.answer(run.id, run.open_interrupts[0].id,
                        payload={"approved": False, "note": "over the yearly limit"})
    done = layby_client.wait(run.id, timeout=60)
    assert done.result == "Refund of 900 on order 9 declined: over the yearly limit."


def test_the_refund_script_drives_a_run_through_the_client(layby_server: LaybyServer) -> None:
    done = refund_script.refund("77", 300)
    assert done.status is Status.COMPLETED
    assert done.result == "Refunded 300 on order 77 (damaged in transit); credit note CN-77."
