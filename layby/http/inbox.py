"""The reviewers' inbox over HTTP: `/inbox` and its pages.

A reviewer signs in with a link mailed to their directory address (`/inbox/sign-in`), or is
named by a trusted sign-in proxy's header (`LAYBY_INBOX_TRUSTED_HEADER`). The session is a
signed cookie (`HttpOnly`, `SameSite=Strict`, `Secure` behind TLS); every form carries the
session's CSRF token, and a POST without it records nothing. Answers go through the same
`layby.answering.answers` as the answer page, recorded with `channel: "inbox"`: the allow-list,
the quorum and exactly-once hold as on every channel.

Routes only: sessions are `layby.inbox.signin`'s, the lists `layby.inbox.waiting`'s, the
HTML `layby.inbox.pages`'.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar
from urllib.parse import urlencode, urlsplit

import anyio
from fastapi import APIRouter, BackgroundTasks, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from layby.answering import answers
from layby.answering.forms import entry_from_form, input_from_form
from layby.answering.pages import outcome
from layby.control import Runtime, commands, timeline
from layby.errors import ConfigError, Invalid, LaybyError
from layby.http.deps import Rt
from layby.http.errors import status_of
from layby.http.events import STREAM_HEADERS, EventStreamResponse
from layby.inbox import revocation, signin, waiting
from layby.inbox.pages import SCRIPT as _SCRIPT
from layby.inbox.pages import (
    Notice,
    Signed,
    render_bulk_confirm,
    render_bulk_done,
    render_history,
    render_inbox,
    render_sign_in,
    render_timeline,
)
from layby.notifier import mail
from layby.reviewers import routing
from layby.reviewers.directory import Reviewer
from layby.wire import Status

log = logging.getLogger(__name__)
_T = TypeVar("_T")

router = APIRouter(include_in_schema=False)

COOKIE = "layby_inbox"
# What an answer did, shown once by the page its post/redirect/get lands on.
FLASH = "layby_inbox_flash"
MAX_PICKS = 100  # requests approved at once
POLL_S = 2.0  # how often a live inbox looks for new requests
_FULL_EVERY = 15  # polls between full reads of the list when no run moved
_PING_EVERY = 8  # polls between keep-alives
Link = Annotated[str, Path(max_length=600)]
Filter = Annotated[str | None, Query(max_length=200)]
# Sign-in links mailed to one reviewer: at most this many per this long, so nobody can make
# layby flood a reviewer's mailbox.
_MAILS, _MAILS_PER_S = 5, 600
# Sign-in links asked for from one client (its address) in _MAILS_PER_S.
_ASKS = 20


# The inbox's share of the gateway's worker threads: a slow store or a long look through
# the waiting runs holds these, never every thread the API's routes need.
_LIMITER = anyio.CapacityLimiter(8)


async def _in_thread(fn: Callable[..., _T], *args: Any) -> _T:
    return await anyio.to_thread.run_sync(functools.partial(fn, *args), limiter=_LIMITER)


@dataclass(frozen=True)
class Who:
    reviewer: Reviewer
    session_id: str  # the CSRF token is made from it
    by_header: bool
    expires: float | None = None  # the session's end (epoch seconds); None for a proxy's


class _Refused(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


def _page(html: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(html, status_code=status, headers=_HEADERS)


_HEADERS = {
    # Sign-in links are in URLs: keep them out of caches and other sites' Referer headers
    # (same-origin, not no-referrer: with no-referrer a browser posts `Origin: null`).
    "Cache-Control": "no-store", "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "script-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'", "X-Content-Type-Options": "nosniff"}


def _keys(rt: Runtime) -> dict[str, bytes]:
    return rt.reviewers.token_keys()


def _signed(rt: Runtime, who: Who) -> Signed:
    return Signed(who.reviewer.label, signin.csrf_token(_keys(rt), who.session_id),
                  can_sign_out=not who.by_header)


def _who(rt: Runtime, request: Request) -> Who | None:
    """The reviewer this request is from, or None when nobody is signed in."""
    header = rt.settings.inbox_trusted_header
    named = request.headers.getlist(header) if header else []
    directory = rt.reviewers.directory()
    if named:
        value = named[0].strip()
        if len(named) > 1 or not value or any(c in value for c in ", \t"):
            # A proxy that appends to what the client sent, instead of replacing it.
            raise _Refused(_page(render_sign_in(
                "denied", message=f"the {header} header came more than once or holds more "
                "than one name: the sign-in proxy must set it, replacing any the browser "
                "sent"), 400))
        value = value.removeprefix("accounts.google.com:")  # how Google's IAP writes it
        reviewer = (directory.by_email(value) if "@" in value
                    else directory.reviewers.get(value))
        if reviewer is None:
            raise _Refused(_page(render_sign_in(
                "denied", message=f"your sign-in proxy names you as {value!r}, who is not "
                "in layby's reviewer directory: ask whoever runs layby to add you"), 403))
        return Who(reviewer, f"header:{reviewer.id}", by_header=True)
    cookie = request.cookies.get(COOKIE)
    if not cookie:
        return None
    try:
        session = signin.read(_keys(rt), "session", cookie)
    except signin.BadSignIn:
        return None
    if revocation.session_over(rt, f"inbox-out:{session.nonce}", session.reviewer,
                               session.issued_ms):
        return None  # signed out, or its reviewer's sessions ended (`layby inbox revoke`)
    reviewer = directory.reviewers.get(session.reviewer)
    return Who(reviewer, session.nonce, False, session.expires) if reviewer else None


async def _signed_in(rt: Runtime, request: Request, form: dict[str, str] | None = None) -> Who:
    """The reviewer a POST is from, its CSRF token checked; refuses (as a page) otherwise."""
    who = await _in_thread(_who, rt, request)
    if who is None:
        raise _Refused(_page(render_sign_in(
            "denied", message="you are not signed in (or your session ended): sign in "
            "again; nothing was recorded"), 401))
    if form is not None and not signin.csrf_ok(_keys(rt), who.session_id,
                                               form.get("_csrf", "")):
        raise _Refused(_page(render_sign_in(
            "denied", message="this form did not come from your inbox (its CSRF token is "
            "missing or wrong), so nothing was recorded: reload the inbox and try again"),
            403))
    return who


def _from_elsewhere(rt: Runtime, request: Request) -> bool:
    """Whether a browser posts this from another site's page. Browsers say where a POST
    comes from (`Origin`, `Sec-Fetch-Site`); a client that is no browser says nothing, and
    is no CSRF victim. Checked on every inbox POST, the sign-in ones too (a signed-in
    attacker's link posted from their page would sign the victim in as them)."""
    fetched = request.headers.get("sec-fetch-site")
    if fetched is not None:
        return fetched not in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is not None and origin != "null":
        public = urlsplit(rt.settings.public_url)
        own = {f"{request.url.scheme}://{request.url.netloc}",
               f"{public.scheme}://{public.netloc}"}
        return origin not in own
    return False


def _refuse_from_elsewhere(rt: Runtime, request: Request) -> None:
    if _from_elsewhere(rt, request):
        raise _Refused(_page(render_sign_in(
            "denied", message="this form was posted from another site's page, so nothing "
            "was recorded: use the inbox itself"), 403))


async def _picks(request: Request) -> tuple[dict[str, str], list[str]]:
    """A posted form's values, and the requests it ticked (`_pick`), each once. Its field
    count is held to what a selection needs before anything is parsed further; a form
    another site's page posts is refused before it is read."""
    _refuse_from_elsewhere(request.app.state.runtime, request)
    form = await request.form(max_fields=MAX_PICKS + 50, max_files=0)
    values = {k: v for k, v in form.items() if isinstance(v, str)}
    picks = [v for v in form.getlist("_pick") if isinstance(v, str)]
    return values, list(dict.fromkeys(picks))


async def _form(request: Request) -> dict[str, str]:
    return (await _picks(request))[0]


def _guarded(handler: Any) -> Any:
    """A refusal raised anywhere in `handler` becomes its page."""
    @functools.wraps(handler)
    async def run(*args: Any, **kwargs: Any) -> Response:
        try:
            response: Response = await handler(*args, **kwargs)
        except _Refused as refused:
            return refused.response
        except ConfigError as exc:
            log.error("the inbox cannot serve: %s", exc.message)
            return _page(render_sign_in("refused", message="the inbox is not available "
                                        "right now (a configuration problem on layby's "
                                        "side); try again later"), 503)
        return response
    return run


# -- signing in ---------------------------------------------------------------------------


@router.post("/inbox/sign-in")
@_guarded
async def ask_for_link(request: Request, rt: Rt, background: BackgroundTasks) -> Response:
    form = await _form(request)
    address = form.get("email", "").strip()[:254]
    if "@" not in address:
        return _page(render_sign_in("ask", message="enter your email address, as the "
                                    "reviewer directory has it"), 422)
    source = request.client.host if request.client else "?"
    to = hashlib.sha256(address.lower().encode()).hexdigest()[:24]  # no address in a key
    allowed = await _in_thread(_within_limits, rt, source, to)
    if not allowed:
        return _page(render_sign_in("ask", message="too many sign-in links were asked for "
                                    "from here, or for this address, lately: wait ten minutes "
                                    "and ask again"), 429)
    background.add_task(_mail_link, rt, address)
    # The same answer whether the address is known or not: the page tells nobody who the
    # reviewers are.
    return _page(render_sign_in("sent", message=f"If {address} is a reviewer's address, a "
                                "sign-in link is on its way to it."))


def _within_limits(rt: Runtime, source: str, to: str) -> bool:
    """Whether one more sign-in mail may be asked for, from `source` (a client's address)
    and for `to` (an address's hash, known reviewer or not): _ASKS from one client and
    _MAILS for one address in _MAILS_PER_S, however many reviewers those are."""
    for kind, who, most in (("from", source, _ASKS), ("to", to, _MAILS)):
        if rt.store.marks.tally(f"inbox-ask-{kind}:{who}", _MAILS_PER_S) > most:
            log.warning("inbox sign-in refused: more than %d sign-in links asked for %s in "
                        "%d s", most, f"from {who}" if kind == "from" else "one address",
                        _MAILS_PER_S)
            return False
    return True


def _mail_link(rt: Runtime, address: str) -> None:
    reviewer = rt.reviewers.directory().by_email(address)
    if reviewer is None or not reviewer.email:
        log.info("inbox sign-in asked for an address that is not a reviewer's")
        return
    slot = next((f"inbox-mail:{reviewer.id}:{n}" for n in range(_MAILS)
                 if rt.store.marks.first_sight(f"inbox-mail:{reviewer.id}:{n}", _MAILS_PER_S)),
                None)
    if slot is None:
        log.warning("inbox sign-in link for %s not sent: %d went out in the last %d s",
                    reviewer.id, _MAILS, _MAILS_PER_S)
        return
    settings = rt.settings
    link = signin.make(_keys(rt), "link", reviewer.id, settings.inbox_link_ttl_s)
    try:
        mail.send(settings, mail.sign_in_mail(settings, reviewer, link))
    except Exception as exc:  # noqa: BLE001  (the reviewer asks again; the reason is logged)
        rt.store.marks.forget_sight(slot)
        log.error("inbox sign-in link for %s not sent: %s", reviewer.id, exc)
        return
    log.info("inbox sign-in link sent to %s", reviewer.id)


def _link(rt: Runtime, link: str) -> signin.Signed:
    try:
        signed = signin.read(_keys(rt), "link", link)
    except signin.BadSignIn as exc:
        raise _Refused(_page(render_sign_in("refused", message=exc.message),
                             status_of(exc))) from None
    if revocation.is_revoked(rt, signed.reviewer, signed.issued_ms):
        raise _Refused(_page(render_sign_in(
            "refused", message="this sign-in link was made before your sessions were "
            "ended: ask for a new one"), 403))
    if rt.store.marks.has_seen(f"inbox-link:{signed.nonce}"):
        raise _Refused(_page(render_sign_in(
            "refused", message="this sign-in link was used already: each link signs in "
            "once; ask for a new one"), 403))
    if rt.reviewers.get(signed.reviewer) is None:
        raise _Refused(_page(render_sign_in(
            "refused", message="this link is for a reviewer no longer in the reviewer "
            "directory"), 403))
    return signed


@router.get("/inbox/sign-in/{link}")
@_guarded
async def sign_in_page(link: Link, rt: Rt) -> Response:
    """Says whose link it is and asks to sign in: opening it signs nobody in (mail scanners
    open links), pressing the button does."""
    signed = await _in_thread(_link, rt, link)
    reviewer = rt.reviewers.get(signed.reviewer)
    return _page(render_sign_in("confirm", signing_in_as=reviewer.label if reviewer
                                else signed.reviewer))


@router.post("/inbox/sign-in/{link}")
@_guarded
async def sign_in(link: Link, request: Request, rt: Rt) -> Response:
    _refuse_from_elsewhere(rt, request)

    def use() -> signin.Signed:
        signed = _link(rt, link)
        # Kept past the link's end, by the clock its end is checked with.
        left = max(1, int(signed.expires - time.time()) + 300)
        if not rt.store.marks.first_sight(f"inbox-link:{signed.nonce}", left):
            raise _Refused(_page(render_sign_in(
                "refused", message="this sign-in link was used already: each link signs "
                "in once; ask for a new one"), 403))
        return signed
    signed = await _in_thread(use)
    ttl = rt.settings.inbox_session_ttl_s
    session = signin.make(_keys(rt), "session", signed.reviewer, ttl)
    log.info("reviewer %s signed in to the inbox", signed.reviewer)
    response = RedirectResponse("/inbox", status_code=303, headers=_HEADERS)
    response.set_cookie(COOKIE, session, max_age=ttl, path="/inbox", httponly=True,
                        samesite="strict", secure=_secure(rt, request))
    return response


def _secure(rt: Runtime, request: Request) -> bool:
    return rt.settings.public_url.startswith("https:") or request.url.scheme == "https"


@router.post("/inbox/sign-out")
@_guarded
async def sign_out(request: Request, rt: Rt) -> Response:
    form = await _form(request)
    who = await _signed_in(rt, request, form)
    if not who.by_header and who.expires is not None:
        # Kept until the session's own end: a signed-out cookie stays refused.
        left = max(1, int(who.expires - time.time()) + 300)
        await _in_thread(rt.store.marks.first_sight, f"inbox-out:{who.session_id}", left)
    response = RedirectResponse("/inbox", status_code=303, headers=_HEADERS)
    response.delete_cookie(COOKIE, path="/inbox", httponly=True, samesite="strict",
                           secure=_secure(rt, request))
    return response


# -- the requests -------------------------------------------------------------------------


def _filters(agent: str | None, tool: str | None, reason: str | None) -> dict[str, str | None]:
    return {"agent": agent or None, "tool": tool or None, "reason": reason or None}


NO_FILTERS = _filters(None, None, None)


def _inbox(rt: Runtime, who: Who, filters: dict[str, str | None], *, status: int = 200,
           notice: Notice | None = None, errors: dict[str, list[dict[str, Any]]] | None = None,
           values: dict[str, dict[str, str]] | None = None, partial: bool = False
           ) -> HTMLResponse:
    # The live page's refresh follows a change its stream saw in the shared look.
    listing = waiting.waiting_for(rt, who.reviewer, agent=filters["agent"],
                                  tool=filters["tool"], reason=filters["reason"],
                                  max_age_s=waiting.FRESH_S if partial else 0.0)
    query = urlencode({"partial": 1, **{k: v for k, v in filters.items() if v}})
    editable = frozenset(w.ref for w in listing.items
                         if commands.reviewers_may_edit(rt, w.run.agent, w.interrupt))
    return _page(render_inbox(_signed(rt, who), listing, filters=filters,
                              handover_to={w.ref: answers.handover_choices(rt, w.interrupt)
                                           for w in listing.items}, notice=notice,
                              errors=errors, values=values, editable=editable,
                              refresh_url=f"/inbox?{query}", partial=partial), status)


@router.get("/inbox")
@_guarded
async def inbox(request: Request, rt: Rt, agent: Filter = None, tool: Filter = None,
                reason: Filter = None, partial: Annotated[int, Query(ge=0, le=1)] = 0
                ) -> Response:
    """The requests waiting for the signed-in reviewer, most urgent first; the sign-in
    form for anyone else."""
    who = await _in_thread(_who, rt, request)
    if who is None and not partial and request.headers.get("sec-fetch-site") == "cross-site":
        # From a mail's link: the session cookie (SameSite=Strict) was not sent. One step
        # from this site, and it is.
        return _page(render_sign_in("continue"))
    if who is None:
        return _page(render_sign_in("ask"), 401 if partial else 200)
    flashed = request.cookies.get(FLASH) if not partial else None
    told = signin.read_flash(_keys(rt), flashed, who.session_id) if flashed else None
    page = await _in_thread(lambda: _inbox(rt, who, _filters(agent, tool, reason),
                                           partial=bool(partial),
                                           notice=Notice(*told) if told else None))
    if flashed:
        page.delete_cookie(FLASH, path="/inbox", httponly=True, samesite="strict",
                           secure=_secure(rt, request))
    return page


@router.post("/inbox/answer")
@_guarded
async def answer(request: Request, rt: Rt) -> Response:
    """Approve, decline, answer or hand on one request, then back to the list (303)."""
    form = await _form(request)
    who = await _signed_in(rt, request, form)
    done = await _in_thread(_answer, rt, who, form)
    return _after_post(rt, request, who, done) if isinstance(done, Notice) else done


def _answer(rt: Runtime, who: Who, form: dict[str, str]) -> Response | Notice:
    """The page that says why nothing was recorded, or the notice of what was."""
    ref = form.get("_ref", "")
    found = waiting.find(rt, who.reviewer, ref)
    if found is None:
        return _inbox(rt, who, NO_FILTERS, status=409, notice=Notice(
            _gone(rt, who, ref), "errors"))
    handing_on = form.get("_action") == "delegate"
    try:
        # Inside: handed on or gone since it was found, it is refused on the page too.
        opened = answers.open_for(rt, who.reviewer, found.run.id, found.interrupt.id)
        if handing_on:
            to = form.get("delegate_to", "").strip()
            answers.delegate(rt, opened, to, channel="inbox",
                             note=form.get("delegate_note", "").strip() or None)
            target = rt.reviewers.get(to)
            return Notice(f"You handed “{_title(found)}” to "
                          f"{target.label if target else to}.")
        entry = entry_from_form(found.interrupt, form)
        if commands.approves(entry) and commands.reviewers_may_edit(rt, found.run.agent,
                                                                    found.interrupt):
            edited = input_from_form(found.interrupt, form)
            if edited is not None:
                entry = entry.model_copy(update={"metadata": {
                    **(entry.metadata or {}), "replaceInput": edited}})
        answers.answer(rt, opened, entry, channel="inbox")
    except Invalid as exc:
        errors = (exc.detail or {}).get("errors") if isinstance(exc.detail, dict) else None
        return _inbox(rt, who, NO_FILTERS, status=422,
                      errors={ref: errors or [{"path": "", "message": exc.message}]},
                      values={} if handing_on else {ref: form})
    except LaybyError as exc:  # a rival answered first, the run was cancelled, …
        return _inbox(rt, who, NO_FILTERS, status=status_of(exc),
                      notice=Notice(f"Nothing was recorded: {exc.message}", "errors"))
    fresh = answers.reopen(rt, opened)
    done = outcome(fresh.interrupt) if not fresh.is_open else "approved"
    more = (f" It waits for {fresh.interrupt.required_approvals - len(fresh.interrupt.approvals)}"
            " more approval(s) from other reviewers." if fresh.is_open else "")
    return Notice(f"You {done} “{_title(found)}”.{more}" if done in ("approved", "declined")
                  else f"Your answer to “{_title(found)}” was recorded.{more}")


def _after_post(rt: Runtime, request: Request, who: Who, notice: Notice) -> Response:
    """Post/redirect/get: the answer taken, the browser is sent to the inbox (a reload
    then reads the list again instead of posting the answer again), the notice riding in
    a signed cookie for that one page."""
    response = RedirectResponse("/inbox", status_code=303, headers=_HEADERS)
    response.set_cookie(FLASH, signin.flash(_keys(rt), who.session_id, notice.text,
                                            notice.kind),
                        max_age=60, path="/inbox", httponly=True, samesite="strict",
                        secure=_secure(rt, request))
    return response


def _title(w: waiting.Waiting) -> str:
    return w.interrupt.message or w.interrupt.tool_name


def _gone(rt: Runtime, who: Who, ref: str) -> str:
    """Why a request a form named is not there to answer: someone answered it (who, how
    and when), it closed, or it is not this reviewer's. How it ended is told only to a
    reviewer it was (or would have been) theirs to answer."""
    mine = ("Nothing was recorded: that request is not one of yours to answer (it may have "
            "been handed on, or is not in your inbox).")
    found = waiting.parse_ref(ref)
    if found is None:
        return mine
    run_id, interrupt_id = found
    views = rt.store.runs.views([run_id])
    intr = next((i for run in views for i in run.interrupts if i.id == interrupt_id), None)
    by = f"reviewer:{who.reviewer.id}"
    if intr is None or not (
            who.reviewer.id in {a.reviewer.id
                                for a in routing.everyone(rt.reviewers.directory(), intr)}
            or any(a.answered_by == by for a in intr.approvals)
            or any(d.reviewer == who.reviewer.id for d in intr.delegations)):
        return mine
    if intr.answer is not None:
        a = intr.answer
        return (f"Nothing was recorded: this request was already {outcome(intr)} by "
                f"{a.answered_by} via {a.channel} at {a.answered_at}.")
    if intr.state.value != "open":
        return "Nothing was recorded: this request is closed (expired, or its run ended)."
    return mine


# -- approving a selection ----------------------------------------------------------------


@router.post("/inbox/bulk")
@_guarded
async def bulk(request: Request, rt: Rt) -> Response:
    """The selection, listed for a confirmation: nothing is recorded yet."""
    who, picks = await _selection(rt, request)

    def confirm() -> HTMLResponse:
        chosen, skipped = _chosen(rt, who, picks)
        if not chosen:
            return _inbox(rt, who, NO_FILTERS, status=422, notice=Notice(
                "Select the requests to approve first (tick “Select for approving at "
                "once”): nothing was recorded." if not picks else
                "None of the selected requests can be approved at once any more: nothing "
                "was recorded.", "errors"))
        return _page(render_bulk_confirm(_signed(rt, who), chosen, skipped))
    return await _in_thread(confirm)


async def _selection(rt: Runtime, request: Request) -> tuple[Who, list[str]]:
    """Who posts a selection, and what they ticked; refused (as the inbox, saying why)
    past MAX_PICKS."""
    form, picks = await _picks(request)
    who = await _signed_in(rt, request, form)
    if len(picks) > MAX_PICKS:
        raise _Refused(await _in_thread(lambda: _inbox(rt, who, NO_FILTERS, status=422,
                                                       notice=Notice(
            f"{len(picks)} requests were selected; at most {MAX_PICKS} are approved at "
            "once: nothing was recorded", "errors"))))
    return who, picks


def _chosen(rt: Runtime, who: Who, picks: list[str]) -> tuple[list[waiting.Waiting], str | None]:
    found = [waiting.find(rt, who.reviewer, ref) for ref in picks]
    chosen = [w for w in found if w is not None and w.bulk_approvable]
    gone = len(picks) - len(chosen)
    return chosen, (f"{gone} of the selected requests cannot be approved at once any more "
                    "(answered meanwhile, or asking for more than an approval) and are left "
                    "out." if gone else None)


@router.post("/inbox/bulk/approve")
@_guarded
async def bulk_approve(request: Request, rt: Rt) -> Response:
    """Each request of the confirmed selection approved on its own."""
    who, picks = await _selection(rt, request)

    def approve() -> HTMLResponse:
        results, approved = [], 0
        for ref in picks:
            w = waiting.find(rt, who.reviewer, ref)
            if w is None or not w.bulk_approvable:
                results.append((ref, ref, _gone(rt, who, ref).removeprefix("Nothing was "
                                                                      "recorded: ")))
                continue
            try:
                opened = answers.open_for(rt, who.reviewer, w.run.id, w.interrupt.id)
                answers.answer(rt, opened, entry_from_form(w.interrupt,
                                                           {"decision": "approve"}),
                               channel="inbox")
            except LaybyError as exc:
                results.append((ref, _title(w), f"not approved: {exc.message}"))
                continue
            approved += 1
            results.append((ref, _title(w), "approved"))
        return _page(render_bulk_done(_signed(rt, who), results, approved))
    return await _in_thread(approve)


# -- history, live arrival ----------------------------------------------------------------


@router.get("/inbox/history")
@_guarded
async def history(request: Request, rt: Rt) -> Response:
    who = await _in_thread(_who, rt, request)
    if who is None:
        return RedirectResponse("/inbox", status_code=303, headers=_HEADERS)
    found = await _in_thread(waiting.history_of, rt, who.reviewer)
    return _page(render_history(_signed(rt, who), found))


@router.get("/inbox/timeline")
@_guarded
async def run_timeline(request: Request, rt: Rt,
                       ref: Annotated[str, Query(max_length=300)] = "") -> Response:
    """What the run behind one of the reviewer's open requests (`ref`: `<run id>/<interrupt
    id>`, as the inbox's forms name it) did so far. Another's request, or one no longer
    open, is not theirs to see: 404, and the inbox again."""
    who = await _in_thread(_who, rt, request)
    if who is None:
        return RedirectResponse("/inbox", status_code=303, headers=_HEADERS)
    found = await _in_thread(waiting.find, rt, who.reviewer, ref)
    if found is None:
        return await _in_thread(lambda: _inbox(rt, who, NO_FILTERS, status=404, notice=Notice(
            "That request is not one waiting for you any more: it was answered, expired, "
            "or was never yours.", "notice")))
    entries = await _in_thread(timeline.of_run, rt.store, found.run.id, timeline.PAGE_EVENTS)
    return _page(render_timeline(_signed(rt, who), found, entries))


@router.get("/inbox/events")
@_guarded
async def events(request: Request, rt: Rt) -> Response:
    """`changed` whenever the requests waiting for the reviewer change: a new one, or one
    answered elsewhere. The page reads the list again then."""
    who = await _in_thread(_who, rt, request)
    if who is None:
        return _page(render_sign_in("ask"), 401)

    def refs() -> frozenset[str]:
        return waiting.refs_for(rt, who.reviewer)

    def pulse() -> tuple[int, list[tuple[str, int]]]:
        # Two cheap reads: a run that parks, resumes or ends changes one or the other.
        runs = rt.store.all_runs
        return runs.count(Status.INTERRUPTED), runs.newest(Status.INTERRUPTED, 1)

    async def changes() -> AsyncIterator[str]:
        seen, beat = await _in_thread(lambda: (refs(), pulse()))
        yield "retry: 5000\n\n"
        for polls in itertools.count(1):
            await asyncio.sleep(POLL_S)
            if polls % _PING_EVERY == 0:
                yield ": keep-alive\n\n"  # proxies drop a stream that says nothing
            now = await _in_thread(pulse)
            # The whole list is read again when runs moved, and now and then regardless:
            # a hand-over or an escalation reaching this reviewer moves no run.
            if now == beat and polls % _FULL_EVERY:
                continue
            try:
                still = await _in_thread(_who, rt, request)
            except _Refused:
                still = None
            if still is None or still.reviewer.id != who.reviewer.id:
                return  # signed out, or out of the directory: the stream ends with it
            beat, found = now, await _in_thread(refs)
            if found != seen:
                seen = found
                yield f"event: changed\ndata: {len(found)}\n\n"
    return EventStreamResponse(changes(), media_type="text/event-stream",
                               headers={**STREAM_HEADERS, "Cache-Control": "no-store"})


@router.get("/inbox/inbox.js")
async def script() -> Response:
    return Response(_SCRIPT, media_type="text/javascript",
                    headers={"Cache-Control": "max-age=300"})
