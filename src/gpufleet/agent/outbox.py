"""Timeline events waiting for the server: one file each under ``<state_dir>/outbox``.

Any process on the node may queue one — the agent itself (a slurmd restart) or a short
helper such as ``gpufleet slurm epilog`` that must not wait for the network. A file is
written whole (temp file, fsync, rename), so the sender never reads half an event, and
deleted only once the server has acknowledged it; the event's id makes a resend harmless.
Names are the event ids (UUIDv7), so name order is time order.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from gpufleet.core.agent_protocol import AgentEventKind, NodeEvent
from gpufleet.core.ids import new_id

log = logging.getLogger(__name__)

OUTBOX_DIR = "outbox"
MAX_MESSAGE = 2000


def outbox_dir(state_dir: Path) -> Path:
    return state_dir / OUTBOX_DIR


def queue_event(
    state_dir: Path,
    kind: AgentEventKind,
    message: str,
    data: Mapping[str, str | int | float | bool] | None = None,
    *,
    at: dt.datetime | None = None,
) -> NodeEvent:
    """Write one event for the agent to send. Raises ``OSError`` if it cannot be written."""
    event = NodeEvent(
        id=new_id(),
        kind=kind,
        message=message[:MAX_MESSAGE] or kind.value,
        at=at or dt.datetime.now(dt.UTC),
        data=dict(data or {}),
    )
    folder = outbox_dir(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{event.id}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(event.model_dump_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / f"{event.id}.json")
    with contextlib.suppress(OSError):  # the rename survives a power cut too
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return event


class Outbox:
    def __init__(self, state_dir: Path) -> None:
        self.dir = outbox_dir(state_dir)

    def pending(self, limit: int) -> list[tuple[Path, NodeEvent]]:
        """The oldest ``limit`` events. A file that is not an event is renamed ``*.bad``
        (kept for a human, never sent, never blocking the rest)."""
        try:
            paths = sorted(p for p in self.dir.iterdir() if p.suffix == ".json")
        except FileNotFoundError:
            return []
        out: list[tuple[Path, NodeEvent]] = []
        for path in paths:
            if len(out) >= limit:
                break
            try:
                out.append((path, NodeEvent.model_validate_json(path.read_bytes())))
            except FileNotFoundError:
                continue  # another sender took it
            except (ValidationError, ValueError, OSError) as exc:
                log.error("outbox file %s is not an event (%s); renamed .bad", path, exc)
                with contextlib.suppress(OSError):
                    path.rename(path.with_suffix(".bad"))
        return out

    def ack(self, paths: list[Path]) -> None:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def depth(self) -> int:
        try:
            return sum(1 for p in self.dir.iterdir() if p.suffix == ".json")
        except FileNotFoundError:
            return 0
