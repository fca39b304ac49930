"""The only I/O of the Redfish driver: HTTP calls to one BMC through ``sushy``'s connector.

``sushy`` (the [server] extra) is imported when the first client is made, so the driver
package imports without it. Calls are synchronous (requests underneath); the driver runs
them in a worker thread. Every failure comes out as ``BmcCallError`` with a ``kind`` the
driver decides on (retry or not) and a detail that never holds the password: Basic auth
sits in the HTTP session, never in a URL, a header we log or a message, and any echo of
the secret in a BMC's answer is masked.

Only sushy's connector is used, not its resource classes: the driver needs the raw
``ResetType@Redfish.AllowableValues``, the 501 of an advertised type and the 202 of a
task, which sushy's ``System.reset_system`` hides or blocks on. sushy's own retries are
turned off (``server_side_retries_left=0``, a one-try connection loop) because the
driver retries with backoff and a bound of its own.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Literal

from gpufleet.providers.redfish.parsing import BmcUrl

# What went wrong. Transient kinds are retried by the driver; the rest fail at once.
Kind = Literal[
    "auth",  # 401/403: the credential is wrong or lacks the privilege
    "not_found",  # 404
    "bad_request",  # 400
    "unsupported",  # 501 Not Implemented
    "http",  # another 4xx (405, 409, 412...)
    "server",  # 5xx other than 501
    "unreachable",  # refused, reset, DNS
    "timeout",  # no answer within the request timeout
    "tls",  # certificate or handshake failure
    "protocol",  # not JSON where JSON was due
]
TRANSIENT: frozenset[str] = frozenset({"server", "unreachable", "timeout"})
_DETAIL_LIMIT = 500


class BmcCallError(Exception):
    """One failed call; ``str()`` is safe to show (no secret)."""

    def __init__(
        self, kind: Kind, detail: str, *, status: int | None = None, refused: bool = False
    ) -> None:
        super().__init__(detail)
        self.kind: Kind = kind
        self.detail = detail
        self.status = status
        # The connection was refused: the request never reached the BMC's web server.
        self.refused = refused

    @property
    def transient(self) -> bool:
        return self.kind in TRANSIENT


@dataclass(frozen=True, slots=True)
class BmcResponse:
    status: int
    body: dict[str, Any] = field(default_factory=dict)
    location: str | None = None
    etag: str | None = None


def load_sushy() -> Any:
    """The sushy package. Any, because sushy ships no type information."""
    return importlib.import_module("sushy")


def _causes(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(out) < 10:
        out.append(seen)
        seen = seen.__cause__ or seen.__context__
    return out


class RedfishClient:
    """HTTP Basic calls to one BMC. Not thread-safe: one operation at a time."""

    def __init__(
        self,
        url: BmcUrl,
        *,
        username: str | None,
        password: str | None,
        verify: bool | str,
        timeout_s: float,
    ) -> None:
        sushy = load_sushy()
        self._sushy = sushy
        self._url = url
        self._secret = password or ""
        self._conn = sushy.connector.Connector(
            url.base,
            verify=verify,
            server_side_retries=1,  # one try in sushy's connection loop; we retry
            server_side_retries_delay=0,
            default_request_timeout=timeout_s,
            connect_timeout=timeout_s,
        )
        if username is not None or password is not None:
            self._conn.set_http_basic_auth(username or "", password or "")

    def __repr__(self) -> str:
        return f"RedfishClient({self._url})"

    def close(self) -> None:
        self._conn.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        etag: str | None = None,
    ) -> BmcResponse:
        """One HTTP call; ``path`` is absolute (``/redfish/v1/...``) or a full URL.

        Raises ``BmcCallError``.
        """
        headers = {"If-Match": etag} if etag else None
        exceptions = self._sushy.exceptions
        try:
            response = self._conn._op(  # the public verbs cannot turn sushy's retries off
                method,
                path,
                data=body,
                headers=headers,
                server_side_retries_left=0,
                allow_reauth=False,
            )
        except exceptions.HTTPError as exc:
            raise self._http_error(method, path, exc) from None
        except exceptions.ConnectionError as exc:
            raise self._connection_error(method, path, exc) from None
        except exceptions.SushyError as exc:
            raise BmcCallError("protocol", self._mask(f"{method} {path}: {exc}")) from None
        parsed: dict[str, Any] = {}
        if response.content:
            try:
                doc = response.json()
            except ValueError:
                doc = None
            if isinstance(doc, dict):
                parsed = doc
            elif method == "GET":
                raise BmcCallError(
                    "protocol",
                    f"{method} {path}: HTTP {response.status_code} without a JSON object",
                    status=response.status_code,
                )
        return BmcResponse(
            status=response.status_code,
            body=parsed,
            location=response.headers.get("Location"),
            etag=response.headers.get("ETag"),
        )

    def _mask(self, text: str) -> str:
        if self._secret:
            text = text.replace(self._secret, "***")
        return text[:_DETAIL_LIMIT]

    def _http_error(self, method: str, path: str, exc: Any) -> BmcCallError:
        status = int(exc.status_code or 0)
        said = self._mask(str(exc.detail or exc.code or "no detail"))
        kind: Kind
        if status in (401, 403):
            kind = "auth"
        elif status == 404:
            kind = "not_found"
        elif status == 400:
            kind = "bad_request"
        elif status == 501:
            kind = "unsupported"
        elif status >= 500:
            kind = "server"
        else:
            kind = "http"
        return BmcCallError(kind, f"{method} {path}: HTTP {status}: {said}", status=status)

    def _connection_error(self, method: str, path: str, exc: BaseException) -> BmcCallError:
        requests = importlib.import_module("requests")
        for cause in _causes(exc):
            if isinstance(cause, requests.exceptions.SSLError):
                return BmcCallError(
                    "tls",
                    self._mask(f"{method} {path}: TLS failed: {cause}"),
                )
            if isinstance(cause, requests.exceptions.Timeout):
                return BmcCallError("timeout", f"{method} {path}: no answer in time")
        causes = _causes(exc)
        refused = any(isinstance(c, ConnectionRefusedError) for c in causes) or any(
            "Connection refused" in str(c) for c in causes
        )
        return BmcCallError(
            "unreachable",
            self._mask(f"{method} {path}: cannot connect: {_short(exc)}"),
            refused=refused,
        )


def _short(exc: BaseException) -> str:
    """The innermost reason of a requests connection error ("Connection refused")."""
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "No route to host"):
        if marker in text:
            return marker
    return text
