"""What another service does with layby's Python client: start a refund, answer its
questions, and print how it ended. LAYBY_URL and LAYBY_API_KEY name the gateway.

    LAYBY_URL=http://127.0.0.1:8000 LAYBY_API_KEY=… python refund_script.py 42 250
"""

from __future__ import annotations

import sys

from layby import CONFIRMATION, Client, RunView


def refund(order: str, amount: int, reason: str = "damaged in transit") -> RunView:
    with Client() as client:
        run = client.start("shop.support", input=f"Refund {amount} on order {order}",
                           idempotency_key=f"refund-{order}")
        run = client.wait(run.id, until={"interrupted"})
        client.answer(run.id, run.open_interrupts[0].id, payload=reason)
        run = client.wait(run.id, until={"interrupted", "completed"})
        for question in run.open_interrupts:
            if question.reason == CONFIRMATION:  # an approval, for amounts over the limit
                client.answer(run.id, question.id, payload={"approved": True})
        return client.wait(run.id, timeout=120)


if __name__ == "__main__":
    finished = refund(sys.argv[1], int(sys.argv[2]))
    print(finished.result or finished.error)
