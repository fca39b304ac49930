"""A browser-less person at the IdP: follows redirects and submits its forms.

oidc-provider's development pages (devInteractions) are a login form (any password),
a consent form and, for the device grant, a user-code form; each POSTs back with hidden
fields. This reads the first form of each page and submits it, filling in the login.
"""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urljoin

import httpx


class _FirstForm(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.action: str | None = None
        self.fields: dict[str, str] = {}
        self._inside = False
        self._done = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if tag == "form" and not self._done and self.action is None:
            self.action, self._inside = values.get("action", ""), True
        elif (
            tag == "input"
            and self._inside
            and values.get("name")
            and values.get("type") not in ("submit", "button", "checkbox")
        ):
            self.fields[values["name"]] = values.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self._inside:
            self._inside, self._done = False, True


def first_form(html: str) -> tuple[str, dict[str, str]] | None:
    parser = _FirstForm()
    parser.feed(html)
    return (parser.action, parser.fields) if parser.action is not None else None


async def act_at_idp(
    idp: httpx.AsyncClient, url: str, *, login: str, stop_at: str | None = None
) -> str | httpx.Response:
    """Walk the IdP's pages from ``url`` as ``login``.

    Returns the first redirect target starting with ``stop_at`` (the relying party's
    callback, code and state in it), or the last page when there is no form left.
    """
    method, data = "GET", None
    for _ in range(30):
        response = await idp.request(method, url, data=data)
        if response.is_redirect:
            url = urljoin(str(response.url), response.headers["location"])
            if stop_at is not None and url.startswith(stop_at):
                return url
            method, data = "GET", None
            continue
        form = first_form(response.text) if response.status_code == 200 else None
        if form is None:
            return response
        action, fields = form
        if fields.get("prompt") == "login":
            fields.update(login=login, password="any password")
        method, url, data = "POST", urljoin(str(response.url), action), fields
    raise AssertionError(f"no end to the IdP's pages at {url}")
