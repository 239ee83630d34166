"""Reviewers' reply mails as mail: the raw message checked for its size and shape before
anything parses it (`check_shape`), read into a `Mail` (`parse_mail`), the
token among its recipients (`token_from_address`, the reply goes to `reply+<token>@…`), and
the words the reviewer wrote, without the quoted notification or a signature
(`reply_text`). What those words answer is `layby.answering.reading`'s. Pure: no network, no
Redis.
"""

from __future__ import annotations

import email
import email.policy
import re
from dataclasses import dataclass
from email.message import Message
from email.utils import collapse_rfc2231_value, getaddresses
from html.parser import HTMLParser

from email_reply_parser import EmailReplyParser

from layby.errors import Invalid, TooLarge


class MalformedMail(Invalid):
    """The raw message cannot be read as an email: not MIME, no sender, no text to read."""


class MailTooLarge(TooLarge):
    """The raw message is past a limit of size or shape: refused before it is parsed."""


@dataclass(frozen=True)
class Mail:
    sender: str  # bare address, lowercased
    recipients: list[str]  # To, Cc, Delivered-To, X-Original-To: bare, lowercased, deduped
    subject: str
    message_id: str | None  # as written, angle brackets included (what In-Reply-To wants)
    text: str  # the body as plain text
    automatic: bool = False  # sent by a robot (out of office, vacation): never an answer


# --- check_shape --------------------------------------------------------------------------

# A reply is a few lines of text, perhaps an attachment or two and a quoted notification:
# these are far past any real one, and keep a hostile mail from costing seconds of parsing
# (Python's parser spends its time per part and per line). The SMTP listener also holds
# lines to RFC 5321's 1,000 octets; mail POSTed by a provider may be laxer.
MAX_PARTS = 250
MAX_DEPTH = 10
MAX_HEADERS = 500
MAX_LINES = 500_000
MAX_LINE_BYTES = 64 * 1024
# Only the start of a reply's text can hold the answer; the rest is quote and signature.
MAX_TEXT_CHARS = 200_000

_BOUNDARY = re.compile(rb'boundary\s*=\s*(?:"([^"\r\n]{1,200})"|([^\s;"]{1,200}))',
                       re.IGNORECASE)


def check_shape(raw: bytes, max_bytes: int) -> None:
    """Refuse, with `MailTooLarge` naming the limit, a message past `max_bytes` or past the
    limits on lines, header fields, MIME parts and their nesting. Counts and searches done
    in C, each bounded before the next: a hostile mail of 100,000 parts costs a couple of
    milliseconds, on a gateway that shares its process with every other request."""
    if len(raw) > max_bytes:
        raise MailTooLarge(f"the message is {len(raw)} bytes; the limit is {max_bytes} "
                           "(LAYBY_MAX_MAIL_BYTES)")
    if raw.count(b"\n") > MAX_LINES:
        raise MailTooLarge(f"the message has more than {MAX_LINES} lines")
    # Every part starts on a line opening with "--": more of those than a few per part
    # allowed is refused before anything looks at them one by one.
    if raw.count(b"\n--") > _MAX_DASH_LINES:
        raise MailTooLarge(f"the message has more than {_MAX_DASH_LINES} lines opening with "
                           f"'--' (MIME part boundaries); at most {MAX_PARTS} parts are read")
    _check_lines(raw)
    _check_header(raw)
    _check_parts(raw, _boundaries(raw))


_MAX_DASH_LINES = 4 * MAX_PARTS
_LINE_STEP = 1024


def _check_lines(raw: bytes) -> None:
    # A line of MAX_LINE_BYTES + _LINE_STEP or more covers a stretch starting at one of
    # these offsets that holds no newline: a search per KiB, not a split per line.
    for start in range(0, len(raw) - MAX_LINE_BYTES, _LINE_STEP):
        if raw.find(b"\n", start, start + MAX_LINE_BYTES) < 0:
            raise MailTooLarge(f"the message has a line longer than {MAX_LINE_BYTES} bytes")


def _check_header(raw: bytes) -> None:
    ends = [at for at in (raw.find(b"\n\n"), raw.find(b"\n\r\n")) if at >= 0]
    head = raw[:min(ends)] if ends else raw
    # Lines that start a field, not those that fold one onto the next.
    fields = 1 + head.count(b"\n") - head.count(b"\n ") - head.count(b"\n\t")
    if fields > MAX_HEADERS:
        raise MailTooLarge(f"the message has more than {MAX_HEADERS} header fields")


def _boundaries(raw: bytes) -> set[bytes]:
    lowered = raw.lower()  # the same offsets; the values are read from `raw` as written
    if lowered.count(b"boundary") > MAX_PARTS:
        raise MailTooLarge(f"the message has more than {MAX_PARTS} MIME parts")
    found, at = set(), lowered.find(b"boundary")
    while at >= 0:
        declared = _BOUNDARY.match(raw, at)
        if declared:
            found.add(declared.group(1) or declared.group(2))
        at = lowered.find(b"boundary", at + 1)
    return found


