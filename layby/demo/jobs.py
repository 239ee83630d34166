"""The demo's background job: a report that takes a few seconds to compile."""

from __future__ import annotations

import time

from layby.broker_config import app


@app.task(name="demo.compile_report")
def compile_report(topic: str, seconds: float = 3.0) -> dict[str, object]:
    time.sleep(seconds)
    words = [w for w in topic.split() if len(w) > 3] or [topic]
    return {"title": f"Report on {topic}", "pages": 3,
            "summary": f"3 findings on {', '.join(words[:3])}; no blockers"}
