"""Review forms: an interrupt's `responseSchema` as an HTML form, and a posted form as an answer.

The review page works without JavaScript, so whatever a reviewer enters arrives as strings in
a plain POST. `form_for` picks the controls that can express an answer fitting the schema;
`entry_from_form` turns the posted strings back into typed JSON and checks the result as the
API would (`check_answer`), so a bad answer is refused before anything is stored and the
page can say why next to the field.

Error paths name form fields (`/guests`, `/payload`, `/decision`), and every message names
the field it is about, since the page lists them at the top as well as beside each control.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from layby.errors import Invalid
from layby.generation.answers import check_answer
from layby.generation.interrupts import Interrupt, ResumeEntry
from layby.reviewers.schemas import (
    const_value,
    is_confirmation,
    is_const,
    json_type,
    without_null,
)
from layby.reviewers.schemas import (
    properties as properties_of,
)

FieldKind = Literal["text", "textarea", "number", "integer", "checkbox", "radio", "json"]

PAYLOAD = "payload"  # the one field of a form whose answer is not an object
DECISION = "decision"  # the name of the approve / decline submit buttons
DECISIONS = ("approve", "decline")
YES, NO = "yes", "no"

# Longer strings than this get a textarea: a one-line input hides most of what was typed.
_SHORT_TEXT = 200


@dataclasses.dataclass
class Field:
    name: str
    label: str
    kind: FieldKind
    required: bool = False
    choices: list[str] = dataclasses.field(default_factory=list)
    description: str | None = None
    value: str = ""  # prefilled from the schema's default
    # What the field's value must fit: kept so the posted string converts the same way the
    # field was chosen, without walking the schema twice.
    schema: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)


@dataclasses.dataclass
class Form:
    kind: Literal["confirmation", "fields"]
    fields: list[Field]
    decision: str | None = None  # the button a link preselected ("approve" / "decline")


def form_for(interrupt: Interrupt, decision: str | None = None) -> Form:
    """The form that answers `interrupt`; `decision` (from a link) preselects a button."""
    schema = interrupt.response_schema or None
    if is_confirmation(interrupt):
        return Form("confirmation", _confirmation_fields(schema),
                    decision if decision in DECISIONS else None)
    properties = properties_of(schema)
    if properties:
        required = set(schema.get("required") or []) if schema else set()
        return Form("fields", [f for name, prop in properties.items()
                               if (f := _field(name, prop, name in required)) is not None])
    # Not an object with properties: the answer is one value, entered in one field.
    field = _field(PAYLOAD, schema or {}, True, label="Your answer")
    if field is None:  # a schema allowing one value: still the reviewer's to give
        field = Field(PAYLOAD, "Your answer", "radio", True, [_choice(const_value(schema or {}))],
                      schema=schema or {})
    return Form("fields", [field])


def entry_from_form(interrupt: Interrupt, form: Mapping[str, str]) -> ResumeEntry:
    """The answer a posted review form gives; raises `Invalid` when it cannot be one.

    Keys the form does not know (a CSRF token, say) are ignored.
    """
    built = form_for(interrupt)
    single = built.kind == "fields" and not properties_of(interrupt.response_schema)
    if built.kind == "confirmation":
        entry = _confirmation_entry(interrupt, built, form)
    else:
        values, errors = _read_fields(built.fields, form)
        if errors:
            raise _invalid(errors)
        payload = (values.get(PAYLOAD) if single
                   else _constants(properties_of(interrupt.response_schema)) | values)
        entry = ResumeEntry(interrupt_id=interrupt.id, status="resolved", payload=payload)
    if entry.status == "resolved":
        problems = [_as_field_error(e, built, single) for e in check_answer(interrupt, entry)]
        if problems:
            raise _invalid(problems)
    return entry


EDIT = "input."  # what a field of the call's arguments is named after, in an edit


def input_fields(interrupt: Interrupt) -> list[Field]:
    """The call's arguments as fields to edit (`input.<name>`), each showing its value now;
    empty when the input schema names no properties to edit one by one. None is required:
    a field left as shown, or emptied, keeps the value the agent gave."""
    schema = interrupt.input_schema or None
    current = interrupt.tool_input if isinstance(interrupt.tool_input, dict) else {}
    fields = []
    for name, prop in properties_of(schema).items():
        field = _field(EDIT + name, prop, False, label=prop.get("title") or _humanize(name))
        if field is not None:
            value = current.get(name)
            field.value = _shown(value, field.schema) if name in current else ""
            if field.kind == "text" and isinstance(value, str) and "\n" in value:
                field.kind = "textarea"  # a one-line input would drop its line breaks
            fields.append(field)
    return fields


def input_from_form(interrupt: Interrupt, form: Mapping[str, str]) -> Any:
    """The arguments an edit posted, or None when it changes none of them; raises
    `Invalid` naming the fields that cannot be read. A field posted as it was shown is no
    edit (its text is not trimmed or converted), nor is one emptied."""
    current = interrupt.tool_input if isinstance(interrupt.tool_input, dict) else {}
    edited = dict(current)
    errors: list[dict[str, str]] = []
    for field in input_fields(interrupt):
        raw = form.get(field.name)
        if raw is None:
            continue
        raw = raw.replace("\r\n", "\n")  # how browsers post a textarea's line breaks
        if raw == field.value or not raw.strip():
            continue
        try:
            edited[field.name.removeprefix(EDIT)] = _convert(
                field, raw if field.kind == "textarea" else raw.strip())
        except ValueError as exc:
            errors.append({"path": f"/{field.name}", "message": f"{field.label}: {exc}"})
    if errors:
        raise _invalid(errors)
    return None if edited == current else edited


# -- building fields -----------------------------------------------------------------------

def _confirmation_fields(schema: dict[str, Any] | None) -> list[Field]:
    properties = properties_of(schema)
    required = set(schema.get("required") or []) if schema else set()
    # Constants are left out: pressing Approve is the sign-off they ask for.
    fields = [f for name, prop in properties.items() if name not in ("approved", "note")
              and not is_const(prop) and (f := _field(name, prop, name in required))]
    note_schema = properties.get("note")
    if note_schema is not None and not is_const(note_schema):
        note = _field("note", note_schema, "note" in required,
                      label="Note" if "note" in required else "Note (optional)")
        assert note is not None  # only constants have no field
        note.kind = "textarea"  # free text beside the decision, whatever its length limit
        fields.append(note)
    else:
        fields.append(Field("reason", "Reason (optional)", "textarea",
                            description="Tell the agent why, if you decline."))
    return fields


def _field(name: str, prop: dict[str, Any], required: bool,
           label: str | None = None) -> Field | None:
    """The control for one value, or None for a constant that needs no asking."""
    schema, nullable = without_null(prop)
    required = required and not nullable
    label = label or schema.get("title") or _humanize(name)
    description = schema.get("description")
    default = _shown(schema.get("default"), schema)
    if is_const(schema):
        if const_value(schema) is True:  # a sign-off ("I have checked …"): the reviewer ticks it
            return Field(name, label, "checkbox", required, description=description,
                         schema=schema)
        return None  # filled in by `_constants`
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return Field(name, label, "radio", required, [_choice(v) for v in schema["enum"]],
                     description, default, schema)
    kind: FieldKind
    match json_type(schema):
        case "string":
            short = schema.get("maxLength", _SHORT_TEXT + 1) <= _SHORT_TEXT
            kind = "text" if short or "format" in schema or "pattern" in schema else "textarea"
        case "integer":
            kind = "integer"
        case "number":
            kind = "number"
        case "boolean":
            return Field(name, label, "radio", required, [YES, NO], description, default,
                         schema)
        case _:
            kind = "json"
    return Field(name, label, kind, required, description=description, value=default,
                 schema=schema)


# -- reading a posted form -----------------------------------------------------------------

def _confirmation_entry(interrupt: Interrupt, built: Form,
                        form: Mapping[str, str]) -> ResumeEntry:
    decision = (form.get(DECISION) or "").strip()
    if decision not in DECISIONS:
        raise _invalid([{"path": f"/{DECISION}", "message": "Choose Approve or Decline."}])
    schema = interrupt.response_schema or None
    properties = properties_of(schema)
    note_field = built.fields[-1]
    note = _text(form.get(note_field.name))
    if decision == "decline" and "approved" not in properties:
        # No way to say "no" inside the payload: decline the tool call itself.
        return ResumeEntry(interrupt_id=interrupt.id, status="cancelled",
                           metadata={"reason": note} if note else None)
    payload, errors = _read_fields(built.fields[:-1], form)
    payload = _constants(properties, ticked=True) | payload
    if "approved" in properties:
        payload["approved"] = decision == "approve"
    elif not _closed(schema):
        payload["approved"] = True  # what `layby runs answer --approve` sends
    metadata = None
    if note_field.name == "note":
        if note:
            payload["note"] = note
        elif note_field.required:
            errors.append(_required(note_field))
    elif note:
        metadata = {"reason" if decision == "decline" else "note": note}
    if errors:
        raise _invalid(errors)
    return ResumeEntry(interrupt_id=interrupt.id, status="resolved", payload=payload,
                       metadata=metadata)


def _read_fields(fields: list[Field],
                 form: Mapping[str, str]) -> tuple[dict[str, Any], list[dict[str, str]]]:
    values: dict[str, Any] = {}
    errors: list[dict[str, str]] = []
    for field in fields:
        raw = _text(form.get(field.name))
        if not raw:
            # An unticked box is not sent at all: it says nothing, like an empty field.
            if field.required:
                errors.append(_required(field))
            continue
        try:
            values[field.name] = _convert(field, raw)
        except ValueError as exc:
            errors.append({"path": f"/{field.name}", "message": f"{field.label}: {exc}"})
    return values, errors


def _convert(field: Field, raw: str) -> Any:
    """The typed value of one posted string; ValueError says what is wrong, for a person."""
    match field.kind:
        case "text" | "textarea":
            return raw
        case "integer":
            try:
                return int(raw)
            except ValueError:
                number = _float(raw, "a whole number")
                if not number.is_integer():
                    raise ValueError(f"{raw!r} is not a whole number") from None
                return int(number)
        case "number":
            try:
                return int(raw)  # keeps 3 as 3, not 3.0
            except ValueError:
                return _float(raw, "a number")
        case "checkbox":
            return const_value(field.schema)
        case "radio":
            if field.choices == [YES, NO] and json_type(field.schema) == "boolean":
                if raw.lower() in (YES, "true", "on"):
                    return True
                if raw.lower() in (NO, "false", "off"):
                    return False
            else:
                options = field.schema.get("enum") or [field.schema.get("const")]
                for option in options:
                    if _choice(option) == raw:
                        return option
            raise ValueError(f"{raw!r} is not one of the choices "
                             f"({', '.join(field.choices)})")
        case _:
            try:
                return json.loads(raw)
            except json.JSONDecodeError as exc:
                if not field.schema:
                    # No schema to say what is wanted: plain text is an answer (as in the CLI).
                    return raw
                raise ValueError(f"not valid JSON ({exc.msg} at line {exc.lineno}, "
                                 f"column {exc.colno})") from None
            except RecursionError:
                raise ValueError("not valid JSON (nested too deeply)") from None


def _float(raw: str, what: str) -> float:
    try:
        number = float(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not {what}") from None
    if not math.isfinite(number):  # "nan" and "inf" parse, but JSON has no such numbers
        raise ValueError(f"{raw!r} is not {what}")
    return number


def _as_field_error(error: dict[str, Any], built: Form, single: bool) -> dict[str, str]:
    """A `check_answer` error (a path into the payload) as one about a form field."""
    path = error["path"]
    if single:  # the whole payload is the one field
        path = f"/{PAYLOAD}{path.rstrip('/')}"
    field = {f.name: f for f in built.fields}.get(path.split("/")[1] if "/" in path else "")
    message = f"{field.label}: {error['message']}" if field else error["message"]
    return {"path": path, "message": message}


def _required(field: Field) -> dict[str, str]:
    verb = "must be ticked" if field.kind == "checkbox" else "is required"
    return {"path": f"/{field.name}", "message": f"{field.label} {verb}."}


def _invalid(errors: list[dict[str, str]]) -> Invalid:
    return Invalid("the answer does not fit the request: "
                   + "; ".join(e["message"] for e in errors), detail={"errors": errors})


def _text(raw: str | None) -> str:
    # Browsers post textarea line breaks as CRLF; stray spaces around a value are accidents.
    return (raw or "").replace("\r\n", "\n").strip()


# -- reading schemas -----------------------------------------------------------------------

def _constants(properties: dict[str, dict[str, Any]], ticked: bool = False) -> dict[str, Any]:
    """Values the schema fixes, so no field asks for them; `True` ones are checkboxes unless
    `ticked` (in a confirmation, Approve ticks them)."""
    fixed = {}
    for name, prop in properties.items():
        if is_const(prop):
            value = const_value(without_null(prop)[0])
            if ticked or value is not True:
                fixed[name] = value
    return fixed


def _closed(schema: dict[str, Any] | None) -> bool:
    if not schema:
        return False
    return (schema.get("additionalProperties") is False
            or schema.get("unevaluatedProperties") is False)


def _choice(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _shown(default: Any, schema: dict[str, Any]) -> str:
    """A schema default as the string a control shows."""
    if default is None:
        return ""
    if isinstance(default, bool) and json_type(schema) == "boolean":
        return YES if default else NO
    if isinstance(default, str):
        return default
    if isinstance(default, (int, float)) and json_type(schema) in ("integer", "number"):
        return json.dumps(default)
    return json.dumps(default, indent=2, ensure_ascii=False)


def _humanize(name: str) -> str:
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name).replace("_", " ").replace("-", " ")
    words = " ".join(words.split()).lower()
    return words[:1].upper() + words[1:]
