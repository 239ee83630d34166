"""LAYBY_API_KEYS as the gateway reads it (`ApiKey`): who each key's caller is, and the
entries refused at startup, saying why without ever showing a key. In process."""

from __future__ import annotations

import hashlib

import pytest
from pydantic import ValidationError

from layby.broker_config import Settings


def callers(entries: str) -> list[tuple[str, bytes]]:
    return [(k.caller, k.secret) for k in Settings(api_keys=entries).api_key_table]


def test_a_named_key_is_its_name_and_a_bare_one_its_fingerprint() -> None:
    bare = "lby_0123456789abcdef"
    fingerprint = hashlib.sha256(bare.encode()).hexdigest()[:12]
    assert callers(f"billing:lby_secret-1, {bare}") == [
        ("api:billing", b"lby_secret-1"), (f"api-key:{fingerprint}", bare.encode())]
    assert Settings(api_keys=f"billing:lby_secret-1,{bare}").bearer_keys == [
        "lby_secret-1", bare]


def test_keys_that_start_alike_are_two_callers() -> None:
    (first, _), (second, _) = callers("lby_aaaa-1,lby_aaaa-2")
    assert first != second and first.startswith("api-key:") and second.startswith("api-key:")


def test_a_key_whose_first_part_is_no_name_stays_whole() -> None:
    # A name is letters, digits, dots, dashes and underscores: `//host` is none.
    assert callers("//host:key")[0][1] == b"//host:key"


@pytest.mark.parametrize(("entries", "said"), [
    ("ops:", "names no key after its colon"),
    ("ops:s3cret-key-1,billing:s3cret-key-1", "the same key is given twice (api:billing, "
                                              "api:ops)"),
    ("ops:s3cret-key-1,ops:s3cret-key-2", "the same caller name is given twice (api:ops)"),
    ("ops:s3cret é", "a key named ops holds a space, a control or a non-ASCII character"),
    ("ops:" + "s" * 513, "a key named ops is longer than 512 bytes"),
])
def test_a_bad_entry_is_refused_naming_the_fault_never_the_key(entries: str, said: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(api_keys=entries)
    text = str(refused.value)
    assert said in text, text
    assert "s3cret" not in text and "s" * 100 not in text
