"""The ASGI app, for `uvicorn gateway.app:app` (what `layby gateway` and `layby up` run)."""

import logging
import re

from layby.broker_config import get_settings, logs
from layby.http.api import create_app

# Reviewer tokens travel in URLs (/review/<token>); access logs must not keep them.
_TOKEN_IN_PATH = re.compile(r"(/review/)[^/?\s]+")


class _RedactTokens(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_TOKEN_IN_PATH.sub(r"\1<token>", a) if isinstance(a, str)
                                else a for a in record.args)
        return True


# uvicorn has set up its loggers by the time it imports the app: send them through layby's
# handler, so the gateway writes the configured format (JSON with ids, or text).
logs.configure(get_settings())
logging.getLogger("uvicorn.access").addFilter(_RedactTokens())

app = create_app()
