"""The Slurm driver's reads over slurmrestd, Slurm's REST API (when ``SlurmConfig.rest_url``
is set): ``GET /slurm/<version>/nodes``, ``node/<name>`` and ``jobs``.

On 22.05 (``openapi/v0.0.38``) these answers are byte for byte what ``sinfo --all --json``
and ``squeue --all --json`` print (both come from the same openapi plugin; checked on
the lab), and on 23.02+ they are the data_parser shapes of ``scontrol --json`` and
``squeue --json``, so ``parsing.py`` reads both. The API version is the newest of
``API_VERSIONS`` the server routes, found once per client by asking ``/slurm/<v>/ping``
(a version slurmrestd does not have answers 404 before anything reaches slurmctld).

Failures are ``DriverError`` naming the server, the request and what slurmrestd said:
no connection, no answer within ``timeout_s``, a status outside 2xx (slurmrestd 22.05
answers HTTP 500 with ``"nodes": []`` and an ``errors`` list when slurmctld refuses the
request, e.g. an expired JWT), and, read by the driver's parsers, a 2xx answer whose
``errors`` list is not empty.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import httpx

from gpufleet.core.errors import DriverError
from gpufleet.schedulers.slurm.config import SlurmConfig
from gpufleet.schedulers.slurm.parsing import error_body_text

# Newest first. v0.0.38 is Slurm 22.05's (usable until 24.05); v0.0.39+ are the
# data_parser versions of 23.02+ (docs/slurm.md). Only v0.0.38 runs on the lab here; the
# newer shapes are read by the same parsers as ``scontrol --json``/``squeue --json``.
API_VERSIONS = ("v0.0.44", "v0.0.43", "v0.0.42", "v0.0.41", "v0.0.40", "v0.0.39", "v0.0.38")
_NOT_ROUTED = 404
_SOCKET_BASE = "http://slurmrestd"  # host part of requests over a unix socket (unused)
# What 22.05 answers (HTTP 500, errno -1) when slurmctld refuses the JWT of a request,
# expired or forged alike; slurmctld logs "auth_g_verify ... authentication error".
_JWT_REFUSED_ERROR = "Unspecified error"


@dataclass(frozen=True, slots=True)
class RestAnswer:
    server: str  # rest_url, for messages
    path: str  # /slurm/v0.0.38/nodes
    status: int
    text: str

    @property
    def request(self) -> str:
        """``slurmrestd http://h:6820 `GET /slurm/v0.0.38/nodes``` (for messages only)."""
        return f"slurmrestd {self.server} `GET {self.path}`"

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class SlurmRest:
    """GETs from one slurmrestd, with the JWT headers when a token is configured. Keeps one
    HTTP client (and its connections) per event loop."""

    def __init__(self, config: SlurmConfig) -> None:
        if config.rest_url is None:
            raise ValueError("SlurmRest needs SlurmConfig.rest_url")
        self._config = config
        self._server = config.rest_url
        self._version: str | None = None
        self._version_lock = asyncio.Lock()
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._token_file_cache: tuple[tuple[int, int, int], str] | None = None

    @property
    def server(self) -> str:
        return self._server

    @property
    def _uses_token(self) -> bool:
        return self._config.rest_token is not None or self._config.rest_token_file is not None

    async def api_version(self) -> str:
        """The newest API version in ``API_VERSIONS`` the server routes, asked once.

        Raises:
            DriverError: slurmrestd cannot be reached, refuses the credentials (401), or
                routes none of them.
        """
        async with self._version_lock:
            if self._version is None:
                self._version = await self._probe_version()
            return self._version

    async def get(self, endpoint: str, *, node: str | None = None) -> RestAnswer:
        """``GET /slurm/<version>/<endpoint>`` (``nodes``, ``node/lab-001``, ``jobs``).

        Args:
            endpoint: the path after the version, already quoted.
            node: the node the call is about, named in error messages.

        Returns:
            A 2xx answer. Its body may still carry an ``errors`` list: the parsers raise
            ``SlurmReportedError`` for it.

        Raises:
            DriverError: no connection, no answer within ``timeout_s``, or a status
                outside 2xx; the message names the node, the server, the request and the
                errors slurmrestd sent.
        """
        version = await self.api_version()
        answer = await self._get(f"/slurm/{version}/{endpoint}", node=node)
        if not answer.ok:
            raise DriverError(self._describe_failure(answer, node=node))
        return answer

    async def aclose(self) -> None:
        """Close the HTTP client of the running event loop, if any (a later call opens a
        new one)."""
        client, self._client, self._client_loop = self._client, None, None
        if client is not None:
            await client.aclose()

    # ---------------------------------------------------------------------- helpers

    async def _probe_version(self) -> str:
        for version in API_VERSIONS:
            answer = await self._get(f"/slurm/{version}/ping", node=None)
            if answer.status == _NOT_ROUTED:
                continue
            if answer.status == 401:
                # slurmrestd authenticates before it routes: a 401 says nothing of versions
                raise DriverError(self._describe_failure(answer, node=None))
            # Routed: the version exists. Whether the ping itself worked (slurmctld up,
            # token accepted) the real request will say, naming its own endpoint.
            return version
        raise DriverError(
            f"slurm: slurmrestd {self._server} routes none of the API versions gpufleet "
            f"reads ({', '.join(reversed(API_VERSIONS))}; every /slurm/<v>/ping answered "
            "404); `GET /openapi/v3` lists the ones it has"
        )

    async def _get(self, path: str, *, node: str | None) -> RestAnswer:
        where = f"node {node}: " if node else ""
        request = f"slurmrestd {self._server} `GET {path}`"
        timeout_s = self._config.timeout_s
        headers = self._auth_headers()
        try:
            try:
                response = await self._http().get(path, headers=headers)
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
                # A pooled keep-alive connection the server closed (slurmrestd restarted
                # or stopped): a GET may be sent again, on a fresh connection, once.
                response = await self._http().get(path, headers=headers)
        except httpx.TimeoutException:
            raise DriverError(
                f"slurm: {where}{request} did not answer within {timeout_s:g} s "
                "(slurmrestd or slurmctld down or hung?)"
            ) from None
        except httpx.ConnectError as exc:
            raise DriverError(
                f"slurm: {where}{request} could not connect: {exc or type(exc).__name__} "
                "(is slurmrestd running there?)"
            ) from exc
        except httpx.RequestError as exc:
            raise DriverError(
                f"slurm: {where}{request} failed: {type(exc).__name__}: {exc}"
            ) from exc
        return RestAnswer(
            server=self._server, path=path, status=response.status_code, text=response.text
        )

    def _auth_headers(self) -> dict[str, str]:
        token = self._config.rest_token
        if self._config.rest_token_file is not None:
            token = self._token_from_file(self._config.rest_token_file)
        if token is None:
            return {}
        return {"X-SLURM-USER-NAME": self._config.rest_user, "X-SLURM-USER-TOKEN": token}

    def _token_from_file(self, path: str) -> str:
        """The JWT in ``path``, read again when the file changes (a renewed token)."""
        try:
            info = os.stat(path)
            key = (info.st_mtime_ns, info.st_size, info.st_ino)
            if self._token_file_cache is None or self._token_file_cache[0] != key:
                with open(path, encoding="utf-8") as file:
                    text = file.read().strip()
                self._token_file_cache = (key, text.removeprefix("SLURM_JWT=").strip())
        except OSError as exc:
            raise DriverError(
                f"slurm: slurmrestd {self._server}: cannot read the JWT file {path}: {exc}"
            ) from exc
        token = self._token_file_cache[1]
        if not token:
            raise DriverError(
                f"slurm: slurmrestd {self._server}: the JWT file {path} is empty "
                "(write the output of `scontrol token` there)"
            )
        return token

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            socket = self._config.rest_socket
            # The client's trust_env=False: slurmrestd is inside the cluster; an HTTPS_PROXY
            # meant for the outside (an OIDC provider) must not carry these requests. The
            # transport keeps SSL_CERT_FILE/SSL_CERT_DIR (a site CA for https://).
            transport = httpx.AsyncHTTPTransport(uds=socket)
            self._client = httpx.AsyncClient(
                base_url=_SOCKET_BASE if socket is not None else self._server.rstrip("/"),
                headers={"Accept": "application/json"},
                timeout=httpx.Timeout(self._config.timeout_s),
                transport=transport,
                trust_env=False,
                follow_redirects=False,
            )
            self._client_loop = loop
        return self._client

    def _describe_failure(self, answer: RestAnswer, *, node: str | None) -> str:
        where = f"node {node}: " if node else ""
        hint = ""
        if answer.status == 401:
            hint = (
                " (slurmrestd wants X-SLURM-USER-NAME and X-SLURM-USER-TOKEN: set rest_user "
                "and rest_token (or rest_token_file), a JWT from `scontrol token username=<user>`)"
                if not self._uses_token
                else " (slurmrestd refused the user name or token)"
            )
        elif self._uses_token and _JWT_REFUSED_ERROR in answer.text:
            hint = (
                " (this is how slurmctld answers a JWT it refuses, expired or wrong: check "
                f"rest_token, e.g. make a new one with `scontrol token "
                f"username={self._config.rest_user}`)"
            )
        return (
            f"slurm: {where}{answer.request} answered HTTP {answer.status}: "
            f"{error_body_text(answer.text)}{hint}"
        )
