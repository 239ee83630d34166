"""The shop's Celery tasks. `render_credit_note` runs as a layby background job: the refund
agent's `credit_note` tool starts it, and its result answers the run. A plain Celery task:
nothing of layby is imported here."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="shop.render_credit_note")
def render_credit_note(order: str, amount: int) -> dict[str, object]:
    return {"number": f"CN-{order}", "order": order, "amount": amount}
