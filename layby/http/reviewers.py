"""The reviewer side of the gateway: the signed answer page (`/review/{token}`), webhook
callbacks (`/callbacks/answers`), the inbound-mail webhook (`/inbound/email`) and Slack's
interactions (`/slack/interactions`).

None of these take API keys: a reviewer proves who they are with a token (a link, a reply
address), a Standard Webhooks signature made with their secret, or, for the inbound-mail
webhook, the reply token inside the mail (and the provider's shared secret when one is
configured); Slack signs its requests with the app's signing secret. Routes only: the work
is `layby.inbox`'s, and every answer goes through `layby.control`, recorded with who, how
and when.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from layby.answering import answers, callbacks
from layby.answering import replies as inbox
from layby.answering import slack_interactions as interactions
from layby.answering.forms import DECISIONS, entry_from_form, form_for
from layby.answering.pages import render_review
from layby.control import Runtime, timeline
from layby.control.commands import now_iso
from layby.errors import (
    ConfigError,
    Invalid,
    LaybyError,
    NotFound,
    Unauthorized,
    Unavailable,
)
from layby.http.deps import Rt
from layby.http.errors import ERROR_SCHEMA, documented, status_of
from layby.reviewers.tokens import BadToken, ExpiredToken
from layby.wire import CallbackTaken, InterruptState, MailIgnored, MailTaken

log = logging.getLogger(__name__)

router = APIRouter(include_in_schema=True, tags=["reviewers"],
                   responses=documented(422, 503))

# What the document says of these routes, which read their bodies themselves (a signature
# covers the exact bytes; a mail is MIME, not JSON).
Token = Annotated[str, Path(max_length=200)]
_PAGE: dict[str, Any] = {"description": "the answer page, saying why when it takes no answer",
         "content": {"text/html": {"schema": {"type": "string"}}}}
# A path no route takes (a link cut or mangled past reading) gets the API's JSON 404, a
# parameter out of its bounds the API's JSON 422.
_PAGE_OR_JSON = {**_PAGE, "content": {**_PAGE["content"],
                                      "application/json": {"schema": ERROR_SCHEMA}}}
_FORM_BODY = {"required": True, "content": {"application/x-www-form-urlencoded": {"schema": {
    "type": "object", "additionalProperties": {"type": "string"},
    "properties": {"decision": {"type": "string", "enum": ["approve", "decline"]}},
    "description": "the page's form: its fields follow what the interrupt asks for"}}}}
_MAIL_FORM = {"type": "object", "additionalProperties": {"type": "string"}, "properties": {
    "email": {"type": "string", "minLength": 1,
              "description": "the raw MIME message (SendGrid)"},
    "body-mime": {"type": "string", "minLength": 1,
                  "description": "the raw MIME message (Mailgun)"},
    "envelope": {"type": "string", "description": "JSON with the recipients in `to`"},
    "recipient": {"type": "string", "description": "comma-separated recipients"}},
    "anyOf": [{"required": ["email"]}, {"required": ["body-mime"]}]}
_MAIL_BODY = {"required": True, "content": {
    "message/rfc822": {"schema": {"type": "string", "format": "binary"}},
    "multipart/form-data": {"schema": _MAIL_FORM},
    "application/x-www-form-urlencoded": {"schema": _MAIL_FORM}}}



# -- the answer page --------------------------------------------------------------------


def _page(html: str, status: int = 200) -> HTMLResponse:
    # The token is in the URL: keep it out of caches and of other sites' Referer headers.
    return HTMLResponse(html, status_code=status, headers={
        "Cache-Control": "no-store", "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY", "Content-Security-Policy":
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
            "frame-ancestors 'none'"})


def _refused(reason: str, status: int) -> HTMLResponse:
    return _page(render_review(agent="", interrupt=None, reviewer_label=None, state="refused",
                               form=None, message=reason), status)


def _expired(rt: Runtime, exc: ExpiredToken, status: int) -> HTMLResponse:
    """An expired link still says where its request stands: expired, or answered before."""
    opened = answers.open_expired(rt, exc.grant)
    if opened is None:
        return _refused(exc.message, status_of(exc))
    if opened.is_open and _closed_state(opened) is None:
        # The link outlived LAYBY_TOKEN_TTL_S; the request itself still waits.
        return _refused("this link has expired, though the request is still open: ask the "
                        "run's owner to answer it or to send the request again", 403)
    return _show(opened, _closed_state(opened) or "expired", status)


def _closed_state(opened: answers.Opened) -> str | None:
    """Why the page shows no form, or None when it should."""
    intr = opened.interrupt
    if intr.state is InterruptState.OPEN:
        if intr.expires_at and intr.expires_at < now_iso():
            return "expired"  # past its time; the sweeper applies the policy any moment
        if any(a.answered_by == f"reviewer:{opened.reviewer.id}" for a in intr.approvals):
            return "approved"  # theirs counted; the request waits for other reviewers
        return None
    if intr.state is InterruptState.EXPIRED:
        return "expired"
    return "answered" if intr.answer is not None else "cancelled"


def _show(opened: answers.Opened, state: str, status: int = 200, rt: Runtime | None = None,
          **extra: Any) -> HTMLResponse:
    form = form_for(opened.interrupt, extra.pop("decision", None)) if state == "open" else None
    handover_to = (answers.handover_choices(rt, opened.interrupt)
                   if rt is not None and state == "open" else None)
    # What the run did so far, for the reviewer deciding (the run's own events).
    steps = timeline.of_run(rt.store, opened.run.id, timeline.PAGE_EVENTS) \
        if rt is not None else None
    return _page(render_review(agent=opened.run.agent, interrupt=opened.interrupt,
                               reviewer_label=opened.reviewer.label, state=state, form=form,
                               handover_to=handover_to, timeline=steps, **extra), status)


# `:path` so that a mangled link (cut short after "/review/", or with a "/" in it) still gets
# the page saying the link is bad, not the API's JSON 404.
def _open(rt: Runtime, token: str, status: int) -> answers.Opened | HTMLResponse:
    """What the link opens, or the page saying why it opens nothing (`status` for a link
    to a closed request)."""
    try:
        opened = answers.open_token(rt, token)
    except ExpiredToken as exc:
        return _expired(rt, exc, status)
    except (BadToken, NotFound) as exc:
        return _refused(exc.message, status_of(exc))
    state = _closed_state(opened)
    return _show(opened, state, status) if state else opened


@router.get("/review/{token:path}", response_class=HTMLResponse,
            responses={403: _PAGE, 404: _PAGE_OR_JSON}, openapi_extra={"security": []})
def review_page(token: Token, rt: Rt,
                decision: Annotated[str | None, Query(max_length=20)] = None) -> HTMLResponse:
    """The request and its form. Never records anything: mail scanners open links."""
    opened = _open(rt, token, 200)
    if isinstance(opened, HTMLResponse):
        return opened
    return _show(opened, "open", rt=rt, decision=decision if decision in DECISIONS else None)


@router.post("/review/{token:path}", response_class=HTMLResponse,
             responses={403: _PAGE, 404: _PAGE_OR_JSON, 409: _PAGE, 422: _PAGE_OR_JSON,
                        **documented(413)},
             openapi_extra={"security": [], "requestBody": _FORM_BODY})
async def review_answer(token: Token, request: Request, rt: Rt) -> HTMLResponse:
    form = await request.form()  # the body is held to its limit (`layby.http.limits`)
    values = {k: v for k, v in form.items() if isinstance(v, str)}
    return await run_in_threadpool(_answer_page, rt, token, values)


def _answer_page(rt: Runtime, token: str, values: dict[str, str]) -> HTMLResponse:
    opened = _open(rt, token, 409)
    if isinstance(opened, HTMLResponse):
        return opened
    handing_on = values.get("action") == "delegate"
    try:
        if handing_on:
            to = values.get("delegate_to", "").strip()
            answers.delegate(rt, opened, to, channel="page",
                             note=values.get("delegate_note", "").strip() or None)
            target = rt.reviewers.get(to)
            return _show(answers.reopen(rt, opened), "handed",
                         message=target.label if target else to)
        entry = entry_from_form(opened.interrupt, values)
        answers.answer(rt, opened, entry, channel="page")
    except Invalid as exc:
        errors = (exc.detail or {}).get("errors") if isinstance(exc.detail, dict) else None
        return _show(opened, "open", 422, rt=rt, errors=errors or [
            {"path": "delegate_to" if handing_on else "", "message": exc.message}],
            values=None if handing_on else values)
    except LaybyError as exc:  # refused as it was recorded: a rival answered first, …
        fresh = answers.reopen(rt, opened)
        return _show(fresh, _closed_state(fresh) or "open", status_of(exc), rt=rt,
                     message=exc.message)
    fresh = answers.reopen(rt, opened)
    # An approval that is not the last one needed leaves the request open.
    return _show(fresh, "approved" if fresh.is_open else "done")


@router.post("/callbacks/answers", response_model=CallbackTaken,
             responses=documented(400, 401, 403, 404, 409, 413, 422),
             openapi_extra={"security": [{"webhookSignature": []}, {}], "requestBody": {
                 "required": True, "content": {"application/json": {
                     "schema": callbacks.Callback.model_json_schema(by_alias=True)}}}})
async def callback(request: Request, rt: Rt) -> JSONResponse:
    """A reviewer's system answers: signed per Standard Webhooks with the reviewer's secret
    (and `reviewer` naming them), or carrying the notification's `token`."""
    raw = await request.body()
    try:
        body = callbacks.Callback.model_validate_json(raw)
    except ValidationError as exc:
        raise Invalid("the callback body is not a valid answer", detail=[
            {"path": "/" + "/".join(str(p) for p in e["loc"]), "message": e["msg"]}
            for e in exc.errors(include_url=False)]) from None
    headers = {k.lower(): v for k, v in request.headers.items()}
    return JSONResponse(await run_in_threadpool(callbacks.receive, rt, body, raw, headers))


