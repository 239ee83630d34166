"""Agents (name, model, system prompt, tools, max turns) and the registry that finds them.

Agents are declared as module-level `Agent` objects; `load_agents` imports the modules named
in a setting and collects every agent it finds there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from layby.errors import ConfigError
from layby.generation.importing import import_user_module
from layby.generation.models import Model
from layby.generation.tools import Tool

DEFAULT_MAX_TURNS = 10


@dataclass(frozen=True)
class Agent:
    name: str
    model: Model
    system: str | None = None
    tools: tuple[Tool, ...] = ()
    max_turns: int = DEFAULT_MAX_TURNS
    description: str = ""
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ConfigError(f"agent {self.name!r} declares a tool name twice: {names}")
        if self.max_turns < 1:
            raise ConfigError(f"agent {self.name!r}: max_turns must be at least 1")

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)


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
