"""layby's exceptions: one base, each carrying the ids a reader needs.

    LaybyError
    ├── ConfigError            an agent, tool or model is declared wrongly
    ├── ResumeError            a resume does not fit the parked history (Genkit's checks)
    │   ├── UnknownToolCall    an answer names a tool call that is not waiting
    │   ├── UnresolvedToolCall a waiting tool call got no answer
    │   └── InvalidAnswer      a payload or replaced input fails its schema
    └── RunFailed              the run cannot go on (max turns, a model error)

Control flow signals raised by tools (`ToolInterrupt`, `EndRun`) live in `generation.tools`
and are not errors.
"""

from __future__ import annotations

from typing import Any


class LaybyError(Exception):
    """Base of every layby error. `detail` is plain JSON for APIs."""

    def __init__(self, message: str, *, run_id: str | None = None, ref: str | None = None,
                 detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.run_id = run_id
        self.ref = ref
        self.detail = detail


class ConfigError(LaybyError):
    pass


class ResumeError(LaybyError):
    pass


class UnknownToolCall(ResumeError):
    pass


class UnresolvedToolCall(ResumeError):
    pass


class InvalidAnswer(ResumeError):
    pass


class RunFailed(LaybyError):
    pass