_SLACK_BODY = {"required": True, "content": {"application/x-www-form-urlencoded": {
    "schema": {"type": "object", "required": ["payload"],
               "properties": {"payload": {"type": "string",
                                          "description": "the interaction, as JSON"}}}}}}
_SLACK_REPLY = {"description": "taken: an empty body, or for a modal's submission what the "
                "modal shows (`response_action`)",
                "content": {"application/json": {"schema": {"type": "object"}}}}


@router.post("/slack/interactions", responses={200: _SLACK_REPLY,
                                              **documented(400, 401, 404, 409, 413)},
             openapi_extra={"security": [{"slackSignature": []}],
                            "requestBody": _SLACK_BODY})
async def slack_interactions(request: Request, rt: Rt,
                             background: BackgroundTasks) -> JSONResponse:
    """Slack's interactivity requests: a click on a request's Approve, Decline or Answer…
    button, or the answer modal submitted. Signed by Slack (`X-Slack-Signature`,
    `X-Slack-Request-Timestamp`); 404 when Slack is not configured."""
    raw = await request.body()
    headers = {k.lower(): v for k, v in request.headers.items()}
    reply = await run_in_threadpool(interactions.receive, rt, raw, headers)
    for later in reply.later:  # after Slack has its reply: it waits 3 seconds at most
        background.add_task(later)
    # A click's reply is not read; a modal's says what the modal does next.
    return JSONResponse(reply.body or {}, background=background)


