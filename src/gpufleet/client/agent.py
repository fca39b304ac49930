"""The agent side of the agent protocol: send report batches with a node token.

``base_url`` may name several replicas of the server, comma-separated: each request goes
to the one that answered last and fails over to the next when it is down
(``client/http.py``). Every call here is safe to repeat on another replica (the server
drops repeats by ``seq`` or id), so a request cut off mid-way moves on too; enrollment,
which is not, moves on only when no replica took the request.
"""

from __future__ import annotations

from types import TracebackType

import httpx

from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.client.http import ServerUrls, asend_with_failover, raise_for_error
from gpufleet.core.agent_protocol import (
    MAX_HAVE,
    CommandPoll,
    CommandResult,
    CommandResultAck,
    EnrollAck,
    EnrollRequest,
    EventAck,
    EventBatch,
    FindingAck,
    FindingBatch,
    ReportAck,
    ReportBatch,
)
from gpufleet.core.slurm_admins import AccessConfig

REPORTS_PATH = "/api/v1/agent/reports"
FINDINGS_PATH = "/api/v1/agent/findings"
EVENTS_PATH = "/api/v1/agent/events"
ACCESS_PATH = "/api/v1/agent/access"
COMMANDS_PATH = "/api/v1/agent/commands"
ENROLL_PATH = "/api/v1/agent/enroll"


async def enroll(
    http: httpx.AsyncClient, *, base_url: str, enroll_token: str, request: EnrollRequest
) -> EnrollAck:
    """Trade the cluster's enroll token and this machine's hostname for its node token
    (bare metal, ``server/services/enrollment.py``). Raises ``ApiError`` (401: the token
    is refused; 404: no such host; 409: no node waits for it yet, or it already enrolled)
    or ``ServerUnreachable``. ``base_url``: one URL or several, comma-separated."""
    response = await asend_with_failover(
        http,
        ServerUrls(base_url),
        "POST",
        ENROLL_PATH,
        # A second enrollment of the same host is refused (409): never send it twice.
        idempotent=False,
        content=request.model_dump_json(exclude_none=True),
        headers={"Authorization": f"Bearer {enroll_token}", "Content-Type": "application/json"},
    )
    raise_for_error(response)
    return EnrollAck.model_validate_json(response.content)


class AgentClient:
    """Async client used by the real agent and the simulated ones.

    Pass ``http`` to share one connection pool between many simulated agents.
    ``base_url``: the server's URL, or its replicas' URLs comma-separated.
    """

    def __init__(
        self,
        *,
        base_url: str,
        node_token: str,
        timeout_s: float = 10.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._own_http = http is None
        self._timeout_s = timeout_s
        self._urls = ServerUrls(base_url)
        self._http = http or httpx.AsyncClient(timeout=timeout_s)
        self._headers = {"Authorization": f"Bearer {node_token}"}

    def set_token(self, node_token: str) -> None:
        self._headers = {"Authorization": f"Bearer {node_token}"}

    async def send_reports(self, batch: ReportBatch) -> ReportAck:
        """POST one metrics batch. Raises ``ApiError`` on 4xx/5xx, ``ServerUnreachable``."""
        response = await self._post(REPORTS_PATH, batch.model_dump_json(exclude_none=True))
        return ReportAck.model_validate_json(response.content)

    async def send_findings(self, batch: FindingBatch) -> FindingAck:
        """POST finding changes at once (not with the next metrics batch)."""
        response = await self._post(FINDINGS_PATH, batch.model_dump_json(exclude_none=True))
        return FindingAck.model_validate_json(response.content)

    async def send_events(self, batch: EventBatch) -> EventAck:
        """POST timeline events (ids made by the node; repeats are dropped)."""
        response = await self._post(EVENTS_PATH, batch.model_dump_json(exclude_none=True))
        return EventAck.model_validate_json(response.content)

    async def poll_commands(
        self, *, boot_id: str, have: list[str], max_commands: int, wait_s: float = 0.0
    ) -> CommandPoll:
        """GET the commands to start now (at most ``max_commands``) and the ids in
        ``have`` to stop. With ``wait_s`` the server holds the poll open until one comes
        (the request timeout grows by as much)."""
        params: list[tuple[str, str | int | float | bool | None]] = [
            ("boot_id", boot_id),
            ("max", str(max_commands)),
            ("wait_s", f"{wait_s:g}"),
            *(("have", h) for h in have[:MAX_HAVE]),
        ]
        response = await asend_with_failover(
            self._http,
            self._urls,
            "GET",
            COMMANDS_PATH,
            idempotent=True,
            params=params,
            headers=self._headers,
            timeout=self._timeout_s + wait_s,
        )
        raise_for_error(response)
        return CommandPoll.model_validate_json(response.content)

    async def send_command_result(self, result: CommandResult) -> CommandResultAck:
        """POST how a command ended. Safe to repeat: the server stores it once."""
        response = await self._post(
            f"{COMMANDS_PATH}/{result.id}/result", result.model_dump_json(exclude_none=True)
        )
        return CommandResultAck.model_validate_json(response.content)

    async def get_access(self) -> AccessConfig:
        """GET who has sudo and Slurm admin on this node's cluster (its project's admins)."""
        response = await asend_with_failover(
            self._http,
            self._urls,
            "GET",
            ACCESS_PATH,
            idempotent=True,
            headers=self._headers,
            timeout=self._timeout_s,
        )
        raise_for_error(response)
        return AccessConfig.model_validate_json(response.content)

    @property
    def server_url(self) -> str:
        """The replica the next request goes to first (the one that answered last)."""
        return self._urls.current

    async def _post(self, path: str, body: str) -> httpx.Response:
        # Safe to send twice, to two replicas: reports, findings and events carry the
        # node's seq or ids, and a command's result is stored once.
        response = await asend_with_failover(
            self._http,
            self._urls,
            "POST",
            path,
            idempotent=True,
            content=body,
            headers={**self._headers, "Content-Type": "application/json"},
        )
        raise_for_error(response)
        return response

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


__all__ = ["AgentClient", "ApiError", "ServerUnreachable"]
