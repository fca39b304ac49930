"""The agent side of the agent protocol: send report batches with a node token."""

from __future__ import annotations

from types import TracebackType

import httpx

from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.client.http import raise_for_error
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
    or ``ServerUnreachable``."""
    try:
        response = await http.post(
            base_url.rstrip("/") + ENROLL_PATH,
            content=request.model_dump_json(exclude_none=True),
            headers={"Authorization": f"Bearer {enroll_token}", "Content-Type": "application/json"},
        )
    except httpx.TransportError as exc:
        raise ServerUnreachable(f"{base_url}: {exc!r}") from exc
    raise_for_error(response)
    return EnrollAck.model_validate_json(response.content)


class AgentClient:
    """Async client used by the real agent and the simulated ones.

    Pass ``transport`` to share one connection pool between many simulated agents.
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
        self._http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout_s)
        self._base_url = base_url.rstrip("/")
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
        try:
            response = await self._http.get(
                self._base_url + COMMANDS_PATH,
                params=params,
                headers=self._headers,
                timeout=self._timeout_s + wait_s,
            )
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"{self._base_url}: {exc!r}") from exc
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
        try:
            response = await self._http.get(
                self._base_url + ACCESS_PATH, headers=self._headers, timeout=self._timeout_s
            )
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"{self._base_url}: {exc!r}") from exc
        raise_for_error(response)
        return AccessConfig.model_validate_json(response.content)

    async def _post(self, path: str, body: str) -> httpx.Response:
        try:
            response = await self._http.post(
                self._base_url + path,
                content=body,
                headers={**self._headers, "Content-Type": "application/json"},
            )
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"{self._base_url}: {exc!r}") from exc
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