@router.post("/inbound/email", response_model=MailTaken | MailIgnored,
             responses=documented(400, 401, 403, 404, 409, 413, 422),
             openapi_extra={"security": [{"HTTPBearer": []}, {"inboundBasic": []}, {}],
                            "requestBody": _MAIL_BODY})
async def inbound_email(request: Request, rt: Rt) -> JSONResponse:
    """Replies POSTed by a mail provider: raw MIME (`message/rfc822`, recipients in `?to=`),
    or a form with the raw mail in `email` (SendGrid) or `body-mime` (Mailgun) and the
    recipients in `envelope` or `recipient`."""
    _check_provider(rt, request)
    recipients = list(request.query_params.getlist("to"))
    # A forged or stale token in `?to=` is refused before a byte of the body is read:
    # the server drops the rest of it unread.
    await run_in_threadpool(inbox.check_envelope, rt, recipients)
    raw = await request.body()
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = await request.form(max_part_size=rt.settings.max_mail_bytes, max_files=10,
                                  max_fields=100)
        mime = form.get("email") or form.get("body-mime")
        if not isinstance(mime, str) or not mime:
            raise Invalid("the form holds no raw mail: send it in `email` (SendGrid, "
                          "\"POST the raw, full MIME message\") or `body-mime` (Mailgun)")
        raw = mime.encode()
        recipients += _form_recipients(form.get("envelope"), form.get("recipient"))
    try:
        got = await run_in_threadpool(inbox.receive, rt, raw, recipients)
    except inbox.AutomaticReply as exc:
        return JSONResponse({"ignored": True, "reason": exc.message})
    except ConfigError as exc:
        log.error("inbound reply not taken now: %s", exc.message)
        # layby's own configuration is broken (maybe for a moment, while an operator edits
        # the reviewer directory): 503, so the provider delivers the reply again later.
        raise Unavailable("layby cannot take replies right now (a configuration problem on "
                          "its side); try again later") from exc
    return JSONResponse(MailTaken(run_id=got.run_id, interrupt_id=got.interrupt_id,
                                  reviewer=got.reviewer, resumed=got.resumed,
                                  delegated_to=got.delegated_to).wire())


def _check_provider(rt: Runtime, request: Request) -> None:
    secret = rt.settings.inbound_mail_secret
    if secret is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() == "basic":
        try:
            value = base64.b64decode(value).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            value = ""
    elif scheme.lower() != "bearer":
        value = ""
    if not hmac.compare_digest(value.encode(), secret.get_secret_value().encode()):
        raise Unauthorized("the inbound-mail webhook needs LAYBY_INBOUND_MAIL_SECRET as a "
                           "bearer token or as the basic-auth password")


def _form_recipients(envelope: Any, recipient: Any) -> list[str]:
    """The recipients a provider's form names. An `envelope` that is not JSON like
    {"to": [...]} names none: the mail's own headers may still hold the reply address."""
    found: list[str] = []
    if isinstance(envelope, str) and envelope:
        try:
            to = json.loads(envelope).get("to") or []
            found += [to] if isinstance(to, str) else [str(t) for t in to]
        except (ValueError, AttributeError, TypeError):
            pass
    if isinstance(recipient, str) and recipient:
        found += [r.strip() for r in recipient.split(",")]
    return found
