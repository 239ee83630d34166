"""Reviewer tokens and the reviewer directory (issue 3's foundations), in process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from generation.errors import ConfigError
from notifier.directory import load_directory
from notifier.tokens import BadToken, Grant, issue, parse_keys, verify

KEYS = parse_keys("k2:new-secret-0123456789,k1:old-secret-0123456789")


def grant() -> Grant:
    return Grant("run_1", "int_abc", "alice", 4, int(time.time()) + 3600)


def test_a_token_round_trips_and_binds_everything() -> None:
    given = grant()
    token = issue(KEYS, given)
    assert token.startswith("k2.")
    assert verify(KEYS, token) == given
    assert len(token) < 120  # fits a plus-address local part with room to spare


def test_rotation_old_key_still_verifies_retired_key_does_not() -> None:
    given = grant()
    old = issue(parse_keys("k1:old-secret-0123456789"), given)
    assert verify(KEYS, old) == given
    with pytest.raises(BadToken, match="no longer accepts"):
        verify(parse_keys("k2:new-secret-0123456789"), old)


@pytest.mark.parametrize("mangle", [
    lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"),  # signature
    lambda t: t.split(".")[0] + ".eyJ4Ijox." + t.split(".")[2],   # payload swapped
    lambda t: "k2." + t,                                           # shape
    lambda t: "",
])
def test_forged_or_damaged_tokens_are_refused(mangle) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BadToken):
        verify(KEYS, mangle(issue(KEYS, grant())))


def test_an_expired_token_is_refused() -> None:
    given = grant()
    with pytest.raises(BadToken, match="expired"):
        verify(KEYS, issue(KEYS, given), now=given.expires + 1)


def test_keys_must_read_id_and_secret() -> None:
    with pytest.raises(ValueError, match="id:secret"):
        parse_keys("justasecret")


def test_directory_resolves_people_groups_and_the_default(tmp_path: Path) -> None:
    path = tmp_path / "reviewers.toml"
    path.write_text('''
default_group = "ops"
[reviewers.alice]
email = "Alice@Example.com"
[reviewers.bot]
webhook = { url = "http://127.0.0.1:9/hook", secret = "whsec_c2VjcmV0LXNlY3JldA==" }
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
