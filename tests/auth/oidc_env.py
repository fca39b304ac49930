"""Where the test IdP lives and how tests talk to its test-only endpoints."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gpufleet.testing.app import RunningApp

OIDC_DIR = Path(__file__).resolve().parents[1] / "oidc"
APP_URL = "https://gpufleet.test"
CALLBACK = f"{APP_URL}/api/v1/auth/callback"
DEV_URL = "http://127.0.0.1:18080"  # the plain-http loopback dev setup
CLIENT_SECRET = "gpufleet-test-secret"
GROUP_ROLES = {"fleet-admins": "ml:admin", "ml-users": "ml:member"}


@dataclass
class Idp:
    issuer: str

    def rotate_keys(self) -> str:
        """Make the IdP sign with a new key from now on; returns its kid."""
        response = httpx.post(f"{self.issuer}/_test/rotate-keys", timeout=10)
        response.raise_for_status()
        return str(response.json()["kid"])

    def set_user(self, sub: str, **claims: Any) -> None:
        response = httpx.put(f"{self.issuer}/_test/users/{sub}", json=claims, timeout=10)
        response.raise_for_status()

    def sign(self, claims: dict[str, Any]) -> str:
        """An ID token with these claims, signed by the IdP's current key."""
        response = httpx.post(f"{self.issuer}/_test/sign", json={"claims": claims}, timeout=10)
        response.raise_for_status()
        return str(response.json()["token"])

    def jwks(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{self.issuer}/jwks", timeout=10).json()
        return body


# oidc_app_factory(**settings overrides) → async context manager of the running app.
OidcAppFactory = Callable[..., AbstractAsyncContextManager[RunningApp]]


def browser_for(app: RunningApp, base_url: str = APP_URL) -> httpx.AsyncClient:
    """A cookie-keeping client of the app (no token), as a browser would be."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app), base_url=base_url)
