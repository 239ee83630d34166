"""Reviewer tokens and the reviewer directory (issue 3's foundations), in process."""

from __future__ import annotations

import time
from email.message import EmailMessage
from pathlib import Path

import pytest

from layby.errors import ConfigError
from layby.reviewers.directory import load_directory
from layby.reviewers.tokens import BadToken, Grant, issue, new_keys, parse_keys, verify

KEYS = parse_keys("k2:new-secret-0123456789,k1:old-secret-0123456789")


def grant() -> Grant:
    return Grant("run_1", "int_abc", "alice", 4, int(time.time()) + 3600)


def minted(keys: dict[str, bytes] = KEYS, given: Grant | None = None
           ) -> tuple[str, dict[str, Grant]]:
    """A token and the grant store it was issued into (Redis, in the product)."""
    given = given or grant()
    ref, token = issue(keys, given)
    return token, {ref: given}


def test_a_token_round_trips_and_fits_a_plus_address() -> None:
    given = grant()  # once: a second grant() a second later would expire a second later
    token, stored = minted(given=given)
    assert token.startswith("k2-")
    assert verify(KEYS, token, stored.get) == given
    assert len(f"reply+{token}") <= 64  # SMTP's limit for a local part
    # Mail servers may change the case of an address: the token survives it.
    assert verify(KEYS, token.upper(), stored.get) == given


def test_rotation_old_key_still_verifies_retired_key_does_not() -> None:
    given = grant()
    token, stored = minted(parse_keys("k1:old-secret-0123456789"), given)
    assert verify(KEYS, token, stored.get) == given
    with pytest.raises(BadToken, match="no longer accepts"):
        verify(parse_keys("k2:new-secret-0123456789"), token, stored.get)


def test_forged_damaged_and_unknown_tokens_are_refused() -> None:
    token, stored = minted()
    kid, ref, sig = token.split("-")
    flipped = sig[:-1] + ("a" if sig[-1] != "a" else "b")
    with pytest.raises(BadToken, match="altered or forged"):
        verify(KEYS, f"{kid}-{ref}-{flipped}", stored.get)
    with pytest.raises(BadToken, match="not hold a valid"):
        verify(KEYS, token + "x", stored.get)
    with pytest.raises(BadToken, match="not hold a valid"):
        verify(KEYS, "", stored.get)
    with pytest.raises(BadToken, match="unknown or has expired"):
        verify(KEYS, token, {}.get)


def test_a_grant_edited_in_the_store_no_longer_verifies() -> None:
    token, stored = minted()
    ref = next(iter(stored))
    stored[ref] = Grant("run_1", "int_abc", "mallory", 4, grant().expires)
    with pytest.raises(BadToken, match="altered or forged"):
        verify(KEYS, token, stored.get)


def test_a_grant_reads_back_as_stored() -> None:
    """(One stored as JSON by 0.1.0's predecessors is rewritten by migration 1:
    tests/store/test_migrations.py.)"""
    given = grant()
    assert Grant.loads(given.stored()) == given
    assert len(given.stored()) < len(given.dumps()) - 40  # held as long as the token
    spaced = Grant("run_1", "int_abc", "Ops team (EU) <ops@example.com>", 4, given.expires)
    assert Grant.loads(spaced.stored()) == spaced  # a reviewer's id may hold spaces


def test_an_expired_token_is_refused() -> None:
    token, stored = minted()
    with pytest.raises(BadToken, match="expired"):
        verify(KEYS, token, stored.get, now=grant().expires + 1)


def test_keys_must_read_id_and_secret() -> None:
    with pytest.raises(ValueError, match="id:secret"):
        parse_keys("justasecret")
    with pytest.raises(ValueError, match="16 characters"):
        parse_keys("k1:short")
    assert list(parse_keys(new_keys()))  # what `layby up` generates parses


def test_directory_resolves_people_groups_and_the_default(tmp_path: Path) -> None:
    path = tmp_path / "reviewers.toml"
    path.write_text('''
default_group = "ops"
[reviewers.alice]
email = "Alice@Example.com"
[reviewers.bot]
webhook = { url = "http://127.0.0.1:9/hook", secret = "whsec_cmV2aWV3ZXItc2VjcmV0LTI0LWJ5dGVz" }
[reviewers.carol]
email = "carol@example.com"
[groups]
ops = ["alice", "bot"]
''')
    directory = load_directory(path)
    assert [r.id for r in directory.resolve(None)] == ["alice", "bot"]
    assert [r.id for r in directory.resolve(["carol", "ops"])] == ["carol", "alice", "bot"]
    assert directory.by_email("alice@example.com").id == "alice"
    assert "whsec" not in repr(directory.reviewers["bot"])


def test_directory_in_yaml_and_its_errors(tmp_path: Path) -> None:
    good = tmp_path / "r.yaml"
    good.write_text("reviewers:\n  dan: {email: dan@example.com}\ngroups: {g: [dan]}\n")
    assert load_directory(good).resolve(["g"])[0].email == "dan@example.com"
    bad = tmp_path / "bad.yaml"
    bad.write_text("reviewers: {}\ngroups: {g: [nobody]}\n")
    with pytest.raises(ConfigError, match="unknown reviewers"):
        load_directory(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_directory(tmp_path / "missing.toml")
    # `*` is the default group's name where requests are indexed by reviewer.
    starred = tmp_path / "starred.yaml"
    starred.write_text("reviewers:\n  dan: {email: dan@example.com}\ngroups: {'*': [dan]}\n")
    with pytest.raises(ConfigError, match="'\\*' may not name a reviewer or a group"):
        load_directory(starred)


def test_an_invalid_directory_is_refused_without_showing_its_secrets(tmp_path: Path) -> None:
    path = tmp_path / "reviewers.toml"
    path.write_text('[reviewers.bot]\nwebhook = { url = "https://h.example/x", '
                    'secret = "supersecretvalue-notbase64!!" }\n')
    with pytest.raises(ConfigError) as caught:
        load_directory(path)
    assert "whsec_" in caught.value.message  # says what a secret must look like
    assert "supersecretvalue" not in caught.value.message


def test_no_smtp_password_in_clear_text_to_another_machine() -> None:
    from layby.broker_config import Settings
    from layby.notifier.mail import PermanentFailure, send

    settings = Settings(smtp_host="smtp.example.com", smtp_username="layby",
                        smtp_password="hunter2-hunter2", smtp_security="none")
    with pytest.raises(PermanentFailure, match="clear text"):
        send(settings, EmailMessage())
