"""layby's exceptions: one tree, each carrying the ids a reader needs. ::

    LaybyError
    ├── ConfigError            an agent, tool, model or setting is declared wrongly
    ├── ResumeError            a resume does not fit the parked history (Genkit's checks)
    │   ├── UnknownToolCall    an answer names a tool call that is not waiting
    │   ├── UnresolvedToolCall a waiting tool call got no answer
    │   └── InvalidAnswer      a payload or replaced input fails its schema
    ├── RunFailed              the run cannot go on (max turns, a model error)
    └── RequestError           a request from outside cannot be applied
        ├── Unauthorized       no valid credentials (API key, signature)
        ├── Forbidden          valid credentials that may not do this (a reviewer's token)
        ├── NotFound           no such run, interrupt or agent
        ├── Conflict           not open any more: answered, expired, over; a replay
        ├── Invalid            a payload fails its schema; nothing stored
        ├── TooLarge           over a size limit
        └── Unavailable        something on the server's side is away for now; try again

No HTTP status codes here: the HTTP edge maps these classes to statuses in one table
(`layby.http.errors`), and `layby.Client` raises them again from the API's error bodies, so
`except layby.Conflict` reads the same in a worker, a web handler and a client. Control
flow signals raised by tools (`ToolInterrupt`, `EndRun`) live in `layby.generation.tools`
and are not errors.
"""

from __future__ import annotations

from typing import Any


class LaybyError(Exception):
    """Base of every layby error. `detail` is plain JSON for APIs.

    `code` is the error's code in API bodies (the class name in lowercase unless given);
    `status_code` is None, except on errors `layby.Client` raises from a refused request,
    where it is the response's HTTP status.
    """

    def __init__(self, message: str, *, run_id: str | None = None, ref: str | None = None,
                 detail: Any = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.run_id = run_id
        self.ref = ref
        self.detail = detail
        self._code = code
        self.status_code: int | None = None

    @property
    def code(self) -> str:
        return self._code or type(self).__name__.lower()


class ConfigError(LaybyError):
    """The server's own configuration is wrong (not the request): fix it, then try again."""


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
    pass


class Unauthorized(RequestError):
    pass


class Forbidden(RequestError):
    pass


class NotFound(RequestError):
    pass


class Conflict(RequestError):
    pass


class Invalid(RequestError):
    pass


class TooLarge(RequestError):
    pass


class Unavailable(RequestError):
    """Something on the server's side is away for now; the caller should try again."""
