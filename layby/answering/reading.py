"""A reply's words as the answer to an interrupt: `read_answer` turns what the reviewer wrote
(after `layby.answering.mime.reply_text`) into a `ResumeEntry`, checked against the interrupt's
`responseSchema`. When a reply cannot be read, `Unreadable` says why and how to write one that
can (`layby.reviewers.schemas.how_to_answer`): that text goes back to the reviewer as is.
Pure: no network, no Redis.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from layby.errors import Invalid
from layby.generation.answers import check_answer
from layby.generation.interrupts import Interrupt, ResumeEntry
from layby.reviewers.schemas import (
    answer_kind,
    has_approved,
    how_to_answer,
    main_schema,
    property_of,
)


class Unreadable(Invalid):
    """The reply was read but holds no answer that fits; the message tells the reviewer how to
    reply instead."""


_APPROVE = frozenset({"approve", "approved", "yes", "y", "lgtm", "accept", "confirm"})
_DECLINE = frozenset({"decline", "declined", "no", "n", "reject", "rejected", "deny", "denied"})
_TRUE, _FALSE = _APPROVE | {"true"}, _DECLINE | {"false"}  # a yes/no question, said as JSON
_WORD_PUNCTUATION = "!.,:;?\"'()[]*_“”‘’"
_REASON_LEAD = ":-,–— \t\n"
_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")
# At most six digits: a longer run is no choice number (and int() refuses thousands).
_CHOICE_NUMBER = re.compile(r"(\d{1,6})\s*[.)]?(\s+(?P<rest>.*))?")


def read_answer(interrupt: Interrupt, text: str) -> ResumeEntry:
    """The answer a reply (the output of `reply_text`) gives to `interrupt`, checked against
    its schema. Raises `Unreadable` with what was wrong and how to answer."""
    text = text.strip()
    if not text:
        raise _unreadable(interrupt, "your reply was empty: no text was found above the "
                                     "quoted message.")
    kind = answer_kind(interrupt)
    schema = main_schema(interrupt.response_schema)
    if kind == "confirmation":
        entry = _read_confirmation(interrupt, text)
    elif kind == "enum" and schema is not None:
        entry = _resolved(interrupt, _read_choice(interrupt, schema["enum"], text))
    elif kind in ("integer", "number"):
        entry = _resolved(interrupt, _read_number(interrupt, text, kind == "integer"))
    elif kind == "boolean":
        word, _ = _first_word(text)
        if word not in _TRUE | _FALSE:
            raise _unreadable(interrupt, 'your reply should start with "yes" or "no", but it '
                                         f'starts with "{_clip(word)}".')
        entry = _resolved(interrupt, word in _TRUE)
    elif kind == "json":
        entry = _resolved(interrupt, _read_json(interrupt, schema, text))
    else:  # string, or no schema at all: the reviewer's words are the answer
        entry = _resolved(interrupt, text)
    errors = check_answer(interrupt, entry)
    if errors:
        listed = "\n".join(f"  - {_describe(e)}" for e in errors)
        raise _unreadable(interrupt, f"your answer does not fit what was asked:\n{listed}",
                          detail=errors)
    return entry


_HANDOVER = re.compile(r"^\s*(?:delegate|hand\s+(?:it\s+)?(?:on\s+)?)\s*(?:to\s+)?"
                       r"<?([A-Za-z0-9][A-Za-z0-9_.+@-]{0,199}?)>?[.!]?\s*$", re.IGNORECASE)


def read_handover(text: str) -> tuple[str, str | None] | None:
    """`delegate bob` (or `delegate to bob@example.com`, `hand on to bob`) on the first
    line: whom the reviewer hands the request to, and the rest of the reply as a note."""
    first, _, rest = text.strip().partition("\n")
    found = _HANDOVER.match(first)
    if not found:
        return None
    return found.group(1), rest.strip()[:2000] or None


def _resolved(interrupt: Interrupt, payload: Any) -> ResumeEntry:
    return ResumeEntry(interrupt_id=interrupt.id, status="resolved", payload=payload)


def _first_word(text: str) -> tuple[str, str]:
    """The first word, lowercased and without punctuation, and the text after it."""
    parts = text.strip().split(maxsplit=1)
    if not parts:
        return "", ""
    return parts[0].strip(_WORD_PUNCTUATION).lower(), parts[1] if len(parts) > 1 else ""


def _read_confirmation(interrupt: Interrupt, text: str) -> ResumeEntry:
    word, rest = _first_word(text)
    if word not in _APPROVE | _DECLINE:
        raise _unreadable(interrupt, 'your reply should start with "approve" or "decline", '
                                     f'but it starts with "{_clip(word)}".')
    approved = word in _APPROVE
    reason = rest.strip().lstrip(_REASON_LEAD).strip() or None
    schema = interrupt.response_schema
    if has_approved(schema):
        payload: dict[str, Any] = {"approved": approved}
        if reason is not None and property_of(schema, "note") is not None:
            payload["note"] = reason
        return _resolved(interrupt, payload)
    if not approved:
        return ResumeEntry(interrupt_id=interrupt.id, status="cancelled",
                           metadata={"reason": reason} if reason else None)
    # A plain yes/no schema on a confirmation wants the yes itself; otherwise there is no
    # payload to give, and check_answer decides whether the schema allows none.
    main = main_schema(schema)
    return _resolved(interrupt, True if main and main.get("type") == "boolean" else None)


def _read_choice(interrupt: Interrupt, choices: list[Any], text: str) -> Any:
    line = _first_line(text)
    by_text = {_normal(str(c)): c for c in choices}
    if _normal(line) in by_text:
        return by_text[_normal(line)]
    numbered = _CHOICE_NUMBER.fullmatch(line.strip())
    if numbered:
        # "2", "2." or "2)"; also "2. Alien" copied from the list, when the two agree.
        n, rest = int(numbered.group(1)), numbered.group("rest")
        if not 1 <= n <= len(choices):
            raise _unreadable(interrupt, f"{n} is not a choice number: the choices go from 1 "
                                         f"to {len(choices)}.")
        if not rest or _normal(rest) == _normal(str(choices[n - 1])):
            return choices[n - 1]
    raise _unreadable(interrupt, f'"{_clip(line)}" is not one of the choices.')


def _normal(text: str) -> str:
    return " ".join(text.strip().strip(_WORD_PUNCTUATION + " ").split()).casefold()


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.split("\n") if line.strip()), "")


def _read_number(interrupt: Interrupt, text: str, whole: bool) -> int | float:
    line = _first_line(text)
    found = _NUMBER.match(line)
    if not found:
        raise _unreadable(interrupt, f'your first line, "{_clip(line)}", does not start with '
                                     'a number.')
    value = float(found.group(0))
    if not math.isfinite(value):  # hundreds of digits come out as infinity
        raise _unreadable(interrupt, f"{_clip(found.group(0))} is too large a number.")
    if value.is_integer() and ("." not in found.group(0) or whole):
        return int(value)
    if whole:
        raise _unreadable(interrupt, f"{found.group(0)} is not a whole number.")
    return value


_STRAIGHT_QUOTES = str.maketrans("“”‘’", "\"\"''")


def _read_json(interrupt: Interrupt, schema: dict[str, Any] | None, text: str) -> Any:
    # Mail clients turn straight quotes into curly ones as the reviewer types.
    text = text.translate(_STRAIGHT_QUOTES)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        whole_error = exc
    except RecursionError:
        raise _unreadable(interrupt, "your reply's JSON is nested too deeply.") from None
    found = (schema or {}).get("type")
    # No type, or a list of types (["object", "array"]): any JSON value.
    kind = found if isinstance(found, str) else ""
    opener = {"object": "{", "array": "["}.get(kind, "{[")
    block_error: json.JSONDecodeError | None = None
    decoder = json.JSONDecoder()
    for i, char in enumerate(text):
        if char in opener:
            try:
                return decoder.raw_decode(text, i)[0]
            except json.JSONDecodeError as exc:
                block_error = block_error or exc  # says more than the error on the prose
            except RecursionError:
                raise _unreadable(interrupt, "your reply's JSON is nested too deeply.") from None
    error = block_error or whole_error
    what = {"object": "JSON object", "array": "JSON array"}.get(kind, "JSON value")
    raise _unreadable(interrupt, f"your reply holds no {what} I could read ({error.msg} at "
                                 f"line {error.lineno} column {error.colno}).")


def _describe(error: dict[str, Any]) -> str:
    path = error.get("path") or "/"
    return error["message"] if path == "/" else f"at {path}: {error['message']}"


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _unreadable(interrupt: Interrupt, problem: str, detail: Any = None) -> Unreadable:
    return Unreadable(f"{problem}\n\n{how_to_answer(interrupt)}", ref=interrupt.id,
                      detail=detail)
