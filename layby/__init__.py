"""layby: durable interrupts for LLM agent runs on Celery and Redis/Valkey.

Write agents and tools (run by layby's workers)::

    from layby import Agent, tool, interrupt_tool, ToolContext, Ask, Approval
    from layby import RetryPolicy, RetryLater              # when a tool fails
    from layby import ScriptedModel, Reply, Call          # real models: layby.models

Drive runs from another service::

    from layby import Client, AsyncClient

The rest lives in documented submodules: `layby.models` (model adapters), `layby.testing`
(fixtures for your own tests), `layby.errors` (every exception), `layby.wire` (the API's
shapes). Importing layby connects to nothing and reads no settings.
"""

from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

from layby.errors import Conflict, Invalid, LaybyError, NotFound, Unauthorized
from layby.generation.agents import Agent
from layby.generation.interrupts import (
    BACKGROUND_JOB,
    CONFIRMATION,
    INPUT_REQUIRED,
    TOOL_CALL,
    OnExpire,
    ResumeEntry,
)
from layby.generation.retries import RetryLater, RetryPolicy
from layby.generation.scripted import Call, Case, Choose, Reply, ScriptedModel
from layby.generation.stored_run import StoredRun
from layby.generation.tools import Approval, Ask, ToolContext, interrupt_tool, tool
from layby.wire import Answer, Delegation, Event, InterruptView, RunSummary, RunView, Status

if TYPE_CHECKING:
    from layby.client import AsyncClient, Client


def __getattr__(name: str) -> Any:
    # The clients load with their first use (`from layby import Client` included): a
    # worker, a sweeper or a gateway never needs httpx, which with its command line's rich
    # and pygments (loaded when installed) cost each start about 70 ms.
    if name in ("Client", "AsyncClient"):
        from layby import client

        return getattr(client, name)
    raise AttributeError(f"module 'layby' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "AsyncClient", "Client"})


try:
    __version__ = _metadata.version("layby")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0"

__all__ = [
    "BACKGROUND_JOB", "CONFIRMATION", "INPUT_REQUIRED", "TOOL_CALL",
    "Agent", "Answer", "Approval", "Ask", "AsyncClient", "Call", "Case", "Choose", "Client",
    "Conflict", "Delegation", "Event", "InterruptView", "Invalid", "LaybyError", "NotFound",
    "OnExpire", "Reply",
    "ResumeEntry", "RetryLater", "RetryPolicy", "RunSummary", "RunView", "ScriptedModel",
    "Status", "StoredRun",
    "ToolContext",
    "Unauthorized", "interrupt_tool", "tool",
]
