"""The ASGI app, for `uvicorn gateway.app:app` (what `layby gateway` and `layby up` run)."""

from gateway.api import create_app

app = create_app()
