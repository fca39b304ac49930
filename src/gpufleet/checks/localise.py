"""Failure localisation for multi-node NCCL: which node (or link) made an all-reduce slow.

Pure: no I/O, no clock. The caller runs the probes of each round (all-reduces over sets of
nodes, in parallel: the sets of one round never share a node) and reports which failed.

The model: a probe over a set of nodes fails when the set holds a bad node, or both ends
of a bad link. Starting from a set that failed:

- **bisect**: a failed group is split in halves and both are probed; a half that passes
  clears its nodes (they become *known good*), a half that fails is split again. A half
  of one node is probed together with a known-good partner (pairing), since a single
  node cannot exercise the fabric. One bad node among n takes ⌈log2 n⌉ rounds (one more
  when no known-good node is given and the bad node's half is the last to shrink).
- **both halves pass** while their union failed: the fault lies *between* them, a bad link
  (or a path through the fabric). The pair of groups is narrowed by crossing quarters:
  round one probes A1∪B1 and A2∪B2, and if neither fails round two probes A1∪B2 and
  A2∪B1; one that fails holds the link. This ends with a named link (two nodes that
  are each fine alone) and takes up to two rounds per halving.
- two bad nodes in different halves: both halves fail and each is bisected on its own,
  in the same rounds (the probes are disjoint), so the round count stays ⌈log2 n⌉.
- anything that cannot be told apart (no known-good node to pair with, a failure that
  does not reproduce) is reported as *unresolved*, with the nodes it concerns: never
  guessed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def rounds_bound(nodes: int) -> int:
    """⌈log2 n⌉ + 2: the most rounds one bad node among ``n`` may take."""
    return math.ceil(math.log2(max(nodes, 2))) + 2


@dataclass(frozen=True, slots=True)
class Probe:
    """One all-reduce of a round: ``nodes`` (suspects plus known-good padding)."""

    id: str
    nodes: tuple[str, ...]
    suspects: tuple[str, ...]


@dataclass(slots=True)
class _Item:
    """Work left: a ``group`` known to hold a fault, or a ``cross`` (a fault between
    ``a`` and ``b``, each fine alone) at ``phase`` 0 or 1."""

    kind: str  # "group" | "cross"
    a: list[str]
    b: list[str] = field(default_factory=list)
    phase: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "a": self.a, "b": self.b, "phase": self.phase}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> _Item:
        return cls(str(raw["kind"]), list(raw["a"]), list(raw.get("b", [])), int(raw["phase"]))


@dataclass(frozen=True, slots=True)
class Report:
    bad_nodes: tuple[str, ...]
    bad_links: tuple[tuple[str, str], ...]
    unresolved: tuple[str, ...]  # what could not be told apart, in words
    good: tuple[str, ...]
    rounds: int

    def to_json(self) -> dict[str, Any]:
        return {
            "bad_nodes": list(self.bad_nodes),
            "bad_links": [list(link) for link in self.bad_links],
            "unresolved": list(self.unresolved),
            "good": list(self.good),
            "rounds": self.rounds,
        }


@dataclass(slots=True)
class Localiser:
    """The search's whole state; ``to_json``/``from_json`` so a restart resumes it."""

    items: list[_Item]
    good: list[str]
    bad_nodes: list[str] = field(default_factory=list)
    bad_links: list[tuple[str, str]] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    rounds: int = 0
    # The round being run: probe id → (item index, role), and the probes themselves.
    pending: dict[str, list[Any]] = field(default_factory=dict)
    probes: list[Probe] = field(default_factory=list)

    @classmethod
    def start(cls, suspects: Sequence[str], *, known_good: Sequence[str] = ()) -> Localiser:
        """A search over ``suspects``, a set whose all-reduce failed. ``known_good``: nodes
        that passed before, to pair single suspects with."""
        nodes = list(dict.fromkeys(suspects))
        good = [n for n in dict.fromkeys(known_good) if n not in nodes]
        if not nodes:
            raise ValueError("nothing to localise: no suspects")
        # One suspect is probed with a partner; more are split in halves.
        return cls(items=[_Item("group", nodes)], good=good)

    @property
    def done(self) -> bool:
        return not self.items and not self.pending

    def plan_round(self) -> list[Probe]:
        """The next round's probes (disjoint node sets); empty when done. Items that need a
        known-good partner none is free for wait a round; when no probe at all can be
        planned, what is left is unresolved."""
        if self.pending:
            return list(self.probes)
        # Partners: known good and not under test (a node at one end of a suspect link
        # is fine alone, but no partner for anyone).
        busy = {n for item in self.items for n in (*item.a, *item.b)}
        free = [g for g in self.good if g not in busy]
        probes: list[Probe] = []
        pending: dict[str, list[Any]] = {}
        waiting: list[_Item] = []
        for index, item in enumerate(self.items):
            planned = self._plan_item(item, free)
            if planned is None:
                waiting.append(item)
                continue
            for role, probe in planned:
                probe = Probe(
                    id=f"r{self.rounds + 1}-p{len(probes)}",
                    nodes=probe.nodes,
                    suspects=probe.suspects,
                )
                probes.append(probe)
                pending[probe.id] = [index, role]
        if not probes:
            for item in waiting:
                self._give_up(item)
            self.items = []
            return []
        self.pending = pending
        self.probes = probes
        return probes

    def _plan_item(self, item: _Item, free: list[str]) -> list[tuple[str, Probe]] | None:
        if item.kind == "group":
            if len(item.a) == 1:
                if not free:
                    return None
                partner = free.pop(0)
                return [("single", Probe("", (item.a[0], partner), (item.a[0],)))]
            h1, h2 = _halves(item.a)
            out: list[tuple[str, Probe]] = []
            needed = sum(1 for h in (h1, h2) if len(h) == 1)
            if needed > len(free):
                return None
            for role, half in (("h1", h1), ("h2", h2)):
                nodes = tuple(half) if len(half) > 1 else (half[0], free.pop(0))
                out.append((role, Probe("", nodes, tuple(half))))
            return out
        out = []
        for n, (x, y) in enumerate(_cross_pairs(item)):
            if x and y:
                union = tuple(x + y)
                out.append((f"x{n}", Probe("", union, union)))
        return out

    def record(self, failed: dict[str, bool]) -> None:
        """The outcome of every probe of the round (probe id → it failed)."""
        missing = set(self.pending) - set(failed)
        if missing:
            raise ValueError(f"no outcome for probes {sorted(missing)}")
        self.rounds += 1
        by_item: dict[int, dict[str, bool]] = {}
        for probe_id, (index, role) in self.pending.items():
            by_item.setdefault(int(index), {})[str(role)] = failed[probe_id]
        probes = {p.id: p for p in self.probes}
        for probe_id in self.pending:
            if not failed[probe_id]:
                for node in probes[probe_id].suspects:
                    if node not in self.good:
                        self.good.append(node)
        new_items: list[_Item] = []
        for index, item in enumerate(self.items):
            outcome = by_item.get(index)
            if outcome is None:
                new_items.append(item)  # waited for a partner this round
                continue
            new_items.extend(self._advance(item, outcome))
        self.items = new_items
        self.pending = {}
        self.probes = []

    def _advance(self, item: _Item, outcome: dict[str, bool]) -> list[_Item]:
        if item.kind == "group" and "single" in outcome:
            if outcome["single"]:
                self.bad_nodes.append(item.a[0])
            else:
                self.unresolved.append(
                    f"{item.a[0]}: failed with others but passes with a known-good node "
                    "(a link, or a failure that did not reproduce)"
                )
            return []
        if item.kind == "group":
            h1, h2 = _halves(item.a)
            f1, f2 = outcome["h1"], outcome["h2"]
            out: list[_Item] = []
            for half, bad in ((h1, f1), (h2, f2)):
                if bad and len(half) == 1:
                    self.bad_nodes.append(half[0])
                elif bad:
                    out.append(_Item("group", half))
            if not f1 and not f2:
                out.append(_Item("cross", h1, h2))
            return out
        out = []
        for n, (x, y) in enumerate(_cross_pairs(item)):
            if outcome.get(f"x{n}"):
                out.extend(self._cross(x, y))
        if out:
            return out
        if item.phase == 0 and any(x and y for x, y in _cross_pairs(item, phase=1)):
            return [_Item("cross", item.a, item.b, phase=1)]
        self.unresolved.append(
            f"between {_short(item.a)} and {_short(item.b)}: their union failed, but no pair "
            "of their parts failed again (not reproduced)"
        )
        return []

    def _cross(self, a: list[str], b: list[str]) -> list[_Item]:
        if len(a) == 1 and len(b) == 1:
            self.bad_links.append((a[0], b[0]))
            return []
        return [_Item("cross", a, b)]

    def _give_up(self, item: _Item) -> None:
        if item.kind == "group":
            self.unresolved.append(
                f"{_short(item.a)}: a fault among these, and no known-good node left to pair "
                "them with (each may be bad, or the link between them)"
            )
        else:
            self.unresolved.append(f"between {_short(item.a)} and {_short(item.b)}")

    def report(self) -> Report:
        return Report(
            bad_nodes=tuple(self.bad_nodes),
            bad_links=tuple(self.bad_links),
            unresolved=tuple(self.unresolved),
            good=tuple(n for n in self.good if n not in self.bad_nodes),
            rounds=self.rounds,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "items": [i.to_json() for i in self.items],
            "good": list(self.good),
            "bad_nodes": list(self.bad_nodes),
            "bad_links": [list(link) for link in self.bad_links],
            "unresolved": list(self.unresolved),
            "rounds": self.rounds,
            "pending": {k: list(v) for k, v in self.pending.items()},
            "probes": [
                {"id": p.id, "nodes": list(p.nodes), "suspects": list(p.suspects)}
                for p in self.probes
            ],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Localiser:
        return cls(
            items=[_Item.from_json(i) for i in raw["items"]],
            good=list(raw["good"]),
            bad_nodes=list(raw["bad_nodes"]),
            bad_links=[(str(a), str(b)) for a, b in raw["bad_links"]],
            unresolved=list(raw["unresolved"]),
            rounds=int(raw["rounds"]),
            pending={str(k): list(v) for k, v in raw["pending"].items()},
            probes=[
                Probe(str(p["id"]), tuple(p["nodes"]), tuple(p["suspects"])) for p in raw["probes"]
            ],
        )


def _cross_pairs(item: _Item, phase: int | None = None) -> list[tuple[list[str], list[str]]]:
    """The two crossings of a ``cross`` item's quarters probed at ``phase``: A1∪B1 and
    A2∪B2 first, then A1∪B2 and A2∪B1 (a side of one node is not split)."""
    a1, a2 = _halves(item.a) if len(item.a) > 1 else (item.a, [])
    b1, b2 = _halves(item.b) if len(item.b) > 1 else (item.b, [])
    at = item.phase if phase is None else phase
    return [(a1, b1), (a2, b2)] if at == 0 else [(a1, b2), (a2, b1)]


def _halves(nodes: list[str]) -> tuple[list[str], list[str]]:
    mid = (len(nodes) + 1) // 2
    return nodes[:mid], nodes[mid:]


def _short(nodes: Sequence[str]) -> str:
    shown = ", ".join(nodes[:4])
    return shown + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")
