"""The OAuth 2.0 device authorization grant (RFC 8628) with the organisation's IdP.

The CLI asks the IdP for a user code, the person approves it in any browser, the CLI
polls the IdP's token endpoint and gets an ID token, which the gpufleet server verifies
and trades for a personal API token (``ApiClient.create_device_token``). No secret is
involved: the CLI is a public client.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
DEFAULT_INTERVAL_S = 5.0  # RFC 8628 §3.2: when the IdP names none
SLOW_DOWN_STEP_S = 5.0  # RFC 8628 §3.5


class DeviceLoginError(Exception):
    """The IdP refused or the person did not approve in time; the message says which."""


@dataclass(frozen=True)
class DeviceAuthorization:
    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str | None
    expires_in_s: float
    interval_s: float


def _json(response: httpx.Response, what: str) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError as exc:
        raise DeviceLoginError(f"the identity provider's {what} answer is not JSON") from exc
    if not isinstance(body, dict):
        raise DeviceLoginError(f"the identity provider's {what} answer is not a JSON object")
    return body


def start_device_authorization(
    http: httpx.Client, *, endpoint: str, client_id: str, scopes: str
) -> DeviceAuthorization:
    """Ask the IdP for a device code and the user code to show the person."""
    try:
        response = http.post(endpoint, data={"client_id": client_id, "scope": scopes})
    except httpx.HTTPError as exc:
        raise DeviceLoginError(f"cannot reach the identity provider at {endpoint}: {exc}") from exc
    body = _json(response, "device authorization")
    if response.status_code != httpx.codes.OK:
        raise DeviceLoginError(
            f"the identity provider refused the device login: {body.get('error')} "
            f"({body.get('error_description', 'no description')})"
        )
    try:
        return DeviceAuthorization(
            device_code=str(body["device_code"]),
            user_code=str(body["user_code"]),
            verification_uri=str(body.get("verification_uri") or body["verification_url"]),
            verification_uri_complete=(
                str(body["verification_uri_complete"])
                if body.get("verification_uri_complete")
                else None
            ),
            expires_in_s=float(body.get("expires_in", 600)),
            interval_s=float(body.get("interval", DEFAULT_INTERVAL_S)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DeviceLoginError(f"the identity provider's device answer lacks {exc}") from exc


def wait_for_id_token(
    http: httpx.Client,
    *,
    token_endpoint: str,
    client_id: str,
    authorization: DeviceAuthorization,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> str:
    """Poll the IdP until the person approves; return the ID token."""
    deadline = monotonic() + authorization.expires_in_s
    interval = authorization.interval_s
    while True:
        sleep(interval)
        if monotonic() > deadline:
            raise DeviceLoginError("the code expired before it was approved; run login again")
        try:
            response = http.post(
                token_endpoint,
                data={
                    "grant_type": DEVICE_CODE_GRANT,
                    "device_code": authorization.device_code,
                    "client_id": client_id,
                },
            )
        except httpx.HTTPError as exc:
            raise DeviceLoginError(
                f"cannot reach the identity provider at {token_endpoint}: {exc}"
            ) from exc
        body = _json(response, "token")
        if response.status_code == httpx.codes.OK:
            id_token = body.get("id_token")
            if not isinstance(id_token, str):
                raise DeviceLoginError(
                    "the identity provider returned no ID token (is 'openid' among the scopes?)"
                )
            return id_token
        error = body.get("error")
        if error == "authorization_pending":
            continue
        if error == "slow_down":
            interval += SLOW_DOWN_STEP_S
            continue
        if error == "access_denied":
            raise DeviceLoginError("the login was declined in the browser")
        if error == "expired_token":
            raise DeviceLoginError("the code expired before it was approved; run login again")
        raise DeviceLoginError(
            f"the identity provider refused the device login: {error} "
            f"({body.get('error_description', 'no description')})"
        )
