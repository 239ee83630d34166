"""Reading reviewers' email replies: the raw message, the words the reviewer wrote, the answer.

A reviewer answers an interrupt by replying to its notification. The reply goes to
`reply+<token>@…`; `parse_mail` reads the raw message into a `Mail`, `token_from_address`
finds the token among its recipients, `reply_text` keeps only what the reviewer wrote (no
quoted notification, no signature) and `read_answer` turns that into a `ResumeEntry` for the
interrupt, checked against its `responseSchema`. When a reply cannot be read, `Unreadable`
says why and, through `how_to_answer`, how to write one that can: that text goes back to the
reviewer as is. Pure: no network, no Redis.
"""

from __future__ import annotations

import email
import email.policy
import json
import math
import re
from dataclasses import dataclass
from email.message import Message
from email.utils import getaddresses
from html.parser import HTMLParser
from typing import Any

from email_reply_parser import EmailReplyParser

from layby.generation.answers import check_answer
from layby.errors import Invalid
from layby.generation.interrupts import Interrupt, ResumeEntry
from layby.inbox.forms import is_confirmation


class MalformedMail(Invalid):
    """The raw message cannot be read as an email: not MIME, no sender, no text to read."""


class Unreadable(Invalid):
    """The reply was read but holds no answer that fits; the message tells the reviewer how to
    reply instead."""


@dataclass(frozen=True)
class Mail:
    sender: str  # bare address, lowercased
    recipients: list[str]  # To, Cc, Delivered-To, X-Original-To: bare, lowercased, deduped
    subject: str
    message_id: str | None  # as written, angle brackets included (what In-Reply-To wants)
    text: str  # the body as plain text
    automatic: bool = False  # sent by a robot (out of office, vacation): never an answer


# --- parse_mail ---------------------------------------------------------------------------

_RECIPIENT_HEADERS = ("To", "Cc", "Delivered-To", "X-Original-To")


def parse_mail(raw: bytes) -> Mail:
    """Read a raw RFC 5322 message. Raises `MalformedMail` saying what is missing."""
    if not raw or not raw.strip():
        raise MalformedMail("the message is empty")
    try:
        msg = email.message_from_bytes(raw, policy=email.policy.default)
    except Exception as exc:  # the parser is lenient; anything it raises means unreadable
        raise MalformedMail(f"the message cannot be parsed as MIME: {exc}") from exc
    if not msg.keys():
        raise MalformedMail("this is not an email message: it has no headers")
    senders = _addresses(msg, "From")
    if not senders:
        if msg.get("From") is None:
            raise MalformedMail("the message has no From: header, so its sender is unknown")
        raise MalformedMail("the message's From: header holds no email address")
    recipients: list[str] = []
    for name in _RECIPIENT_HEADERS:
        for address in _addresses(msg, name):
            if address not in recipients:
                recipients.append(address)
    return Mail(sender=senders[0], recipients=recipients, subject=_header(msg, "Subject"),
                message_id=_header(msg, "Message-ID") or None, text=_body_text(msg),
                automatic=_is_automatic(msg))


def _is_automatic(msg: Message) -> bool:
    """RFC 3834's Auto-Submitted, and what common auto-responders send instead."""
    submitted = _header(msg, "Auto-Submitted").lower()
    precedence = _header(msg, "Precedence").lower()
    return bool((submitted and submitted != "no") or precedence in ("auto_reply", "bulk", "junk")
                or msg.get("X-Autoreply") or msg.get("X-Autorespond"))


def _header(msg: Message, name: str) -> str:
    try:
        value = msg.get(name)
    except Exception:  # a damaged header should not sink the whole reply
        return ""
    return " ".join(str(value).split()) if value is not None else ""


def _addresses(msg: Message, name: str) -> list[str]:
    """Bare, lowercased addresses of every `name` header; only those with an '@'."""
    found: list[str] = []
    try:
        values = msg.get_all(name) or []
    except Exception:
        return found
    for value in values:
        # Address headers come parsed (display names may hold commas once decoded); the
        # others (Delivered-To, X-Original-To) are plain strings.
        parsed = getattr(value, "addresses", None)
        if parsed is not None:
            specs = [a.addr_spec for a in parsed]
        else:
            specs = [spec for _, spec in getaddresses([str(value)])]
        for spec in specs:
            spec = spec.strip().strip("<>").lower()
            if "@" in spec and spec not in found:
                found.append(spec)
    return found


