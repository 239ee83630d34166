"""The tests' httpx clients share one TLS context (tests/support/tls.py), with the trust
httpx would give each of them, and a client that asks for other TLS keeps its own."""

from __future__ import annotations

import asyncio
import ssl

import httpx

from tests.support.tls import share


def _context(client: httpx.Client | httpx.AsyncClient) -> ssl.SSLContext:
    return client._transport._pool._ssl_context  # type: ignore[attr-defined,no-any-return]


def test_every_client_takes_the_one_context_with_httpxs_own_trust() -> None:
    share()  # again: the session did it already; a second time changes nothing
    with httpx.Client() as one, httpx.Client(base_url="http://127.0.0.1:1") as two:
        shared = _context(one)
        assert _context(two) is shared
    client = httpx.AsyncClient()
    assert _context(client) is shared
    asyncio.run(client.aclose())
    # What httpx builds for a client of its own: the same CA certificates, verified.
    own = httpx.create_ssl_context()
    assert shared.cert_store_stats() == own.cert_store_stats()
    assert shared.cert_store_stats()["x509_ca"] > 0
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname


def test_a_client_with_tls_of_its_own_keeps_it() -> None:
    with httpx.Client() as default, httpx.Client(verify=False) as unverified:
        assert _context(unverified) is not _context(default)
        assert _context(unverified).verify_mode == ssl.CERT_NONE
    mine = ssl.create_default_context()
    with httpx.Client(verify=mine) as given:
        assert _context(given) is mine
