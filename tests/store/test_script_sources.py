"""What a script carries of the shared pieces (`_queue`, `_notes`, `_prelude`, `_folding`):
the definitions it uses, directly or through others, and not the rest (a script runs its
whole source at every call). Checked on the sources as the server gets them, read with a
reader of Lua's comments and strings of its own, not the one that cut them."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from layby.parking import scripts
from layby.parking.scripts import QueuedTask, ScriptSettings, used_of

pytestmark = pytest.mark.store

SETTINGS = ScriptSettings(
    events_max=2000, outbox_grace_ms=5000, lost_message_ms=60_000,
    tasks={"turn": QueuedTask("layby.run_turn", "layby.turns", "layby.turns",
                              '{"body": "@@R@@"}\nlocal x = 1'),
           "resume": QueuedTask("layby.resume_run", "layby.turns")})
SCRIPTS = (*scripts.RUN_SCRIPTS, *scripts.STANDALONE_SCRIPTS, *scripts.FOLDING_SCRIPTS)
TOP_DEFINITION = re.compile(r"^local\s+(?:function\s+)?(\w+(?:\s*,\s*\w+)*)", re.M)
# Lua's comments and strings: long ones (`--[==[ … ]==]`, `[[ … ]]`), then line comments and
# quoted strings (with their escapes).
NOT_CODE = re.compile(r"--\[(=*)\[.*?\]\1\]|\[(=*)\[.*?\]\2\]|--[^\n]*"
                      r"""|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'""", re.S)


def _defined(text: str) -> set[str]:
    return {name.strip() for found in TOP_DEFINITION.findall(text) for name in found.split(",")}


def _bound(text: str) -> set[str]:
    """The names the code binds anywhere: locals at any depth, parameters, loop variables."""
    code = NOT_CODE.sub(" ", text)
    lists = (re.findall(r"\blocal\s+(?:function\s+)?(\w+(?:\s*,\s*\w+)*)", code)
             + re.findall(r"\bfunction\b[\w.:\s]*\(([^)]*)\)", code)
             + re.findall(r"\bfor\s+(\w+(?:\s*,\s*\w+)*)\s+(?:in\b|=)", code))
    return {name.strip() for found in lists for name in found.split(",") if name.strip()}


def _used(text: str) -> set[str]:
    """The names the code uses (not those in comments or strings, not fields)."""
    code = NOT_CODE.sub(" ", text).replace("..", " ")
    return set(re.findall(r"(?<![\w.:])[A-Za-z_]\w*", code))


LUA = resources.files("layby.parking") / "lua"
SHARED = "\n".join((LUA / f"{piece}.lua").read_text()
                   for piece in ("_queue", "_notes", "_prelude", "_folding"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_carries_every_shared_definition_its_code_uses(name: str) -> None:
    source = scripts.source(name, SETTINGS)
    missing = (_used(source) & _defined(SHARED)) - _bound(source)
    assert not missing, f"{name} uses {sorted(missing)} without their definitions"
    assert not re.search(r"__[A-Z_]+__", source), f"{name} has a value left unwritten"


def test_values_are_written_in_after_the_pieces_are_cut() -> None:
    """A value may hold a line that begins `local` (a task message): it is not cut."""
    assert '"}\nlocal x = 1]=]' in scripts.source("create_run", SETTINGS)


def test_a_claim_carries_less_than_half_of_what_a_park_does() -> None:
    claim = scripts.source("claim_run", SETTINGS)
    park = scripts.source("park_run", SETTINGS)
    assert "local function ask(" in park and "local function ask(" not in claim
    assert "local function interrupts_of(" in claim  # it reads the interrupts it parked on
    assert len(claim) < len(park) / 2


def test_what_is_kept_is_what_is_named_directly_or_through_a_kept_definition() -> None:
    shared = "\n".join((
        "-- a header",
        "local A, B = KEYS[1], KEYS[2]",
        "-- about f",
        "local function f() return A end",
        "local function g()",
        "  return 1",
        "end",
        "local T = {}",
        "for k, v in pairs({x = 1}) do T[v] = k end",
        "local function h() return T end",
        "local U = 'named only in a comment'",
    ))
    kept = used_of(shared, "return f() -- and U")
    assert kept.splitlines() == [
        "-- a header", "local A, B = KEYS[1], KEYS[2]",
        "-- about f", "local function f() return A end",
        "local U = 'named only in a comment'"]
    # A loop at the top stays with the table it fills; a function's `end` with the function.
    assert used_of(shared, "return h()").splitlines() == [
        "local T = {}", "for k, v in pairs({x = 1}) do T[v] = k end",
        "local function h() return T end"]
    assert used_of(shared, "return g()").splitlines()[-3:] == [
        "local function g()", "  return 1", "end"]
    assert used_of(shared, "return 1") == ""


def test_a_statement_before_any_definition_is_always_kept() -> None:
    assert used_of("redis.call('PING')\nlocal X = 1", "return 2") == "redis.call('PING')"
