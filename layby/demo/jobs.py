"""The demo's background job: a report that takes a few seconds to compile. A plain Celery
task, as users write theirs: `@shared_task` with a name, nothing of layby imported."""

from __future__ import annotations

import time

from celery import shared_task


@shared_task(name="demo.compile_report")
def compile_report(topic: str, seconds: float = 3.0) -> dict[str, object]:
    time.sleep(seconds)
    words = [w for w in topic.split() if len(w) > 3] or [topic]
    return {"title": f"Report on {topic}", "pages": 3,
            "summary": f"3 findings on {', '.join(words[:3])}; no blockers"}
