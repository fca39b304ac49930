"""Steps of the console login, as the browser and the person at the IdP do them."""

from __future__ import annotations

from http.cookies import SimpleCookie
from urllib.parse import parse_qs, urlsplit

import httpx
from idp_browser import act_at_idp
from oidc_env import CALLBACK


async def begin_login(browser: httpx.AsyncClient, *, next_path: str = "/") -> str:
    """GET /auth/login; returns the IdP authorization URL it redirects to."""
    response = await browser.get("/api/v1/auth/login", params={"next": next_path})
    assert response.status_code == 302, response.text
    return response.headers["location"]


async def approve_at_idp(
    idp: httpx.AsyncClient, authorize_url: str, *, login: str, callback: str = CALLBACK
) -> str:
    """The person logs in and consents; returns the callback URL (code, state, iss)."""
    url = await act_at_idp(idp, authorize_url, login=login, stop_at=callback)
    assert isinstance(url, str), f"the IdP did not redirect back: {url}"
    return url


async def log_in(
    browser: httpx.AsyncClient, idp: httpx.AsyncClient, *, login: str = "alice"
) -> httpx.Response:
    """The whole login; returns the callback's response (303 + cookies on success)."""
    ours = str(browser.base_url).rstrip("/") + "/api/v1/auth/callback"
    callback = await approve_at_idp(idp, await begin_login(browser), login=login, callback=ours)
    return await browser.get(callback)


def query_of(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = {**query_of(url), **changes}
    return parts._replace(query="&".join(f"{k}={v}" for k, v in query.items())).geturl()


def set_cookies(response: httpx.Response) -> dict[str, dict[str, str | bool]]:
    """Each Set-Cookie of a response: its value and attributes (flags as True)."""
    cookies: dict[str, dict[str, str | bool]] = {}
    for header in response.headers.get_list("set-cookie"):
        jar: SimpleCookie = SimpleCookie()
        jar.load(header)
        for name, morsel in jar.items():
            attrs: dict[str, str | bool] = {"value": morsel.value}
            for key in ("path", "samesite", "max-age", "expires"):
                if morsel[key]:
                    attrs[key] = str(morsel[key])
            for flag in ("httponly", "secure"):
                attrs[flag] = bool(morsel[flag])
            cookies[name] = attrs
    return cookies