def _body_text(msg: Message) -> str:
    plain = html = None
    for part in msg.walk():
        if part.is_multipart() or part.get_content_disposition() == "attachment":
            continue
        kind = part.get_content_type()
        if kind == "text/plain" and plain is None:
            plain = part
        elif kind == "text/html" and html is None:
            html = part
    if plain is not None:
        text = _decoded(plain)
        if plain.get_param("format", "").lower() == "flowed":
            text = _unflow(text, delsp=plain.get_param("delsp", "").lower() == "yes")
    elif html is not None:
        text = html_to_text(_decoded(html))
    else:
        kind = msg.get_content_type()
        raise MalformedMail(f"the message ({kind}) has no text/plain or text/html part to "
                            "read an answer from")
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\xa0", " ")


def _decoded(part: Message) -> str:
    """The part's text: transfer encoding undone, then its charset (or the likely ones)."""
    payload = part.get_payload(decode=True)
    if isinstance(payload, str):
        return payload
    raw = payload or b""
    for charset in (part.get_content_charset(), "utf-8"):
        if charset:
            try:
                return raw.decode(charset)
            except (LookupError, UnicodeDecodeError):
                continue
    # Mislabelled mail is common; Windows-1252 decodes almost any byte and reads best.
    return raw.decode("cp1252", errors="replace")


def _unflow(text: str, *, delsp: bool) -> str:
    """Undo RFC 3676 format=flowed: a line ending in a space continues on the next."""
    out: list[tuple[int, str]] = []
    joining = False
    for line in text.replace("\r\n", "\n").split("\n"):
        depth = len(line) - len(line.lstrip(">"))
        body = line[depth:]
        if body.startswith(" "):  # space-stuffing
            body = body[1:]
        soft = body.endswith(" ") and body != "-- "
        if soft and delsp:
            body = body[:-1]
        if joining and out and out[-1][0] == depth:
            out[-1] = (depth, out[-1][1] + body)
        else:
            out.append((depth, body))
        joining = soft
    return "\n".join(("> " * depth if depth else "") + body for depth, body in out)


