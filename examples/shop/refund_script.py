"""What another service does with layby's Python client: start a refund, answer its
questions, and print how it ended. LAYBY_URL and LAYBY_API_KEY name the gateway.

    LAYBY_URL=http://127.0.0.1:8000 LAYBY_API_KEY=… python refund_script.py 42 250
"""

from __future__ import annotations

import sys

from layby import BACKGROUND_JOB, CONFIRMATION, Client, RunView


def refund(order: str, amount: int, reason: str = "damaged in transit") -> RunView:
    """Run a refund to its end. Started again for the same order, the idempotency key finds
    the run already started, and this picks up wherever it stands."""
    with Client() as client:
        run = client.start("shop.support", input=f"Refund {amount} on order {order}",
                           idempotency_key=f"refund-{order}")
        while True:
            run = client.wait(run.id, until="interrupted", timeout=120)
            asked = [i for i in run.open_interrupts if i.reason != BACKGROUND_JOB]
            if not asked:  # finished, or waiting only on the credit note's job
                return client.wait(run.id, timeout=120)
            for question in asked:
                if question.reason == CONFIRMATION:  # an approval, for amounts over 100
                    client.answer(run.id, question.id, payload={"approved": True})
                else:
                    client.answer(run.id, question.id, payload=reason)


if __name__ == "__main__":
    finished = refund(sys.argv[1], int(sys.argv[2]))
    print(finished.result or finished.error)
