"""Tools: typed functions the model may call, and the context through which they interrupt.

`@tool` turns a typed function into a `Tool` (its input schema from the parameters, its
output schema from the return annotation). Inside, a tool may call
`ctx.interrupt(...)` to ask a person and be run again with the answer in `ctx.resumed`
(Genkit's *restart*; when the question's `response_schema` is a pydantic model, the answer
arrives as an instance of it), `ctx.start_job(...)` to hand work to a background job whose
result answers the interrupt, or `ctx.end_run(...)` to finish the whole run.
`@tool(requires_approval=True)` (or a function of the arguments deciding it) asks a person
to approve each call before the tool runs, with no interrupt code in the tool.
`@interrupt_tool` declares a tool whose only body is the question: the answer is its output
(Genkit's *respond*).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from typing import Any, Literal, NoReturn, get_type_hints, overload

from pydantic import BaseModel, TypeAdapter, ValidationError, create_model

from layby.errors import ConfigError
from layby.generation.interrupts import (
    BACKGROUND_JOB,
    CONFIRMATION,
    INPUT_REQUIRED,
    OnExpire,
    check_reason,
    interrupt_id,
)
from layby.generation.retries import RetryPolicy

# A tool's `retry` when it was given none: its agent's `tool_retry` applies.
AGENT_RETRY: Literal["agent"] = "agent"

log = logging.getLogger(__name__)


def schema_of(spec: Any) -> dict[str, Any] | None:
    """A JSON schema from a dict (taken as is), a type or a pydantic model."""
    if spec is None or isinstance(spec, dict):
        return spec
    return TypeAdapter(spec).json_schema()


def type_path(spec: Any) -> str | None:
    """Where a pydantic model class lives (`module:Qualified.Name`), so that the answer to a
    question asked with it can be handed back as an instance; None for anything else."""
    if isinstance(spec, type) and issubclass(spec, BaseModel) and "<locals>" not in \
            spec.__qualname__:
        return f"{spec.__module__}:{spec.__qualname__}"
    return None


def answer_type(path: str | None) -> type[BaseModel] | None:
    """The model at `path` (see `type_path`), when its module is loaded. Only modules
    already imported are looked in: a stored path never makes this process import
    anything."""
    if path is None:
        return None
    module_name, _, qualname = path.partition(":")
    found: Any = sys.modules.get(module_name)
    for name in qualname.split("."):
        found = getattr(found, name, None)
    return found if isinstance(found, type) and issubclass(found, BaseModel) else None


def typed_answer(path: str | None, payload: Any) -> Any:
    """The answer as an instance of the model at `path`, when that model is loaded and the
    answer fits (answers are checked against it when they are given); else as it came."""
    model = answer_type(path)
    if model is None or payload is None:
        return payload
    try:
        return model.model_validate(payload)
    except ValidationError:
        log.warning("an answer does not fit %s; the tool gets it as plain data", path)
        return payload


# Marks the question `requires_approval` asks, in the interrupt's metadata (namespaced: a
# tool's own metadata cannot claim it by accident).
APPROVAL_MARK = "layby:approval"


class Approval(BaseModel):
    """The answer to an approval: approved or not, with an optional note. The answer page
    shows it as Approve / Decline buttons, and an email reply of "approve" or "decline"
    gives it."""

    approved: bool
    note: str | None = None


@dataclass(frozen=True)
class Ask:
    """What an interrupt asks; raised by `ctx.interrupt`, returned by interrupt tools."""

    message: str | None = None
    reason: str | None = None  # interrupt tools default to their declared reason
    response_schema: Any = None
    metadata: dict[str, Any] | None = None
    expires_in: float | None = None  # seconds
    expires_at: datetime | None = None
    on_expire: OnExpire | None = None
    reviewers: list[str] | None = None
    required_approvals: int = 1  # approvals from distinct reviewers before it is answered


class ToolInterrupt(Exception):
    """Raised (through `ctx.interrupt`) to pause the run on this tool call."""

    def __init__(self, ask: Ask) -> None:
        super().__init__(ask.message or ask.reason)
        self.ask = ask


class EndRun(Exception):
    """Raised (through `ctx.end_run`) to finish the run with `result` as its final text."""

    def __init__(self, result: str) -> None:
        super().__init__(result)
        self.result = result


@dataclass(frozen=True)
class JobRequest:
    """A background job to start: any task known to the broker, by name."""

    task: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    run_id: str
    interrupt_id: str
    job_id: str


JobStarter = Callable[[JobRequest], None]


@dataclass
class ToolContext:
    run_id: str
    version: int
    ref: str
    tool_name: str
    run_metadata: dict[str, Any] = field(default_factory=dict)
    restarted: bool = False
    resumed: Any = None  # the answer a restarted call was given (a model instance if typed)
    jobs: JobStarter | None = None
    approval_asked: bool = False  # the answer is to `requires_approval`'s question
    # Which try of this call this is: 1, then 2, … when its failures are tried again
    # (`RetryPolicy`).
    attempt: int = 1

    @property
    def idempotency_key(self) -> str:
        """Stable across redeliveries of this turn and across the attempts of this call:
        hand it to the outside world, which can then drop a repeat."""
        return f"{self.run_id}:{self.ref}:{self.version}"

    @property
    def interrupt_id(self) -> str:
        return interrupt_id(self.run_id, self.version, self.ref)

    def interrupt(self, message: str | None = None, *, reason: str = CONFIRMATION,
                  response_schema: Any = None, metadata: dict[str, Any] | None = None,
                  expires_in: float | None = None, expires_at: datetime | None = None,
                  on_expire: OnExpire | None = None,
                  reviewers: list[str] | None = None,
                  required_approvals: int = 1) -> NoReturn:
        if required_approvals < 1:
            raise ValueError(f"required_approvals must be 1 or more, not {required_approvals}")
        raise ToolInterrupt(Ask(message, check_reason(reason), response_schema, metadata,
                                expires_in, expires_at, on_expire, reviewers,
                                required_approvals))

    def start_job(self, task: str, *args: Any, message: str | None = None,
                  expires_in: float | None = None, on_expire: OnExpire | None = None,
                  **kwargs: Any) -> NoReturn:
        """Start `task` as a background job and wait for it: its result answers this call."""
        if self.jobs is None:
            raise ConfigError("background jobs need a job starter; none was given",
                              run_id=self.run_id, ref=self.ref)
        job_id = f"job-{self.interrupt_id}"
        self.jobs(JobRequest(task, args, kwargs, self.run_id, self.interrupt_id, job_id))
        raise ToolInterrupt(Ask(message or f"waiting for background job {task}",
                                BACKGROUND_JOB, None, {"jobId": job_id, "task": task},
                                expires_in, None, on_expire, None))

    def end_run(self, result: str) -> NoReturn:
        raise EndRun(result)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    fn: Callable[..., Any]
    input_model: type[BaseModel]
    output: TypeAdapter[Any]
    takes_model: bool  # the function takes the input model itself, not its fields
    ctx_param: str | None
    interrupt_reason: str | None = None  # set for interrupt tools (Genkit's defineInterrupt)
    # True, or a function of the tool's arguments saying whether this call needs approval.
    requires_approval: bool | Callable[..., bool] = False
    # Reviewers may change the call's arguments when they approve it (`replaceInput`).
    allow_edit: bool = False
    # How its failures are tried again: a policy, None (never), or its agent's.
    retry: RetryPolicy | Literal["agent"] | None = AGENT_RETRY

    @property
    def is_interrupt(self) -> bool:
        return self.interrupt_reason is not None

    @property
    def input_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = json.loads(self._schemas[0])
        return schema

    @property
    def output_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = json.loads(self._schemas[1])
        return schema

    @cached_property
    def _schemas(self) -> tuple[str, str]:
        # Made once a tool: pydantic builds a schema in about 0.3 ms, and every model turn
        # sends every tool's. Kept as JSON so each caller gets a copy of its own to change.
        return (json.dumps(self.input_model.model_json_schema()),
                json.dumps(self.output.json_schema()))

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "inputSchema": self.input_schema, "outputSchema": self.output_schema}

    def parse_input(self, raw: Any) -> BaseModel:
        return self.input_model.model_validate(raw if raw is not None else {})

    def call(self, ctx: ToolContext, raw_input: Any) -> Any:
        """Run the tool; returns its output as JSON data. Interrupts propagate."""
        parsed = self.parse_input(raw_input)
        if self._gated(ctx, parsed):
            if not ctx.restarted:
                raise ToolInterrupt(_approval_ask(self, parsed))
            if not _approved(ctx.resumed):
                note = getattr(ctx.resumed, "note", None)
                return {"status": "declined", "reason": note or "not approved"}
            # Approved: the body runs as on a first call (the approval is not its answer).
            ctx = replace(ctx, restarted=False, resumed=None, approval_asked=False)
        args: dict[str, Any] = {} if self.takes_model else dict(parsed)
        if self.ctx_param:
            args[self.ctx_param] = ctx
        result = self.fn(parsed, **args) if self.takes_model else self.fn(**args)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        if self.is_interrupt:
            ask = result if isinstance(result, Ask) else Ask()
            raise ToolInterrupt(_interrupt_ask(self, ask, parsed))
        return self.output.dump_python(self.output.validate_python(result), mode="json")


    def _gated(self, ctx: ToolContext, parsed: BaseModel) -> bool:
        """Whether this call waits for a person's approval: on its first run, as the rule
        says; run again, when the answer it got is the approval's (it says yes or no)."""
        if ctx.restarted:
            # The answer to an approval stands even if the tool no longer asks for one (a
            # run parked on an older version of its agent): a decline never runs it.
            return ctx.approval_asked
        rule = self.requires_approval
        if callable(rule):
            return bool(rule(parsed) if self.takes_model else rule(**dict(parsed)))
        return bool(rule)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _approval_ask(tool: Tool, parsed: BaseModel) -> Ask:
    shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}"
                      for k, v in parsed.model_dump(mode="json").items())
    return Ask(f"Allow {tool.name}({shown})?", CONFIRMATION, Approval,
               {APPROVAL_MARK: True})


