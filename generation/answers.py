"""Answers: checking one against its interrupt, and turning a set of them into a `Resume`.

An answer arrives as AG-UI's resume entry. `check_answer` refuses what cannot apply (a
payload outside `responseSchema`, `replaceInput` outside the tool's input schema, an edit of
an answer-only request) before anything is stored. `to_resume` maps the stored answers of a
parked turn onto Genkit's `respond` / `restart` and layby's `decline`.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from generation.interrupts import Interrupt, ResumeEntry, ResumeMode
from generation.messages import Part, ToolRequest, ToolResponse
from generation.turn import Resume


def schema_errors(schema: dict[str, Any] | None, value: Any) -> list[dict[str, Any]]:
    """Validation errors of `value` against a JSON schema, as `{path, message}` items."""
    if not schema:
        return []
    try:
        validator = Draft202012Validator(schema)
        found = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    except SchemaError as exc:
        return [{"path": "", "message": f"the interrupt's responseSchema is invalid: {exc}"}]
    return [{"path": "/" + "/".join(str(p) for p in e.absolute_path), "message": e.message}
            for e in found]


def check_answer(interrupt: Interrupt, entry: ResumeEntry) -> list[dict[str, Any]]:
    """Why `entry` cannot answer `interrupt`; empty when it can."""
    if entry.status == "cancelled":
        return []
    errors = schema_errors(interrupt.response_schema, entry.payload)
    replace = (entry.metadata or {}).get("replaceInput")
    if replace is not None:
        if interrupt.mode is not ResumeMode.RESTART:
            errors.append({"path": "/metadata/replaceInput",
                           "message": "replaceInput applies only to tools that run again "
                                      f"after approval; {interrupt.tool_name!r} takes its "
                                      "answer as its output"})
        else:
            errors += [{"path": "/metadata/replaceInput" + e["path"].rstrip("/"),
                        "message": e["message"]}
                       for e in schema_errors(interrupt.input_schema, replace)]
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
            replace = (entry.metadata or {}).get("replaceInput")
            if replace is not None:
                meta["replaceInput"] = replace
            # No input: the request runs again as it stands in history (or as replaced).
            resume.restart.append(Part(tool_request=ToolRequest(
                name=intr.tool_name, ref=intr.tool_call_id), metadata=meta))
    return resume
