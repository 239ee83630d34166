"""`layby.Client` and `layby.AsyncClient` against a running gateway (the session's system:
real worker, sweeper, Valkey, HTTP on loopback), as another service would use them."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import layby
from layby import AsyncClient, Client, Conflict, Invalid, NotFound, Status, Unauthorized
from layby.client import aiohttp_transport
from tests.support.harness import API_KEY, LaybySystem


@pytest.fixture
def client(system: LaybySystem) -> Client:
    with Client(system.base_url, api_key=API_KEY) as c:
        yield c


def test_a_run_from_start_through_an_answer_to_its_result(client: Client,
                                                          system: LaybySystem) -> None:
    key = f"order-{uuid.uuid4().hex}"
    run = client.start("demo.transfer", input="Send 250 to Bob", idempotency_key=key,
                       metadata={"order": 42})
    assert isinstance(run, layby.RunView) and run.agent == "demo.transfer"
    assert client.start("demo.transfer", input="Send 250 to Bob", idempotency_key=key).id \
        == run.id  # the same key, the same run

    parked = client.wait(run.id, until={"interrupted"}, timeout=30)
    assert parked.status is Status.INTERRUPTED
    [question] = parked.open_interrupts
    assert question.reason == layby.CONFIRMATION and question.tool_name == "transfer_funds"
    assert run.id in [r.id for r in client.list(status="interrupted", limit=500)]

    answered = client.answer(run.id, question.id, payload={"approved": True})
    assert answered.resumed is True

    done = client.wait(run.id, timeout=30)
    assert done.status is Status.COMPLETED and done.result == "Sent 250 to Bob."
    assert done.metadata == {"order": 42}
    assert done.interrupts[0].answer is not None
    assert done.interrupts[0].answer.channel == "api"
    transfers = [t for t in system.ledger()["transfers"] if t["run"] == run.id]
    assert len(transfers) == 1


def test_every_refusal_raises_the_error_with_the_apis_code_and_message(
        client: Client, system: LaybySystem) -> None:
    with pytest.raises(NotFound) as missing:
        client.get("run_nobody")
    assert missing.value.status_code == 404 and missing.value.code == "notfound"
    assert "run_nobody" in missing.value.message

    run = client.wait(client.start("demo.trivia", input="Quiz me").id, until={"interrupted"},
                      timeout=30)
    question = run.open_interrupts[0]
    with pytest.raises(Invalid) as wrong:
        client.answer(run.id, question.id, payload="Titanic")  # not one of the choices
    assert wrong.value.status_code == 422
    assert wrong.value.detail["errors"][0]["message"].startswith("'Titanic' is not one of")

    client.answer(run.id, question.id, payload="Jaws")
    with pytest.raises(Conflict) as late:
        client.answer(run.id, question.id, payload="Alien")
    assert "already resolved by api-key:" in late.value.message

    with Client(system.base_url, api_key="not-a-key") as stranger, \
            pytest.raises(Unauthorized) as refused:
        stranger.list()
    assert refused.value.code == "unauthorized" and refused.value.status_code == 401


def test_resume_answers_every_open_interrupt_at_once(client: Client) -> None:
    run = client.wait(client.start("demo.parallel", input="go").id, until={"interrupted"},
                      timeout=30)
    by_tool = {i.tool_name: i for i in run.open_interrupts}
    entries = [layby.ResumeEntry(interrupt_id=by_tool["ask_question"].id, status="resolved",
                                 payload="savings"),
               {"interruptId": by_tool["transfer_funds"].id, "status": "cancelled",
                "metadata": {"reason": "no"}}]
    assert client.resume(run.id, entries).resumed is True
    done = client.wait(run.id, timeout=30)
    assert done.result == "Paying from savings; transfer declined; balance was 1000."


def test_events_replay_and_resume_after_the_last_event_seen(client: Client) -> None:
    run = client.start("demo.trivia", input="Quiz me")
    client.wait(run.id, until={"interrupted"}, timeout=30)
    seen = list(client.events(run.id, follow=False))
    types = [e.type for e in seen]
    assert types[:2] == ["run.created", "run.started"] and "run.interrupted" in types

    later = list(client.events(run.id, after=seen[0].id, follow=False))
    assert [e.id for e in later] == [e.id for e in seen[1:]]

    client.answer(run.id, client.get(run.id).open_interrupts[0].id, payload="Jaws")
    followed = [e.type for e in client.events(run.id, after=seen[-1].id)]
    assert followed[0] == "interrupt.answered" and followed[-1] == "run.completed"


def test_stream_starts_a_run_and_follows_it_in_one_request(client: Client) -> None:
    key = f"quiz-{uuid.uuid4().hex}"
    seen = []
    with client.stream("demo.trivia", input="Quiz me", idempotency_key=key) as run:
        assert run.id.startswith("run_") and run.replayed is False
        for event in run:
            seen.append(event)
            if event.type == "run.interrupted":
                [question] = event.data["interrupts"]
                client.answer(run.id, question["id"], payload="Jaws")
    types = [e.type for e in seen]
    assert types[0] == "run.created" and types[-1] == "run.completed"
    assert "run.interrupted" in types and "interrupt.answered" in types
    # The parked step's event carries its messages, as `events` gives them.
    parked = next(e for e in seen if e.type == "run.interrupted")
    assert parked.data["messages"][-1]["role"] == "model"
    done = client.get(run.id)
    assert done.status is Status.COMPLETED and done.result == "Right! It was Jaws (1975)."
    assert [e.id for e in client.events(run.id, follow=False)] == [e.id for e in seen]

    # The same key again: no second run; the first one's events, from its first.
    with client.stream("demo.trivia", input="Quiz me", idempotency_key=key,
                       follow=False) as again:
        assert again.id == run.id and again.replayed is True
        assert [e.id for e in again] == [e.id for e in seen]

    with pytest.raises(NotFound, match="no agent named"), \
            client.stream("demo.nobody", input="hi"):
        pass


def test_wait_gives_up_after_its_timeout(client: Client) -> None:
    run = client.wait(client.start("demo.trivia", input="Quiz me").id, until={"interrupted"},
                      timeout=30)
    with pytest.raises(TimeoutError, match="did not reach"):
        client.wait(run.id, timeout=1.5)  # nobody answers: it stays parked
    client.cancel(run.id, reason="test over")
    assert client.wait(run.id, timeout=10).status is Status.CANCELLED


@pytest.mark.parametrize("transport", ["httpx", "aiohttp"])
def test_the_async_client_drives_the_same_run(system: LaybySystem, transport: str) -> None:
    async def drive() -> layby.RunView:
        async with AsyncClient(system.base_url, api_key=API_KEY, transport=(
                aiohttp_transport() if transport == "aiohttp" else None)) as client:
            run = await client.start("demo.trivia", input="Quiz me")
            run = await client.wait(run.id, until=[Status.INTERRUPTED], timeout=30)
            await client.answer(run.id, run.open_interrupts[0].id, payload="Jaws")
            types = [e.type async for e in client.events(run.id)]
            assert types[-1] == "run.completed"
            async with client.stream("demo.trivia", input="Quiz me") as streamed:
                async for event in streamed:
                    if event.type == "run.interrupted":
                        question = event.data["interrupts"][0]["id"]
                        await client.answer(streamed.id, question, payload="Jaws")
                assert event.type == "run.completed"
            assert (await client.get(streamed.id)).status is Status.COMPLETED
            with pytest.raises(NotFound):
                await client.get("run_nobody")
            return await client.wait(run.id, timeout=30)

    done = asyncio.run(drive())
    assert done.status is Status.COMPLETED and done.result == "Right! It was Jaws (1975)."
