"""layby's exceptions: one base, each carrying the ids a reader needs.

    LaybyError
    ├── ConfigError            an agent, tool or model is declared wrongly
    ├── ResumeError            a resume does not fit the parked history (Genkit's checks)
    │   ├── UnknownToolCall    an answer names a tool call that is not waiting
    │   ├── UnresolvedToolCall a waiting tool call got no answer
    │   └── InvalidAnswer      a payload or replaced input fails its schema
    ├── RunFailed              the run cannot go on (max turns, a model error)
    └── RequestError           a request from outside cannot be applied (HTTP 4xx)
        ├── NotFound           no such run, interrupt or agent            (404)
        ├── Conflict           not open any more: answered, expired, over (409)
        └── Invalid            a payload fails its schema; nothing stored (422)

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
    # Over HTTP: the server's configuration, not the request, is wrong; try again later.
    status_code = 503


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


class RequestError(LaybyError):
    status_code = 400


class Unauthorized(RequestError):
    status_code = 401


class Forbidden(RequestError):
    status_code = 403


class NotFound(RequestError):
    status_code = 404


class Conflict(RequestError):
    status_code = 409


class Invalid(RequestError):
    status_code = 422


class TooLarge(RequestError):
    status_code = 413


class Unavailable(RequestError):
    """Something on the server's side is away for now; the caller should try again."""

    status_code = 503