class _HtmlText(HTMLParser):
    _BLOCKS = frozenset({"p", "div", "tr", "li", "ul", "ol", "table", "blockquote", "pre",
                         "hr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article",
                         "header", "footer"})
    _HIDDEN = frozenset({"style", "script", "head", "title"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self._line: list[str] = []
        self._line_depth = 0
        self._quote_depth = 0  # inside <blockquote>: rendered as "> " so quotes get removed
        self._hidden = 0
        self._pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._HIDDEN:
            self._hidden += 1
        elif tag == "br":
            self._end_line(keep_empty=True)
        elif tag in self._BLOCKS:
            self._end_line()
        if tag == "blockquote":
            self._quote_depth += 1
        elif tag == "pre":
            self._pre += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in self._HIDDEN:
            self._hidden = max(0, self._hidden - 1)
        elif tag in self._BLOCKS:
            self._end_line()
            if tag == "p":
                self.lines.append("")
        if tag == "blockquote":
            self._quote_depth = max(0, self._quote_depth - 1)
        elif tag == "pre":
            self._pre = max(0, self._pre - 1)

    def handle_data(self, data: str) -> None:
        if self._hidden:
            return
        if self._pre:
            first, *rest = data.split("\n")
            self._add(first)
            for piece in rest:
                self._end_line(keep_empty=True)
                self._add(piece)
        else:
            self._add(re.sub(r"\s+", " ", data))

    def _add(self, text: str) -> None:
        if not self._line:
            self._line_depth = self._quote_depth
        self._line.append(text)

    def _end_line(self, *, keep_empty: bool = False) -> None:
        text = "".join(self._line).strip()
        if text:
            self.lines.append("> " * self._line_depth + text)
        elif keep_empty:
            self.lines.append("")
        self._line = []

    def text(self) -> str:
        self.close()
        self._end_line()
        return re.sub(r"\n{3,}", "\n\n", "\n".join(self.lines)).strip()


def html_to_text(html: str) -> str:
    """Plain text of an HTML body: tags dropped, line breaks kept, blockquotes as '> '."""
    parser = _HtmlText()
    parser.feed(html)
    return parser.text()


# --- token_from_address -------------------------------------------------------------------

_REPLY_LOCAL = re.compile(r"reply\+([a-z0-9-]+)")


def token_from_address(address: str) -> str | None:
    """The token of a `reply+<token>@domain` address (display name and '<>' allowed)."""
    pairs = getaddresses([address or ""])
    spec = (pairs[0][1] if pairs and pairs[0][1] else address or "").strip().strip("<>")
    local, at, domain = spec.lower().rpartition("@")
    if not at or not domain.strip():
        return None
    found = _REPLY_LOCAL.fullmatch(local)
    return found.group(1) if found else None


# --- reply_text ---------------------------------------------------------------------------

# "On Mon, 3 Nov 2026 at 10:02, layby <layby@x> wrote:" and its siblings in a few languages
# ("Am 3. Nov. 2026 um 10:02 schrieb layby <layby@x>:"). A date always has a digit, which keeps
# a reply that merely starts with "On second thought" from being taken for one.
_QUOTE_HEADER = re.compile(
    r"(On|Le|Am|El|Il|Op|Em)\s.*\d.*\b(wrote|écrit|schrieb|escribió|scritto|schreef|escreveu)"
    r"\b.*:", re.IGNORECASE)
MAX_HEADER_LINE = 300
_ORIGINAL_MESSAGE = re.compile(r"-{2,}\s*(Original Message|Forwarded message)\s*-{2,}",
                               re.IGNORECASE)
_OUTLOOK_FROM = re.compile(r"\*?From:\*?\s+\S")
_OUTLOOK_SENT = re.compile(r"\*?(Sent|Date):\*?\s+\S")
_RULE = re.compile(r"[_-]{8,}")
_MOBILE_SIGNATURE = re.compile(r"(Sent from my \w+|Sent from (Mail|Outlook) for \w+"
                               r"|Get Outlook for \w+)", re.IGNORECASE)


def reply_text(text: str) -> str:
    """Only what the reviewer wrote: quoted history, reply headers and signatures removed."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").replace("\xa0", " ").split("\n")
    lines = lines[:_history_start(lines)]
    # The parser splits what is left into fragments and flags quotes and signatures well;
    # its own header rule is not used: it takes a reply line like "To: finance" for the start
    # of a quoted message, and the history was cut off above already.
    fragments = EmailReplyParser.read("\n".join(lines)).fragments
    kept = "\n".join(f.content for f in fragments if not (f.quoted or f.signature))
    lines = kept.split("\n")
    lines = lines[:_signature_start(lines)]
    while lines and (not lines[-1].strip() or _RULE.fullmatch(lines[-1].strip())):
        lines.pop()
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _history_start(lines: list[str]) -> int:
    """Index of the first line of the quoted history (len(lines) when there is none)."""
    for i, line in enumerate(lines):
        stripped = line.strip()
        if _ORIGINAL_MESSAGE.fullmatch(stripped):
            return i
        if _OUTLOOK_FROM.match(stripped) and any(
                _OUTLOOK_SENT.match(nxt.strip()) for nxt in lines[i + 1:i + 5]):
            return i
        # A quote header is a short line; on a long one the pattern's backtracking would
        # take time in the square of its length.
        if len(stripped) <= MAX_HEADER_LINE and _QUOTE_HEADER.match(stripped):
            # Gmail wraps a long header over two lines, sometimes three.
            for end in range(i + 1, min(i + 3, len(lines)) + 1):
                joined = " ".join(part.strip() for part in lines[i:end])
                if _QUOTE_HEADER.fullmatch(joined):
                    return i
    return len(lines)


def _signature_start(lines: list[str]) -> int:
    for i, line in enumerate(lines):
        if line.strip() == "--" or _MOBILE_SIGNATURE.match(line.strip()):
            return i
    return len(lines)


# --- read_answer --------------------------------------------------------------------------

# Not "ok": "OK, let me check with finance first" is no approval.
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
    kind = _kind(interrupt)
    schema = _main_schema(interrupt.response_schema)
    if kind == "confirmation":
        entry = _read_confirmation(interrupt, text)
    elif kind == "enum":
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


def _kind(interrupt: Interrupt) -> str:
    # The page's own rule, so that the mail, its links and the page all agree.
    if is_confirmation(interrupt):
        return "confirmation"
    schema = _main_schema(interrupt.response_schema)
    if schema is None:
        return "text"
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "enum"
    kind = schema.get("type")
    if kind in ("string", "integer", "number", "boolean"):
        return kind
    return "json"


def _has_approved(schema: dict[str, Any] | None) -> bool:
    prop = _property(schema, "approved")
    return prop is not None and (_main_schema(prop, schema) or {}).get("type") == "boolean"


def _property(schema: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    main = _main_schema(schema)
    props = (main or {}).get("properties")
    prop = props.get(name) if isinstance(props, dict) else None
    return prop if isinstance(prop, dict) else None


def _main_schema(schema: Any, root: Any = None, depth: int = 0) -> dict[str, Any] | None:
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
        return _main_schema(target, root, depth + 1) if target is not None else schema
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list) and "type" not in schema and "enum" not in schema:
        real = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
        if len(real) == 1:
            return _main_schema(real[0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        real_kinds = [k for k in kind if k != "null"]
        if len(real_kinds) == 1:
            return {**schema, "type": real_kinds[0]}
    return schema


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
    if _has_approved(schema):
        payload: dict[str, Any] = {"approved": approved}
        if reason is not None and _property(schema, "note") is not None:
            payload["note"] = reason
        return _resolved(interrupt, payload)
    if not approved:
        return ResumeEntry(interrupt_id=interrupt.id, status="cancelled",
                           metadata={"reason": reason} if reason else None)
    # A plain yes/no schema on a confirmation wants the yes itself; otherwise there is no
    # payload to give, and check_answer decides whether the schema allows none.
    main = _main_schema(schema)
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


def _read_json(interrupt: Interrupt, schema: dict[str, Any] | None, text: str) -> Any:
    # Mail clients turn straight quotes into curly ones as the reviewer types.
    text = text.translate(str.maketrans({"“": '"', "”": '"', "‘": "'", "’": "'"}))
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        whole_error = exc
    except RecursionError:
        raise _unreadable(interrupt, "your reply's JSON is nested too deeply.") from None
    kind = (schema or {}).get("type")
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


# --- how_to_answer ------------------------------------------------------------------------

def how_to_answer(interrupt: Interrupt) -> str:
    """Plain-text instructions for answering `interrupt` by reply."""
    kind = _kind(interrupt)
    schema = _main_schema(interrupt.response_schema)
    if kind == "confirmation":
        keeps_reason = (not _has_approved(interrupt.response_schema)
                        or _property(interrupt.response_schema, "note") is not None)
        tail = "; anything after it is kept as your reason." if keeps_reason else "."
        return f'Reply with "approve" or "decline" on the first line{tail}'
    if kind == "enum":
        listed = "\n".join(f"  {i}. {c}" for i, c in enumerate(schema["enum"], 1))
        return ("Reply with one of these choices on the first line (its number is enough):\n"
                f"{listed}")
    if kind in ("integer", "number"):
        what = "a whole number" if kind == "integer" else "a number"
        return f"Reply with {what}{_bounds(schema)} on the first line."
    if kind == "boolean":
        return 'Reply with "yes" or "no" on the first line.'
    if kind != "json":
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
    main = _main_schema(prop, root) or {}
    optional = main is not prop and _allows_null(prop)
    if isinstance(main.get("enum"), list):
        label = "one of " + ", ".join(json.dumps(c, ensure_ascii=False) for c in main["enum"])
    elif main.get("type") == "array":
        label = f"list of {_type_label(main.get('items') or {}, root)}"
    elif isinstance(main.get("type"), str):
        label = main["type"]
    else:
        label = "any value"
    return f"{label} or null" if optional else label


def _allows_null(prop: Any) -> bool:
    if not isinstance(prop, dict):
        return False
    options = prop.get("anyOf") or prop.get("oneOf") or []
    kinds = prop.get("type")
    return (any(isinstance(o, dict) and o.get("type") == "null" for o in options)
            or (isinstance(kinds, list) and "null" in kinds))


def _example(prop: Any, root: Any, depth: int = 0) -> Any:
    """A value of the schema's shape to show the reviewer, from its types."""
    main = _main_schema(prop, root) or {}
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
        props = main.get("properties") if isinstance(main.get("properties"), dict) else {}
        return {name: _example(sub, root, depth + 1) for name, sub in props.items()}
    if kind == "array":
        return [_example(main.get("items") or {}, root, depth + 1)]
    if kind in ("integer", "number"):
        return main.get("minimum", 0)
    return {"string": "text", "boolean": True, "null": None}.get(kind, "…")
