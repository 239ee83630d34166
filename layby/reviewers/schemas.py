"""Reading an interrupt's `responseSchema`, the one way for every reviewer channel: what kind
of answer it takes (a confirmation, a choice, a number, text, a JSON object), its fields,
and how a person gives it. The answer page builds its form from this, an email reply is read
by it, and the notification mail says how to reply with it, so all three agree.
"""

from __future__ import annotations

import json
from typing import Any, Literal, cast

from layby.generation.interrupts import CONFIRMATION, Interrupt

AnswerKind = Literal["confirmation", "enum", "integer", "number", "boolean", "string", "text",
                     "json"]


def main_schema(schema: Any, root: Any = None, depth: int = 0) -> dict[str, Any] | None:
    """The schema that matters for reading a reply: local `$ref`s followed and an optional
    value (`anyOf` with null, `type: [x, "null"]`) taken as its non-null side."""
    if not isinstance(schema, dict) or depth > 10:
        return None
    root = schema if root is None else root
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for key in ref[2:].split("/"):
            target = target.get(key) if isinstance(target, dict) else None
        return main_schema(target, root, depth + 1) if target is not None else schema
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list) and "type" not in schema and "enum" not in schema:
        real = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
        if len(real) == 1:
            return main_schema(real[0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        real_kinds = [k for k in kind if k != "null"]
        if len(real_kinds) == 1:
            return {**schema, "type": real_kinds[0]}
    return schema




def without_null(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The schema with its `null` alternative removed, and whether there was one.

    pydantic writes `note: str | None` as `anyOf: [{type: string}, {type: null}]`; for a form
    that is an optional string (an empty field sends nothing).
    """
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            rest = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            if len(rest) == 1 and len(options) == 2:
                return {k: v for k, v in schema.items() if k != key} | rest[0], True
    kind = schema.get("type")
    if isinstance(kind, list) and "null" in kind:
        rest = [k for k in kind if k != "null"]
        if len(rest) == 1:
            return schema | {"type": rest[0]}, True
    return schema, False




def json_type(schema: dict[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind
    if "properties" in schema:
        return "object"
    values = schema.get("enum") or ([schema["const"]] if "const" in schema else [])
    types = {type(v) for v in values}
    if types == {str}:
        return "string"
    if types == {bool}:
        return "boolean"
    return None




def properties(schema: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    if not schema or json_type(schema) != "object":
        return {}
    properties = schema.get("properties")
    return properties if isinstance(properties, dict) else {}




def property_of(schema: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    """A property of an object schema as written (the answer page builds its fields from
    the same properties, so the page and replies agree on what a schema asks)."""
    prop = properties(schema).get(name)
    return prop if isinstance(prop, dict) else None


def is_const(schema: dict[str, Any]) -> bool:
    schema = without_null(schema)[0]
    enum = schema.get("enum")
    return "const" in schema or (isinstance(enum, list) and len(enum) == 1)




def const_value(schema: dict[str, Any]) -> Any:
    return schema["const"] if "const" in schema else schema["enum"][0]




def allows_null(prop: Any) -> bool:
    if not isinstance(prop, dict):
        return False
    options = prop.get("anyOf") or prop.get("oneOf") or []
    kinds = prop.get("type")
    return (any(isinstance(o, dict) and o.get("type") == "null" for o in options)
            or (isinstance(kinds, list) and "null" in kinds))


def has_approved(schema: dict[str, Any] | None) -> bool:
    """An object with a boolean `approved` (however written: `type`, an enum of booleans,
    optional or not): what Approve / Decline buttons and "approve" / "decline" replies give."""
    prop = property_of(schema, "approved")
    return prop is not None and json_type(without_null(prop)[0]) == "boolean"


def is_confirmation(interrupt: Interrupt) -> bool:
    """Whether the interrupt is answered with Approve / Decline buttons.

    A schema with a boolean `approved` is one whatever the reason. A `confirmation` with some
    other object schema is one too (what else the schema asks for becomes extra fields), but
    not one whose answer cannot be an object: buttons could not produce it.
    """
    schema = interrupt.response_schema or None
    if has_approved(schema):
        return True
    return interrupt.reason == CONFIRMATION and (schema is None or json_type(schema) == "object")




def answer_kind(interrupt: Interrupt) -> AnswerKind:
    if is_confirmation(interrupt):
        return "confirmation"
    schema = main_schema(interrupt.response_schema)
    if schema is None:
        return "text"
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "enum"
    kind = schema.get("type")
    if kind in ("string", "integer", "number", "boolean"):
        return cast("AnswerKind", kind)  # one of the four just listed
    return "json"




def how_to_answer(interrupt: Interrupt) -> str:
    """Plain-text instructions for answering `interrupt` by reply."""
    kind = answer_kind(interrupt)
    schema = main_schema(interrupt.response_schema)
    if kind == "confirmation":
        keeps_reason = (not has_approved(interrupt.response_schema)
                        or property_of(interrupt.response_schema, "note") is not None)
        tail = "; anything after it is kept as your reason." if keeps_reason else "."
        return f'Reply with "approve" or "decline" on the first line{tail}'
    if kind == "enum" and schema is not None:
        listed = "\n".join(f"  {i}. {c}" for i, c in enumerate(schema["enum"], 1))
        return ("Reply with one of these choices on the first line (its number is enough):\n"
                f"{listed}")
    if kind in ("integer", "number") and schema is not None:
        what = "a whole number" if kind == "integer" else "a number"
        return f"Reply with {what}{_bounds(schema)} on the first line."
    if kind == "boolean":
        return 'Reply with "yes" or "no" on the first line.'
    if kind != "json" or schema is None:
        return "Reply with your answer on the first lines."
    root = interrupt.response_schema
    example = json.dumps(_example(schema, root), indent=2, ensure_ascii=False)
    if schema.get("type") == "object" and isinstance(schema.get("properties"), dict):
        required = set(schema.get("required") or [])
        fields = "\n".join(
            f"  {name} ({_type_label(prop, root)}"
            f"{', required' if name in required else ''})"
            + (f": {prop['description']}" if isinstance(prop, dict) and prop.get("description")
               else "")
            for name, prop in schema["properties"].items())
        return (f"Reply with a JSON object with these fields:\n{fields}\n\n"
                f"For example:\n{example}")
    if schema.get("type") == "array":
        items = _type_label(schema.get("items") or {}, root)
        return f"Reply with a JSON array (items: {items}).\n\nFor example:\n{example}"
    return (f"Reply with a JSON value matching this schema:\n{json.dumps(root, indent=2)}\n\n"
            f"For example:\n{example}")


def _bounds(schema: dict[str, Any]) -> str:
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None and high is not None:
        return f" between {low} and {high}"
    if low is not None:
        return f" of at least {low}"
    if high is not None:
        return f" of at most {high}"
    return ""


def _type_label(prop: Any, root: Any) -> str:
    main = main_schema(prop, root) or {}
    optional = main is not prop and allows_null(prop)
    if isinstance(main.get("enum"), list):
        label = "one of " + ", ".join(json.dumps(c, ensure_ascii=False) for c in main["enum"])
    elif main.get("type") == "array":
        label = f"list of {_type_label(main.get('items') or {}, root)}"
    elif isinstance(main.get("type"), str):
        label = main["type"]
    else:
        label = "any value"
    return f"{label} or null" if optional else label


def _example(prop: Any, root: Any, depth: int = 0) -> Any:
    """A value of the schema's shape to show the reviewer, from its types."""
    main = main_schema(prop, root) or {}
    if depth > 5:
        return None
    examples = main.get("examples")
    if isinstance(examples, list) and examples:
        return examples[0]
    if main.get("default") is not None:
        return main["default"]
    if "const" in main:
        return main["const"]
    if isinstance(main.get("enum"), list) and main["enum"]:
        return main["enum"][0]
    kind = main.get("type")
    if kind == "object":
        found = main.get("properties")
        props = found if isinstance(found, dict) else {}
        return {name: _example(sub, root, depth + 1) for name, sub in props.items()}
    if kind == "array":
        return [_example(main.get("items") or {}, root, depth + 1)]
    if kind in ("integer", "number"):
        return main.get("minimum", 0)
    # `type` may be a list of types (["string", "integer"]): no one example for that.
    return {"string": "text", "boolean": True, "null": None}.get(
        kind if isinstance(kind, str) else "", "…")
