"""One TLS context for every httpx client a test process makes.

httpx builds a new `ssl.SSLContext` for each client, loading every CA certificate into it
(about 25 ms of CPU here), even for a client that only ever speaks plain HTTP to a gateway
on loopback. The tests make about twenty thousand of them in a run (`httpx.get` is a client
too, and the harness polls with it): sampled with py-spy over the suite's first part, two
thirds of the pytest processes' own CPU went to loading certificates. `share()` makes a
client that would build the default context take one built once instead, the same one httpx
would build (its own `create_ssl_context()`, which reads `SSL_CERT_FILE` and `SSL_CERT_DIR`
as it does): same trust, one load. A client given a context or `verify=False` of its own
keeps it."""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


def share() -> None:
    if getattr(httpx.Client.__init__, "_shares_tls", False):
        return  # shared already: the same context for the process's whole life
    context = httpx.create_ssl_context()
    for cls in (httpx.Client, httpx.AsyncClient):
        cls.__init__ = _sharing(cls.__init__, context)  # type: ignore[method-assign]


def _sharing(init: Any, context: ssl.SSLContext) -> Any:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, verify: Any = True, **kwargs: Any) -> None:
        init(self, *args, verify=context if verify is True else verify, **kwargs)

    __init__._shares_tls = True  # type: ignore[attr-defined]
    return __init__
