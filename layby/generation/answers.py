"""Answers: checking one against its interrupt, and turning a set of them into a `Resume`.

An answer arrives as AG-UI's resume entry. `check_answer` refuses what cannot apply (a
payload outside `responseSchema`, `replaceInput` outside the tool's input schema, an edit of
an answer-only request) before anything is stored. `to_resume` maps the stored answers of a
parked turn onto Genkit's `respond` / `restart` and layby's `decline`.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

from layby.errors import Invalid
from layby.generation.interrupts import Interrupt, ResumeEntry, ResumeMode
from layby.generation.messages import Part, ToolRequest, ToolResponse
from layby.generation.tools import APPROVAL_MARK, Tool, answer_type
from layby.generation.turn import Resume

MAX_JSON_DEPTH = 64


def check_storable(value: Any, what: str) -> None:
    """Refuse JSON data that parses but could not be stored or sent back: nested too deep,
    text that is not Unicode, NaN or Infinity. `what` names it in the error."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise Invalid(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError:
                # `"\ud800"` is valid JSON but not valid Unicode: Redis cannot store it.
                raise Invalid(f"{what} holds a lone UTF-16 surrogate (such as \\ud800); "
                              "send valid Unicode text") from None
        elif isinstance(item, float) and not math.isfinite(item):
            # Python's parser takes NaN and Infinity; JSON has neither, so no reply could
            # carry them back.
            raise Invalid(f"{what} holds NaN or Infinity, which JSON does not allow")
        elif isinstance(item, dict):
            stack.extend((k, depth) for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def schema_errors(schema: dict[str, Any] | None, value: Any) -> list[dict[str, Any]]:
    """Validation errors of `value` against a JSON schema, as `{path, message}` items."""
    if not schema:
        return []
    # jsonschema (with referencing, attrs and rpds) costs every process about 30 ms and 40
    # modules at its start: loaded by the first answer checked against a schema instead.
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        validator = Draft202012Validator(schema)
        found = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    except SchemaError as exc:
        return [{"path": "", "message": f"the interrupt's responseSchema is invalid: {exc}"}]
    return [{"path": "/" + "/".join(str(p) for p in e.absolute_path), "message": e.message}
            for e in found]


def pydantic_errors(check: Any, value: Any) -> list[dict[str, Any]]:
    """What `check` (a pydantic validation) finds wrong with `value`, as schema_errors
    lists it."""
    try:
        check(value)
    except ValidationError as exc:
        return [{"path": "".join(f"/{p}" for p in e["loc"]), "message": e["msg"]}
                for e in exc.errors(include_url=False)]
    return []


def check_answer(interrupt: Interrupt, entry: ResumeEntry,
                 tool: Tool | None = None) -> list[dict[str, Any]]:
    """Why `entry` cannot answer `interrupt`; empty when it can.

    With the `tool` at hand, its own types check too (validators and formats a JSON schema
    does not carry), so what would fail at resume is refused now, the interrupt still open.
    """
    if entry.status == "cancelled":
        return []
    errors = schema_errors(interrupt.response_schema, entry.payload)
    if not errors and tool is not None and tool.is_interrupt \
            and interrupt.mode is ResumeMode.RESPOND:
        errors = pydantic_errors(tool.output.validate_python, entry.payload)
    typed = answer_type(interrupt.response_type)
    if not errors and typed is not None and entry.payload is not None:
        # The tool will get the answer as this model: what it would refuse, refuse now.
        errors = pydantic_errors(typed.model_validate, entry.payload)
    replace = (entry.metadata or {}).get("replaceInput")
    if replace is not None:
        if interrupt.mode is not ResumeMode.RESTART:
            errors.append({"path": "/metadata/replaceInput",
                           "message": "replaceInput applies only to tools that run again "
                                      f"after approval; {interrupt.tool_name!r} takes its "
                                      "answer as its output"})
        else:
            found = schema_errors(interrupt.input_schema, replace)
            if not found and tool is not None:
                found = pydantic_errors(tool.parse_input, replace)
            errors += [{"path": "/metadata/replaceInput" + e["path"].rstrip("/"),
                        "message": e["message"]} for e in found]
    return errors


def to_resume(interrupts: list[Interrupt], answers: dict[str, ResumeEntry]) -> Resume:
    """Genkit's respond/restart for the interrupts of one parked turn."""
    resume = Resume()
    for intr in interrupts:
        entry = answers.get(intr.id)
        if entry is None:
            continue
        if entry.status == "cancelled":
            reason = (entry.metadata or {}).get("reason")
            resume.decline[intr.tool_call_id] = reason or "declined by the reviewer"
        elif intr.mode is ResumeMode.RESPOND:
            resume.respond.append(Part(tool_response=ToolResponse(
                name=intr.tool_name, ref=intr.tool_call_id, output=entry.payload)))
        else:
            meta: dict[str, Any] = {"resumed": entry.payload if entry.payload is not None
                                    else True}
            if intr.response_type:
                meta["resumedType"] = intr.response_type
            if (intr.metadata or {}).get(APPROVAL_MARK) is True:
                meta["approval"] = True  # the answer to `requires_approval`'s question
            replace = (entry.metadata or {}).get("replaceInput")
            if replace is not None:
                meta["replaceInput"] = replace
            # No input: the request runs again as it stands in history (or as replaced).
            resume.restart.append(Part(tool_request=ToolRequest(
                name=intr.tool_name, ref=intr.tool_call_id), metadata=meta))
    return resume
