"""Agents (name, model, system prompt, tools, max turns, version) and the registry that
finds them.

Agents are declared as module-level `Agent` objects; `load_agents` imports the modules named
in a setting and collects every agent it finds there.

An agent has a `version`: given, or a fingerprint of what a parked run depends on (its
name, model name, system prompt, and its tools' names and input schemas). A run parked on
one version and resumed on another is checked, pinned or migrated as `on_change` and
`migrate` say (`layby.generation.versions`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from layby.errors import ConfigError
from layby.generation.importing import import_user_module
from layby.generation.models import Model
from layby.generation.retries import DEFAULT_RETRY, RetryPolicy
from layby.generation.tools import AGENT_RETRY, Tool

if TYPE_CHECKING:
    from layby.generation.stored_run import StoredRun

DEFAULT_MAX_TURNS = 10
# A version names a queue (`layby.turns@<version>`) and is written into events whose JSON
# is cut by position (parking.events): no spaces, quotes, commas or '@'.
_VERSION = re.compile(r"^[A-Za-z0-9._:+-]{1,64}$")
OnChange = Literal["continue", "pin"]


class _Fingerprint(str):
    """A version layby worked out rather than one given: `dataclasses.replace` hands it back
    to `__post_init__`, which works it out again for the changed agent."""


def fingerprint(agent: Agent) -> str:
    """12 hex digits of SHA-256 over canonical JSON: the same in every process and release
    for the same declaration. The name is in it so that two agents never share a version
    (a pinned run's queue is named by its version alone)."""
    tools = sorted([t.name, t.input_schema] for t in agent.tools)
    text = json.dumps({"agent": agent.name, "model": agent.model.name,
                       "system": agent.system, "tools": tools},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Agent:
    name: str
    model: Model
    system: str | None = None
    tools: tuple[Tool, ...] = ()
    max_turns: int = DEFAULT_MAX_TURNS
    description: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    # None: the fingerprint (always a str once made). Give one to decide yourself when a
    # change counts, or to keep it through changes the fingerprint would see (a pydantic
    # upgrade that writes schemas differently).
    version: str = None  # type: ignore[assignment]
    # What a run parked on another version does when it resumes here: "continue" (after a
    # check that its interrupts' tools still take their inputs and answers) or "pin" (its
    # steps run only on workers that host the version it started on).
    on_change: OnChange = "continue"
    # Given the stored run of another version, returns it changed to fit this one (checked
    # as "continue" checks, after).
    migrate: Callable[[StoredRun], StoredRun] | None = None
    # How its tools' failures are tried again, for tools that say nothing themselves
    # (`@tool(retry=...)`); None: never.
    tool_retry: RetryPolicy | None = DEFAULT_RETRY

    def __post_init__(self) -> None:
        if not (self.tool_retry is None or isinstance(self.tool_retry, RetryPolicy)):
            raise ConfigError(f"agent {self.name!r}: tool_retry must be a RetryPolicy or "
                              f"None, not {self.tool_retry!r}")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ConfigError(f"agent {self.name!r} declares a tool name twice: {names}")
        if self.max_turns < 1:
            raise ConfigError(f"agent {self.name!r}: max_turns must be at least 1")
        if self.on_change not in ("continue", "pin"):
            raise ConfigError(f"agent {self.name!r}: on_change must be 'continue' or 'pin', "
                              f"not {self.on_change!r}")
        if self.version is None or isinstance(self.version, _Fingerprint):
            object.__setattr__(self, "version", _Fingerprint(fingerprint(self)))
        elif not isinstance(self.version, str) or not _VERSION.match(self.version):
            raise ConfigError(f"agent {self.name!r}: version {self.version!r} is not usable: "
                              "use 1 to 64 letters, digits, '.', '_', ':', '+' or '-'")

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def retry_policy(self, tool: Tool) -> RetryPolicy | None:
        """The policy `tool`'s failures are tried again under: its own, or this agent's."""
        return self.tool_retry if tool.retry == AGENT_RETRY else tool.retry


def load_agents(modules: list[str]) -> dict[str, Agent]:
    """Import each module and collect its module-level `Agent`s, by name."""
    found: dict[str, Agent] = {}
    for module_name in modules:
        module = import_user_module(module_name, "LAYBY_AGENT_MODULES")
        for value in vars(module).values():
            if isinstance(value, Agent):
                other = found.get(value.name)
                if other is not None and other is not value:
                    raise ConfigError(f"two agents are named {value.name!r}")
                found[value.name] = value
    return found


def hosted(agents: Iterable[Agent], versions: Iterable[str] = ()) -> tuple[str, ...]:
    """What a worker with `agents` runs of pinned runs, as `<agent>@<version>`: each
    agent's own version, or, when `versions` are given (LAYBY_AGENT_VERSIONS), those
    instead, for every agent (an operator's word that this code runs them)."""
    chosen = list(versions)
    for version in chosen:
        if not _VERSION.match(version):
            raise ConfigError(f"LAYBY_AGENT_VERSIONS: {version!r} is not a version (1 to 64 "
                              "letters, digits, '.', '_', ':', '+' or '-')")
    return tuple(sorted({f"{a.name}@{v}" for a in agents for v in (chosen or [a.version])}))


def hosted_versions(tokens: Iterable[str]) -> list[str]:
    """The versions in `hosted` tokens, each once (a pinned queue per version)."""
    return sorted({token.rsplit("@", 1)[1] for token in tokens})
