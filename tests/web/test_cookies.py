"""Session cookies are Secure wherever the console is reached over HTTPS (or could be),
and plain only on the loopback http:// demo, where a browser would never send a Secure
cookie back and the console could not be used at all."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from webhelpers import log_in

from gpufleet.testing.app import make_settings, running_app
from gpufleet.testing.databases import SqliteTemplate

LOOPBACK = "http://127.0.0.1:8080"
CASES = [
    # (public URL, session_cookie_secure, the URL the browser uses, Secure expected)
    pytest.param(LOOPBACK, None, LOOPBACK, False, id="loopback-demo-over-http"),
    pytest.param(LOOPBACK, None, "https://127.0.0.1:8443", True, id="loopback-over-https"),
    pytest.param(LOOPBACK, True, LOOPBACK, True, id="forced-secure"),
    pytest.param("https://fleet.example.com", None, "http://10.0.0.5", True, id="behind-tls-proxy"),
    pytest.param("http://10.0.0.5:8080", None, "http://10.0.0.5:8080", True, id="lan-http"),
]


@pytest.mark.parametrize(("public_url", "secure", "url", "want"), CASES)
async def test_secure_cookies_follow_how_the_console_is_reached(
    sqlite_template: SqliteTemplate,
    tmp_path: Path,
    public_url: str,
    secure: bool | None,
    url: str,
    want: bool,
) -> None:
    settings = make_settings(
        data_dir=tmp_path / "data",
        # Not a store test: cookies do not depend on the database.
        database_url=sqlite_template.clone(tmp_path / "db"),
        public_url=public_url,
        session_cookie_secure=secure,
    )
    async with (
        running_app(settings) as app,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app), base_url=url) as client,
    ):
        page = await client.get("/login")
        assert page.status_code == 200
        assert _secure(page)["gpufleet_login_csrf"] is want
        if want and not url.startswith("https://"):
            return  # a browser keeps a Secure cookie from http:// but never sends it back
        response = await log_in(client, app.owner_token)
        assert response.status_code == 303, response.text
        assert _secure(response)["gpufleet_session"] is want
        assert _secure(response)["gpufleet_csrf"] is want
        assert (await client.get("/")).status_code == 200  # sent back, and it works


def _secure(response: httpx.Response) -> dict[str, bool]:
    """Each cookie the response sets, and whether it is Secure."""
    cookies = (c.split(";") for c in response.headers.get_list("set-cookie"))
    return {
        parts[0].split("=", 1)[0]: any(p.strip().lower() == "secure" for p in parts[1:])
        for parts in cookies
    }
