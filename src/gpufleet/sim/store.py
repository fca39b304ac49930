"""Where a ``SimWorld`` keeps its state: a snapshot file plus an append-only journal.

Rewriting the whole world on every mutation costs O(fleet) per call (about 100 ms for
2,000 nodes and their job history), so provisioning a fleet would be quadratic. Instead
each mutation appends the records it changed to ``<path>.journal`` (one short line, one
write), and the journal is folded into a fresh snapshot once it outgrows the snapshot.

Crash safety: a snapshot is written to a temporary file and renamed into place; each
snapshot has an epoch, and journal lines carry the epoch they extend, so lines already
folded into a newer snapshot (a crash between the rename and the truncation) are skipped.
A torn last journal line (killed mid-write) is cut off: that call never returned.
No fsync: the page cache survives the death of this process, which is the crash the
simulator must survive; a power loss on the control-plane host is not its concern.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FORMAT_VERSION = 2
_MIN_COMPACT_BYTES = 1 << 20


class WorldStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal_path = path.with_name(path.name + ".journal")
        self._epoch = 0
        self._snapshot_bytes = 0
        self._journal_bytes = 0

    def load(self) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The last snapshot (None if there is none) and the journal entries after it."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None, []
        snapshot = json.loads(text)
        if not isinstance(snapshot, dict) or snapshot.get("version") != FORMAT_VERSION:
            raise ValueError(f"{self.path}: not a sim world file of format {FORMAT_VERSION}")
        self._epoch = int(snapshot["epoch"])
        self._snapshot_bytes = len(text)
        try:
            raw = self.journal_path.read_bytes()
        except FileNotFoundError:
            raw = b""
        end = raw.rfind(b"\n") + 1
        if end < len(raw):
            # A torn last line: cut it off, or the next append would glue onto it.
            os.truncate(self.journal_path, end)
        entries: list[dict[str, Any]] = []
        for line in raw[:end].decode("utf-8").splitlines():
            entry = json.loads(line)
            if entry.get("epoch") == self._epoch:
                entries.extend(entry["changes"])
        self._journal_bytes = end
        return snapshot, entries

    def append(self, changes: list[dict[str, Any]]) -> None:
        """Record one mutation's changed records."""
        line = json.dumps({"epoch": self._epoch, "changes": changes}, separators=(",", ":"))
        fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        self._journal_bytes += len(line) + 1

    def wants_snapshot(self) -> bool:
        """True once replaying the journal would cost more than reading a snapshot."""
        return self._journal_bytes > max(_MIN_COMPACT_BYTES, self._snapshot_bytes)

    def write_snapshot(self, payload: dict[str, Any]) -> None:
        """Replace the snapshot with ``payload`` and start an empty journal."""
        self._epoch += 1
        data = json.dumps(
            {**payload, "version": FORMAT_VERSION, "epoch": self._epoch}, separators=(",", ":")
        )
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        # 0600: user_data holds node tokens.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(data)
        os.replace(tmp, self.path)
        fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.close(fd)
        self._snapshot_bytes = len(data)
        self._journal_bytes = 0
