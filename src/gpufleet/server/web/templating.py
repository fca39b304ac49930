"""Jinja2 for the console: one environment, autoescaping on, package templates.

Pages are rendered to a string here and sent gzip-compressed when the browser accepts
it (the health grid of a large cluster is hundreds of kB of markup that compresses ~15×).
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
from functools import cache
from importlib import resources
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

GZIP_MIN_BYTES = 2048
GZIP_LEVEL = 5  # ~3× faster than 9 for a few % more bytes


def ago(value: dt.datetime | None, now: dt.datetime | None = None) -> str:
    """ "12 s ago", "3 min ago", "5 h ago", "2 d ago"; "never" for None."""
    if value is None:
        return "never"
    seconds = ((now or dt.datetime.now(dt.UTC)) - value).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 60:
        text = f"{int(seconds)} s"
    elif seconds < 3600:
        text = f"{int(seconds // 60)} min"
    elif seconds < 86400:
        text = f"{int(seconds // 3600)} h"
    else:
        text = f"{int(seconds // 86400)} d"
    return f"in {text}" if future else f"{text} ago"


def timestamp(value: dt.datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(value: dt.datetime | None) -> str:
    return "" if value is None else value.astimezone(dt.UTC).isoformat()


def words(value: object) -> str:
    """in_service → in service; reset_gpu → reset GPU."""
    text = str(getattr(value, "value", value)).replace("_", " ")
    return text.replace(" gpu", " GPU").replace("gpu ", "GPU ")


def number(value: float | int | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


@cache
def static_version() -> str:
    """A hash of the static files, appended to their URLs so browsers never run stale JS."""
    digest = hashlib.blake2b(digest_size=6)
    folder = resources.files("gpufleet.server.web") / "static"
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if item.is_file():
            digest.update(item.name.encode())
            digest.update(item.read_bytes())
    return digest.hexdigest()


@cache
def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("gpufleet.server.web", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,  # a typo in a template fails the render, loudly
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
        enable_async=False,
    )
    env.filters.update(ago=ago, ts=timestamp, iso=iso, words=words, number=number)
    env.globals.update(static_version=static_version)
    return env


def render_text(template: str, context: dict[str, Any]) -> str:
    return environment().get_template(template).render(context)


def html_response(
    request: Request, body: str, *, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """An HTML response, gzip-compressed when the client accepts it and it is worth it."""
    out_headers = {
        "Cache-Control": "no-store",  # pages show live state and hold CSRF tokens
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
        "X-Frame-Options": "DENY",
        "Content-Security-Policy": (
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
        ),
        **(headers or {}),
    }
    data = body.encode()
    if len(data) >= GZIP_MIN_BYTES and "gzip" in request.headers.get("accept-encoding", ""):
        data = gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)
        out_headers["Content-Encoding"] = "gzip"
        out_headers["Vary"] = "Accept-Encoding"
    return HTMLResponse(content=data, status_code=status_code, headers=out_headers)