def _check_parts(raw: bytes, boundaries: set[bytes]) -> None:
    parts = 0
    open_: list[bytes] = []  # the multipart containers around where the scan is
    at = raw.find(b"\n--")
    while at >= 0:
        end = raw.find(b"\n", at + 1)
        text = raw[at + 3:end if end >= 0 else len(raw)].rstrip()
        at = end if end < 0 else raw.find(b"\n--", end)
        closing = text.endswith(b"--") and text[:-2] in boundaries
        boundary = text[:-2] if closing else text
        if boundary not in boundaries:
            continue
        if boundary in open_:  # a delimiter of an outer container ends the inner ones
            del open_[open_.index(boundary) + 1:]
        else:
            open_.append(boundary)
            if len(open_) > MAX_DEPTH:
                raise MailTooLarge(f"the message nests MIME parts more than {MAX_DEPTH} "
                                   "deep")
        if closing:
            open_.pop()
        else:
            parts += 1
            if parts > MAX_PARTS:
                raise MailTooLarge(f"the message has more than {MAX_PARTS} MIME parts")


# --- parse_mail ---------------------------------------------------------------------------

_RECIPIENT_HEADERS = ("To", "Cc", "Delivered-To", "X-Original-To")


def parse_mail(raw: bytes, *, headers_only: bool = False) -> Mail:
    """Read a raw RFC 5322 message (one `check_shape` let through). Raises `MalformedMail`
    saying what is missing. With `headers_only`, only its header, as far as it can be read
    (the recipients, the sender if any, whether a robot sent it), for the cost of the
    header alone and refusing nothing: enough to find the token first."""
    if headers_only:
        raw = _header_block(raw)
    elif not raw or not raw.strip():
        raise MalformedMail("the message is empty")
    try:
        msg = email.message_from_bytes(raw, policy=email.policy.default)
    except Exception as exc:  # the parser is lenient; anything it raises means unreadable
        raise MalformedMail(f"the message cannot be parsed as MIME: {exc}") from exc
    senders = _addresses(msg, "From")
    recipients: list[str] = []
    for name in _RECIPIENT_HEADERS:
        for address in _addresses(msg, name):
            if address not in recipients:
                recipients.append(address)
    if headers_only:  # what is missing is the full parse's to refuse, once a token let it
        return Mail(sender=senders[0] if senders else "", recipients=recipients,
                    subject=_header(msg, "Subject"), message_id=None, text="",
                    automatic=_is_automatic(msg))
    if not msg.keys():
        raise MalformedMail("this is not an email message: it has no headers")
    if not senders:
        if msg.get("From") is None:
            raise MalformedMail("the message has no From: header, so its sender is unknown")
        raise MalformedMail("the message's From: header holds no email address")
    return Mail(sender=senders[0], recipients=recipients, subject=_header(msg, "Subject"),
                message_id=_header(msg, "Message-ID") or None, text=_body_text(msg),
                automatic=_is_automatic(msg))


def _header_block(raw: bytes) -> bytes:
    """The message up to the blank line that ends its header."""
    ends = [at for at in (raw.find(b"\n\n"), raw.find(b"\n\r\n")) if at >= 0]
    return raw[:min(ends) + 1] + b"\n" if ends else raw + b"\n"


def _is_automatic(msg: Message) -> bool:
    """RFC 3834's Auto-Submitted, and what common auto-responders send instead."""
    submitted = _header(msg, "Auto-Submitted").lower()
    precedence = _header(msg, "Precedence").lower()
    return bool((submitted and submitted != "no") or precedence in ("auto_reply", "bulk", "junk")
                or msg.get("X-Autoreply") or msg.get("X-Autorespond"))


def _header(msg: Message, name: str) -> str:
    try:
        value = msg.get(name)
    except Exception:  # noqa: BLE001  (a damaged header should not sink the whole reply)
        return ""
    return " ".join(str(value).split()) if value is not None else ""


def _addresses(msg: Message, name: str) -> list[str]:
    """Bare, lowercased addresses of every `name` header; only those with an '@'."""
    found: list[str] = []
    try:
        values = msg.get_all(name) or []
    except Exception:  # noqa: BLE001  (as above: damaged headers)
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
        if _param(plain, "format").lower() == "flowed":
            text = _unflow(text, delsp=_param(plain, "delsp").lower() == "yes")
    elif html is not None:
        text = html_to_text(_decoded(html))
    else:
        kind = msg.get_content_type()
        raise MalformedMail(f"the message ({kind}) has no text/plain or text/html part to "
                            "read an answer from")
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\xa0", " ")


def _param(part: Message, name: str) -> str:
    """A Content-Type parameter's value ('' when absent); one in RFC 2231's encoded form
    (`format*=…`) comes as a tuple, decoded here."""
    value = part.get_param(name, "")
    return value if isinstance(value, str) else collapse_rfc2231_value(value)


def _decoded(part: Message) -> str:
    """The part's text: transfer encoding undone, then its charset (or the likely ones)."""
    payload = part.get_payload(decode=True)
    if isinstance(payload, str):
        return payload[:MAX_TEXT_CHARS]
    raw = payload if isinstance(payload, bytes) else b""  # not multipart: bytes or None
    for charset in (part.get_content_charset(), "utf-8"):
        if charset:
            try:
                return raw.decode(charset)[:MAX_TEXT_CHARS]
            except (LookupError, UnicodeDecodeError):
                continue
    # Mislabelled mail is common; Windows-1252 decodes almost any byte and reads best.
    return raw.decode("cp1252", errors="replace")[:MAX_TEXT_CHARS]


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