def _approved(resumed: Any) -> bool:
    if isinstance(resumed, Approval):
        return resumed.approved
    if isinstance(resumed, dict):
        return resumed.get("approved") is True
    return resumed is True


def _interrupt_ask(tool: Tool, ask: Ask, parsed: BaseModel) -> Ask:
    message = ask.message or next((v for v in dict(parsed).values() if isinstance(v, str)), None)
    return Ask(message, check_reason(ask.reason or tool.interrupt_reason or CONFIRMATION),
               ask.response_schema or tool.output_schema, ask.metadata,
               ask.expires_in, ask.expires_at, ask.on_expire, ask.reviewers,
               ask.required_approvals)


def _build(fn: Callable[..., Any], name: str | None, description: str | None,
           output: Any, interrupt_reason: str | None,
           requires_approval: bool | Callable[..., bool] = False,
           allow_edit: bool = False,
           retry: RetryPolicy | Literal["agent"] | None = AGENT_RETRY) -> Tool:
    hints = get_type_hints(fn, include_extras=True)  # keep Annotated constraints
    params = list(inspect.signature(fn).parameters.values())
    ctx_param = next((p.name for p in params if hints.get(p.name) is ToolContext), None)
    data_params = [p for p in params if p.name != ctx_param]
    first = hints.get(data_params[0].name) if data_params else None
    takes_model = (len(data_params) == 1 and isinstance(first, type)
                   and issubclass(first, BaseModel))
    tool_name = name or fn.__name__
    if takes_model:
        input_model = first
    else:
        fields: dict[str, Any] = {}
        for p in data_params:
            if p.name not in hints:
                raise ConfigError(f"tool {tool_name!r}: parameter {p.name!r} needs a type")
            default = ... if p.default is inspect.Parameter.empty else p.default
            fields[p.name] = (hints[p.name], default)
        input_model = create_model(f"{tool_name}_input", **fields)
    out_type = output if output is not None else hints.get("return", Any)
    if not (retry is None or retry == AGENT_RETRY or isinstance(retry, RetryPolicy)):
        raise ConfigError(f"tool {tool_name!r}: retry must be a RetryPolicy or None, "
                          f"not {retry!r}")
    return Tool(tool_name, description or inspect.getdoc(fn) or "", fn, input_model,
                TypeAdapter(out_type), takes_model, ctx_param, interrupt_reason,
                requires_approval, allow_edit, retry)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(*, name: str | None = None, description: str | None = None,
         requires_approval: bool | Callable[..., bool] = False, allow_edit: bool = False,
         retry: RetryPolicy | Literal["agent"] | None = AGENT_RETRY
         ) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
         description: str | None = None,
         requires_approval: bool | Callable[..., bool] = False, allow_edit: bool = False,
         retry: RetryPolicy | Literal["agent"] | None = AGENT_RETRY
         ) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool from a typed function: `@tool`, or `@tool(name=..., description=...,
    requires_approval=...)`.

    `requires_approval=True` asks a person to approve every call before the tool runs (a
    `confirmation` interrupt answered with `Approval`); a function instead decides per call
    from the tool's arguments (`requires_approval=lambda amount, **_: amount > 100`). A
    call that is declined does not run: the model gets `{"status": "declined", "reason"}`.

    `allow_edit=True` lets the reviewers who approve a call change its arguments first (the
    inbox offers the edit; the tool runs with the new ones, checked against its input
    schema, and the history keeps the original beside them). Without it, only the run's
    owner may (`metadata.replaceInput` through the API).

    `retry`: how the tool's passing failures are tried again (`RetryPolicy`); None never
    tries them again; left out, the agent's `tool_retry` applies (by default
    `RetryPolicy()`: five attempts on connection errors and timeouts).
    """
    if fn is not None:
        return _build(fn, name, description, None, None, requires_approval, allow_edit, retry)
    return lambda f: _build(f, name, description, None, None, requires_approval, allow_edit,
                            retry)


def interrupt_tool(*, output: Any, reason: str = INPUT_REQUIRED, name: str | None = None,
                   description: str | None = None) -> Callable[[Callable[..., Any]], Tool]:
    """Declare a tool whose answer, given by a person, is its output of type `output`.

    The function receives the tool's input and may return an `Ask` to shape the question
    (message, a narrower `response_schema`, expiry, reviewers); it never produces the output.
    """
    check_reason(reason)
    return lambda f: _build(f, name, description, output, reason)
