"""Who is looking at the console: the session cookie, the CSRF token of its forms, flashes.

The console authenticates by the same ``gpufleet_session`` cookie as the API (the OIDC
callback or the token form sets it), so the caller a page sees is exactly the ``Caller``
the API would see. Every console form POSTs a hidden ``csrf`` field holding the session's
CSRF token; the server compares it before anything else (``read_form``).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import parse_qsl, quote

from fastapi import Depends, Request, Response

from gpufleet.core.errors import Forbidden, InvalidInput, Unauthorized
from gpufleet.server.context import AppContext
from gpufleet.server.deps import CtxDep, client_ip
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.sessions import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    csrf_token_for,
    resolve_session_caller,
)

FLASH_COOKIE = "gpufleet_flash"
CSRF_FIELD = "csrf"
MAX_FORM_BYTES = 256 * 1024  # startup scripts are the largest thing a console form sends


class LoginRequired(Exception):
    """No usable session: the page redirects to /login (and back afterwards)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class WebUser:
    caller: Caller
    csrf: str  # the session's CSRF token, for the hidden field of every form

    @property
    def name(self) -> str:
        return self.caller.user_name


async def web_user(request: Request, ctx: CtxDep) -> WebUser:
    secret = request.cookies.get(SESSION_COOKIE)
    if not secret:
        raise LoginRequired()
    try:
        async with ctx.db.transaction() as session:
            caller = await resolve_session_caller(
                session, secret=secret, now=ctx.clock.now(), source_ip=client_ip(request)
            )
    except Unauthorized as exc:
        raise LoginRequired(exc.message) from None
    return WebUser(caller=caller, csrf=csrf_token_for(secret))


WebUserDep = Annotated[WebUser, Depends(web_user)]


def safe_next(value: str | None, default: str = "/") -> str:
    """A path on this server to go back to; anything else (an open redirect) → default."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return default
    return value[:1000]


async def read_form(request: Request, *, csrf: str | None) -> dict[str, list[str]]:
    """The urlencoded body of a console form, after checking its CSRF field.

    ``csrf``: the expected token (the session's), or None for the login form, whose
    token the caller checks itself (there is no session yet).
    """
    if request.headers.get("content-type", "").split(";")[0].strip() not in (
        "application/x-www-form-urlencoded",
        "",
    ):
        raise InvalidInput("console forms are sent as application/x-www-form-urlencoded")
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise InvalidInput(f"form too large (at most {MAX_FORM_BYTES // 1024} KiB)")
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise InvalidInput("the form is not valid UTF-8") from None
    form: dict[str, list[str]] = {}
    for key, value in pairs:
        form.setdefault(key, []).append(value)
    request.state.form_next = safe_next(first(form, "next"), default="")
    if csrf is not None:
        sent = first(form, CSRF_FIELD)
        if not sent or not hmac.compare_digest(sent.encode(), csrf.encode()):
            raise Forbidden(
                "the form's CSRF token is missing or does not match your session; reload the "
                "page and try again",
                field=CSRF_FIELD,
            )
    return form


def first(form: dict[str, list[str]], name: str, default: str = "") -> str:
    values = form.get(name)
    return values[0] if values else default


def set_flash(response: Response, *, text: str, kind: str = "ok") -> None:
    """A one-time message shown on the next page (after a POST → redirect)."""
    payload = json.dumps({"kind": kind, "text": text[:2000]}).encode()
    response.set_cookie(
        FLASH_COOKIE,
        base64.urlsafe_b64encode(payload).decode(),
        max_age=60,
        path="/",
        httponly=True,
        samesite="lax",
    )


def take_flash(request: Request) -> dict[str, str] | None:
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw:
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(raw.encode()))
    except (ValueError, binascii.Error):
        return None
    if not isinstance(value, dict) or value.get("kind") not in ("ok", "error"):
        return None
    return {"kind": str(value["kind"]), "text": str(value.get("text", ""))}


def set_session_cookies(
    response: Response,
    ctx: AppContext,
    request: Request,
    *,
    secret: str,
    csrf: str,
    max_age: int,
) -> None:
    """The cookies of a console session, with the same attributes as the OIDC callback's."""
    secure = ctx.settings.cookies_secure(scheme=request.url.scheme)
    response.set_cookie(
        SESSION_COOKIE, secret, max_age=max_age, path="/", secure=secure, httponly=True,
        samesite="lax",
    )  # fmt: skip
    response.set_cookie(
        CSRF_COOKIE, csrf, max_age=max_age, path="/", secure=secure, httponly=False,
        samesite="lax",
    )  # fmt: skip


def clear_session_cookies(response: Response, ctx: AppContext, request: Request) -> None:
    secure = ctx.settings.cookies_secure(scheme=request.url.scheme)
    for name in (SESSION_COOKIE, CSRF_COOKIE):
        response.delete_cookie(name, path="/", secure=secure, httponly=True, samesite="lax")


def login_url(next_path: str) -> str:
    return "/login?next=" + quote(safe_next(next_path), safe="/")
