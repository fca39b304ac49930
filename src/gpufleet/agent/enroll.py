"""The agent's node token: from its settings, from the file it keeps, or by enrolling.

A bare-metal machine gets no user data, so its install hands the agent the cluster's
enroll token instead (``GPUFLEET_AGENT_ENROLL_TOKEN_FILE``). With no node token yet, the
agent sends it with its hostname and kernel boot id, and keeps the node token it gets
back in ``token_path()`` (0600, written whole), which every later start reads: a reboot
does not enroll again, a reinstall (a new disk) does, and the server lets it only while
the node waits for one (``server/services/enrollment.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from pathlib import Path

import httpx

from gpufleet.agent.commands import kernel_boot_id
from gpufleet.agent.settings import AgentSettings
from gpufleet.client.agent import enroll
from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.core.agent_protocol import EnrollRequest

log = logging.getLogger(__name__)


class EnrollmentRefused(Exception):
    """The server will never take this enrollment as it is (a refused or expired token, a
    hostname not in the inventory): an operator must act; retrying does not help."""


async def obtain_node_token(
    settings: AgentSettings,
    *,
    stop: asyncio.Event,
    http: httpx.AsyncClient | None = None,
    boot_id: str | None = None,
) -> str | None:
    """The node token to run with; None if ``stop`` was set while waiting to enroll.

    Raises:
        ValueError: neither a node token nor an enroll token is configured.
        EnrollmentRefused: the server refused the enroll token or the hostname.
    """
    if settings.node_token is not None:
        return settings.node_token.get_secret_value()
    path = settings.token_path()
    kept = _read(path)
    if kept:
        return kept
    enroll_token = settings.read_enroll_token()
    if enroll_token is None:
        return settings.read_token()  # raises the ValueError that names both settings
    own = http is None
    client = http or httpx.AsyncClient(timeout=settings.request_timeout_s)
    if boot_id is None:
        boot_id = kernel_boot_id(settings.boot_id_file)
    request = EnrollRequest(hostname=settings.hostname, boot_id=boot_id)
    delay = settings.retry_initial_s
    try:
        while not stop.is_set():
            try:
                ack = await enroll(
                    client, base_url=settings.server_url, enroll_token=enroll_token, request=request
                )
            except ApiError as exc:
                if exc.status != 409:
                    raise EnrollmentRefused(
                        f"enrollment as {settings.hostname} refused: {exc.message}"
                    ) from None
                log.info("enrollment: %s; trying again in %.0f s", exc.message, delay)
            except ServerUnreachable as exc:
                log.warning("enrollment: server unreachable (%s); trying again", exc)
            else:
                _write(path, ack.node_token)
                log.info(
                    "enrolled as node %s of cluster %s; node token kept in %s",
                    ack.node_name,
                    ack.cluster_id,
                    path,
                )
                return ack.node_token
            jitter = random.uniform(0.8, 1.2)  # noqa: S311 - spreads retries, not a secret
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay * jitter)
            delay = min(delay * 2, settings.retry_max_s)
        return None
    finally:
        if own:
            await client.aclose()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def _write(path: Path, token: str) -> None:
    """Write the token whole (a crash leaves the old file or the new one) and 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
