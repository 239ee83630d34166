"""The keys file (LAYBY_KEYS_FILE) as operators write it: keys with a tenant, agent patterns
and rights, by their secret or their SHA-256; refused whole, naming the file and the line,
when it does not parse, names a right that does not exist, or gives a name or a key twice;
read again when it changes; `layby keys new` appending a key it prints once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from layby.access import Keyring, KeysFileError, digest_of, parse
from layby.access.rights import OPERATOR, Identity
from layby.broker_config.settings import ApiKey
from layby.errors import Forbidden, NotFound
from tests.support.harness import ROOT

GOOD = '''
[keys.billing]
secret = "lby_billing_secret"
tenant = "acme"
agents = ["shop.*"]
can = ["start", "read", "answer", "approve", "cancel"]

[keys.auditor]
sha256 = "{digest}"
tenant = "acme"
can = ["read"]
'''


def test_keys_are_read_with_their_tenant_agents_and_rights() -> None:
    billing, auditor = parse(GOOD.format(digest=digest_of("lby_auditor").hex()), "keys.toml")
    assert (billing.caller, billing.tenant, billing.agents, billing.line) == (
        "api:billing", "acme", ("shop.*",), 2)
    assert billing.can == {"start", "read", "answer", "approve", "cancel"}
    assert (auditor.caller, auditor.can, auditor.agents, auditor.line) == (
        "api:auditor", {"read"}, ("*",), 8)
    ring = Keyring([ApiKey.parse("ops:lby_ops")], None)
    assert ring.find(b"lby_ops").identity().has("admin")  # LAYBY_API_KEYS: every right


@pytest.mark.parametrize(("text", "said"), [
    ("[keys.a]\nsecret = 'x'\nsecret = 'y'\n", "keys.toml: not TOML"),
    ("[keys.a]\nsecret = 'lby_a'\ncan = ['read', 'fly']\n",
     "keys.toml:1: key 'a': unknown right 'fly'; the rights are ['admin', 'answer'"),
    ("[keys.a]\nsecret = 'lby_a'\n\n[keys.b]\nsecret = 'lby_a'\n",
     "keys.toml:4: key 'b' is the same key as 'a' (line 1)"),
    ("[keys.a]\nsecret = 'lby_a'\n[keys.a]\nsecret = 'lby_b'\n", "keys.toml: not TOML"),
    ("[keys.a]\ntenant = 'acme'\n", "keys.toml:1: key 'a': give its `secret` or its `sha256`"),
    ("[keys.a]\nsha256 = 'abc'\n", "`sha256` must be 64 hex digits"),
    ("[keys.a]\nsecret = 'lby_a'\ntenant = 'a b'\n", "`tenant` must be 1 to 64 letters"),
    ("[keys.a]\nsecret = 'lby_a'\nrole = 'x'\n", "keys.toml:1: key 'a': unknown field 'role'"),
    ("[tenants]\nx = 1\n", "unknown section 'tenants'"),
])
def test_a_file_that_cannot_be_used_is_refused_naming_file_and_line(text: str,
                                                                   said: str) -> None:
    with pytest.raises(KeysFileError) as refused:
        parse(text, "keys.toml")
    assert said in refused.value.message


def test_a_change_is_read_and_a_broken_one_leaves_the_keys_as_they_were(
        tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text("[keys.a]\nsecret = 'lby_a'\n")
    ring = Keyring([], path)
    assert ring.find(b"lby_a") is not None and ring.find(b"lby_b") is None
    path.write_text("[keys.a]\nsecret = 'lby_a'\n[keys.b]\nsecret = 'lby_b'\n")
    ring.refresh(1e9)
    assert ring.find(b"lby_b") is not None
    path.write_text("[keys.a]\nsecret = 'lby_a'\ncan = ['fly']\n")
    with pytest.raises(KeysFileError):
        ring.refresh(2e9)
    assert ring.find(b"lby_b") is not None  # the keys read before stay


def test_rights_decide_and_another_tenants_run_is_not_found() -> None:
    reader = Identity("api:auditor", "acme", frozenset({"read"}), ("shop.*",))
    with pytest.raises(Forbidden) as refused:
        reader.require("cancel", "run r1")
    assert refused.value.code == "forbidden" and "may not cancel run r1" in refused.value.message
    with pytest.raises(Forbidden):
        reader.may_start("shop.orders")  # no `start`
    starter = Identity("api:shop", "acme", frozenset({"start"}), ("shop.*",))
    starter.may_start("shop.orders")
    with pytest.raises(Forbidden) as refused:
        starter.may_start("demo.transfer")
    assert refused.value.detail == {"agent": "demo.transfer"}
    with pytest.raises(NotFound):
        reader.reach("r1", "bolt")
    reader.reach("r1", "acme")
    OPERATOR.reach("r1", "bolt")


def test_four_eyes_the_starter_does_not_approve_its_own_run() -> None:
    billing = Identity("api:billing", "acme", frozenset({"approve"}))
    with pytest.raises(Forbidden) as refused:
        billing.may_approve("r1", "api:billing")
    assert refused.value.code == "self_approval"
    billing.may_approve("r1", "api:ops")
    Identity("api:billing", "acme", frozenset({"approve", "self-approve"})).may_approve(
        "r1", "api:billing")


@pytest.mark.integration
def test_layby_keys_new_prints_a_key_once_and_keeps_only_its_hash(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYBY_")}
    env["LAYBY_KEYS_FILE"] = str(path)
    made = subprocess.run([sys.executable, "-m", "layby.ops.cli", "keys", "new", "shop",
                           "--tenant", "acme", "--agents", "shop.*", "--can", "start,read"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("lby_") and secret not in path.read_text()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    [key] = parse(path.read_text())
    assert key.digest == digest_of(secret) and key.can == {"start", "read"}
    again = subprocess.run([sys.executable, "-m", "layby.ops.cli", "keys", "new", "shop"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "a key named 'shop' is there already" in again.stderr
    wrong = subprocess.run([sys.executable, "-m", "layby.ops.cli", "keys", "new", "x",
                            "--can", "read,fly"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "unknown right 'fly'" in wrong.stderr
    assert len(parse(path.read_text())) == 1  # nothing of the refused one was written
