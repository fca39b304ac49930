"""Kernel-log matching: catalog rules compiled once, lines checked cheaply.

Speed comes from not looking at most lines. Every kernel-log rule names literals one of
which a matching line must contain ("NVRM", "SXid", ...). ``KernelLogMatcher.feed_bytes``
finds those literals over whole chunks (:func:`find_candidates`, with the engine of
:mod:`gpufleet.core.signatures.prefilter`: Hyperscan, or ``bytes.find`` passes without
it). With Hyperscan, :func:`select_lines` then keeps only the candidate lines that hold
a *required literal* of some regex (:mod:`gpufleet.core.signatures.factors`: ``NVRM:
Xid``, ``SXid (``, ...), which is most of the speed-up: a driver banner holds ``NVRM``
but fires nothing. The lines kept are decoded, stripped of their prefix and given to
the regexes, which decide and capture (a regex is tried only on a message that holds
one of its required literals: an ``in`` check costs less than a search that fails);
rules that share a pattern (all Xids, all SXids) run that regex once per line and
dispatch on the captured code.

Multi-line messages (fallen off the bus at probe, API mismatch) open a window at their
``start`` line; the next candidate lines (lines that pass the prefilter) are joined to
it until the full pattern matches or the window runs out. Lines without any prefilter
literal never join a window: they are not looked at at all. The Hyperscan stage gives
Python the ``max_lines - 1`` candidate lines after any line that may open a window, so
windows see exactly what they would without it.
"""

from __future__ import annotations

import bisect
import datetime as dt
import functools
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpufleet.core.enums import RepairAction, Severity
from gpufleet.core.kernel_log import Split, split_line
from gpufleet.core.signatures.factors import required_literals
from gpufleet.core.signatures.kernel_rules import KernelRuleSpec, packaged_rules, rules_of
from gpufleet.core.signatures.prefilter import (
    Buffer,
    Engine,
    HitFinder,
    LineFinder,
    make_line_finder,
    newlines_before,
    uses_hyperscan,
)

if TYPE_CHECKING:  # the catalog's models import pydantic: not needed to match
    from gpufleet.core.signatures.models import Catalog

# Identity, not a signature: the driver prints it before most Xids.
_UUID_LINE = re.compile(r"NVRM: GPU at PCI:([0-9a-fA-F:.]+): (GPU-[0-9a-fA-F-]{36})")


@dataclass(slots=True)
class Match:
    """One kernel-log line (or joined multi-line message) that fired a signature.

    Not frozen, though nothing changes one: a frozen dataclass sets each of its 18
    fields through ``object.__setattr__`` (2 µs a match, a seventh of a scan's work per
    line on a log full of Xids); this one is built in a third of a microsecond.
    """

    signature: str
    title: str
    severity: Severity
    action: RepairAction
    xid: int | None
    sxid: int | None
    pci: str | None  # normalised: "0000:3b:00.0"
    gpu_index: int | None
    gpu_uuid: str | None
    line: str  # raw, as read; lines of a multi-line message joined with "\n"
    message: str  # without the timestamp/syslog prefix
    line_number: int | None = None
    timestamp: dt.datetime | None = None
    uptime_s: float | None = None
    host: str | None = None
    # The kernel device that printed the line (``nvidia-nvswitch3``) and the link it names:
    # an SXid's switch and port, the switch still known when its PCI address is redacted.
    device: str | None = None
    link: int | None = None


@functools.lru_cache(maxsize=4096)  # a node has a few dozen addresses; lines repeat them
def normalize_pci(raw: str | None) -> str | None:
    """``PCI:0000:3B:00`` / ``3b:00.0`` / ``00000000:86:00.0`` → ``0000:3b:00.0``.

    Xid lines print domain:bus:device without a function; the function defaults to 0 so
    the same GPU gets the same address from every line and from NVML.
    """
    if not raw:
        return None
    text = raw.strip().lower().removeprefix("pci:").rstrip(":.")
    head, _, function = text.partition(".")
    parts = head.split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        return None
    try:
        domain, bus, device = (int(p, 16) for p in parts)
        fn = int(function or "0", 16)
    except ValueError:
        return None
    return f"{domain:04x}:{bus:02x}:{device:02x}.{fn:x}"


@dataclass(frozen=True, slots=True)
class _Rule:
    sig: KernelRuleSpec
    contains: tuple[str, ...]
    excludes: tuple[str, ...]
    overrides: tuple[tuple[re.Pattern[str], Severity | None, RepairAction | None], ...]

    def accepts(self, message: str) -> bool:
        if not self.contains and not self.excludes:  # most rules; skips two generators
            return True
        return all(c in message for c in self.contains) and not any(
            e in message for e in self.excludes
        )

    def verdict(self, message: str) -> tuple[Severity, RepairAction]:
        for pattern, severity, action in self.overrides:
            if pattern.search(message):
                return severity or self.sig.severity, action or self.sig.action
        return self.sig.severity, self.sig.action


@dataclass(slots=True, eq=False)  # identity: ``in`` must not compare whole signatures
class _Group:
    """Rules that share one regex: run it once, then dispatch on the code it captured."""

    regex: re.Pattern[str]
    code_group: str | None
    by_code: dict[int, list[_Rule]] = field(default_factory=dict)
    fallbacks: list[_Rule] = field(default_factory=list)
    plain: list[_Rule] = field(default_factory=list)
    need: _Need | None = None  # set once every rule is in

    def pick(self, m: re.Match[str], message: str) -> _Rule | None:
        if self.code_group is not None and (self.by_code or self.fallbacks):
            code = int(str(m[self.code_group]))
            for rules in (self.by_code.get(code, ()), self.fallbacks):
                for rule in rules:
                    if rule.accepts(message):
                        return rule
        for rule in self.plain:
            if rule.accepts(message):
                return rule
        return None


@dataclass(slots=True, eq=False)  # identity, as _Group
class _MultiRule:
    rule: _Rule
    start: re.Pattern[str]
    full: re.Pattern[str]
    max_lines: int
    need: _Need | None = None


@dataclass(frozen=True, slots=True)
class _Need:
    """Literals one of which a line must hold for a target's regex (or ``start``) to
    match it (:func:`~gpufleet.core.signatures.factors.required_literals`), for the
    Hyperscan stage, and before each regex search. ``caseless`` ones match in any ASCII
    case (lowercased here)."""

    exact: tuple[str, ...]
    caseless: tuple[str, ...]

    def held_by(self, message: str) -> bool:
        """Whether ``message`` holds one of the literals (else the regex cannot match).

        Cheaper than a search that fails: an ``NVRM`` line is tried with six patterns,
        and holds the literal of one or two."""
        for lit in self.exact:
            if lit in message:
                return True
        if self.caseless:
            low = message.lower()
            return any(lit in low for lit in self.caseless)
        return False


def _need_of(pattern: str, avoid: tuple[str, ...]) -> _Need | None:
    factor = required_literals(pattern, avoid=avoid)
    if factor is None:
        return None
    return _Need(
        tuple(lit.text for lit in factor if not lit.caseless),
        tuple(lit.text.lower() for lit in factor if lit.caseless),
    )


_UUID = "uuid"  # a stage literal of the PCI → UUID line
_ESCAPED = "escaped"  # the stage literal of a kmsg escape


@dataclass(frozen=True, slots=True)
class _Fast:
    """What :meth:`_Program.fast_path` tells of a line: the targets to try, each with
    the prefilter token it needs in the line, and whether it may name a GPU's UUID."""

    targets: tuple[tuple[_Group | _MultiRule, str], ...]
    uuid: bool


# What the matcher's loop reads for a mask fast_path has not been asked about yet.
_UNSEEN = _Fast((), uuid=False)


@dataclass(slots=True)
class _Pending:
    multi: _MultiRule
    raws: list[str]
    messages: list[str]
    line_number: int | None
    remaining: int


class _Program:
    """The catalog's kernel-log rules, compiled; immutable and shared by matchers."""

    def __init__(self, rules: tuple[KernelRuleSpec, ...], engine: Engine = "auto") -> None:
        groups: dict[str, _Group] = {}
        self.by_token: dict[str, list[_Group | _MultiRule]] = {}
        for rule in rules:
            compiled = _Rule(
                sig=rule,
                contains=rule.contains,
                excludes=rule.excludes,
                overrides=tuple((re.compile(p), sev, act) for p, sev, act in rule.overrides),
            )
            pattern = rule.pattern
            target: _Group | _MultiRule
            if rule.multiline_start is not None:
                target = _MultiRule(
                    compiled,
                    re.compile(rule.multiline_start),
                    re.compile(pattern, re.S),
                    rule.multiline_max_lines,
                )
            else:
                group = groups.get(pattern)
                if group is None:
                    regex = re.compile(pattern)
                    code = next((g for g in ("xid", "sxid") if g in regex.groupindex), None)
                    group = groups[pattern] = _Group(regex, code)
                if rule.codes:
                    for c in rule.codes:
                        group.by_code.setdefault(c, []).append(compiled)
                elif rule.fallback:
                    group.fallbacks.append(compiled)
                else:
                    group.plain.append(compiled)
                target = group
            for token in rule.prefilter:
                targets = self.by_token.setdefault(token, [])
                if target not in targets:
                    targets.append(target)
        self.tokens: tuple[str, ...] = tuple(self.by_token)
        for ts in self.by_token.values():
            for t in ts:
                if t.need is None:  # a target shared by tokens is seen again
                    t.need = _need_of(
                        t.regex.pattern if isinstance(t, _Group) else t.start.pattern,
                        self.tokens,
                    )
        self.btokens: tuple[bytes, ...] = tuple(t.encode() for t in self.tokens)
        if any(b"\n" in t or not t for t in self.btokens):
            raise ValueError("kernel-log prefilter literals must be non-empty, one line")
        self.finder: LineFinder = make_line_finder(self.btokens, engine)
        multis = [t for ts in self.by_token.values() for t in ts if isinstance(t, _MultiRule)]
        # Candidate lines a window opened on one line may join: fed after every line
        # that may open one (the matcher stage does not know the window state).
        self.window_span = max((m.max_lines - 1 for m in multis), default=0)
        self.hits: HitFinder | None = None
        # Per literal of the stage, what holding it tells (see :meth:`fast_path`).
        self._owners: tuple[tuple[_Group | _MultiRule | str, ...], ...] = ()
        # fast_path's answers by mask (read directly by the matcher's loop).
        self.fast_paths: dict[int, _Fast | None] = {}
        # Each target under one token: the order targets() gives is then one fixed order
        # filtered, which the fast path keeps (with a target under two tokens, the order
        # depends on which the line holds: every line takes the general path).
        order: dict[int, tuple[int, str]] = {}
        shared = False
        for token, ts in self.by_token.items():
            for t in ts:
                shared = shared or id(t) in order
                order.setdefault(id(t), (len(order), token))
        self._order = {} if shared else order
        if uses_hyperscan(engine):
            literals, first_marked, self._owners = self._hit_literals()
            self.hits = HitFinder(literals, first_marked=first_marked)

    def _hit_literals(
        self,
    ) -> tuple[
        tuple[tuple[bytes, bool], ...], int, tuple[tuple[_Group | _MultiRule | str, ...], ...]
    ]:
        """The matcher stage's literals: for each regex a line is tried with, the
        literals one of which its match holds (:class:`_Need`; the target's prefilter
        tokens where there are none). Those of window ``start`` patterns come last: they
        are marked. Also, per literal, the targets whose literal it is (``_UUID`` for the
        PCI → UUID line, ``_ESCAPED`` for the kmsg escape)."""
        plain: dict[tuple[bytes, bool], None] = {}
        marked: dict[tuple[bytes, bool], None] = {}
        owners: dict[tuple[bytes, bool], list[_Group | _MultiRule | str]] = {}
        seen: set[int] = set()
        uuid_need = _need_of(_UUID_LINE.pattern, self.tokens)
        entries: list[tuple[_Need | None, list[str], bool, _Group | _MultiRule | str]] = [
            (uuid_need, ["NVRM"], False, _UUID)
        ]
        for ts in self.by_token.values():
            for t in ts:
                if id(t) not in seen:
                    seen.add(id(t))
                    tokens = [k for k, v in self.by_token.items() if t in v]
                    entries.append((t.need, tokens, isinstance(t, _MultiRule), t))
        for need, tokens, is_start, owner in entries:
            found = (
                [(lit.encode(), False) for lit in need.exact]
                + [(lit.encode(), True) for lit in need.caseless]
                if need is not None
                else [(t.encode(), False) for t in tokens]
            )
            for lit in found:
                (marked if is_start else plain)[lit] = None
                owners.setdefault(lit, []).append(owner)
        # /dev/kmsg escapes (``\x0a``) are undone before the regexes run: a line holding
        # one may match although no literal is in its raw bytes.
        marked[(b"\\x", False)] = None
        owners.setdefault((b"\\x", False), []).append(_ESCAPED)
        for lit in marked:
            plain.pop(lit, None)
        literals = (*plain, *marked)
        return literals, len(plain), tuple(tuple(owners[lit]) for lit in literals)

    def fast_path(self, mask: int) -> _Fast | None:
        """For a line whose stage literals are the bits of ``mask``: the targets to try
        (each with the token it needs in the line), and whether it may be a PCI → UUID
        line. ``None``: the line takes the general path (:meth:`KernelLogMatcher.feed`).

        A target none of whose literals the line holds cannot match it (its regex needs
        one; the general path's ``held_by`` says the same of the message, a part of the
        line), so only the targets of the literals held are tried, in the order
        :meth:`targets` gives; no other check is needed. A line holding a kmsg escape,
        or no literal at all (a line a window may join), takes the general path.
        """
        if mask in self.fast_paths:
            return self.fast_paths[mask]
        entry: _Fast | None = None
        if self._order and mask:
            seen: set[int] = set()
            chosen: list[tuple[int, _Group | _MultiRule]] = []
            uuid = escaped = False
            for k, held in enumerate(self._owners):
                if not mask >> k & 1:
                    continue
                for owner in held:
                    if owner == _ESCAPED:
                        escaped = True
                    elif owner == _UUID:
                        uuid = True
                    elif not isinstance(owner, str) and id(owner) not in seen:
                        seen.add(id(owner))
                        chosen.append((self._order[id(owner)][0], owner))
            if not escaped:
                chosen.sort(key=lambda c: c[0])
                entry = _Fast(tuple((t, self._order[id(t)][1]) for _, t in chosen), uuid=uuid)
        self.fast_paths[mask] = entry
        return entry

    def targets(self, line: str) -> list[_Group | _MultiRule]:
        out: list[_Group | _MultiRule] = []
        for token in self.tokens:
            if token in line:
                for target in self.by_token[token]:
                    if target not in out:
                        out.append(target)
        return out


def find_candidates(
    buf: bytes, end: int | None = None, *, program: _Program | None = None
) -> tuple[list[tuple[int, bytes]], int]:
    """The lines of ``buf[:end]`` that hold a prefilter literal, and its newline count.

    ``end`` must be just past a newline (or 0); each candidate is (1-based line number
    within the chunk, line without its newline), in order.
    """
    prog = program if program is not None else _program(None)
    return _candidates(prog, buf, 0, len(buf) if end is None else end)


def _candidates(
    prog: _Program, buf: Buffer, begin: int, end: int
) -> tuple[list[tuple[int, bytes]], int]:
    """:func:`find_candidates` of ``buf[begin:end]``."""
    starts = prog.finder.line_starts(buf, end, begin)
    before, newlines = newlines_before(buf, end, starts, begin)
    find = buf.find
    lines = [(n + 1, buf[s : find(b"\n", s, end)]) for s, n in zip(starts, before, strict=True)]
    return lines, newlines


def select_lines(
    buf: bytes, end: int | None = None, *, program: _Program | None = None, spill: int = 0
) -> tuple[list[tuple[int, bytes]], int, int]:
    """The lines of ``buf[:end]`` the matcher must see, its newline count, and the spill.

    With the Hyperscan stage those are the lines holding a required literal of some
    regex (:meth:`_Program._hit_literals`), plus the ``window_span`` candidate lines
    after each line that may open a multi-line window, plus the first ``spill``
    candidate lines (a window opened in the chunk before); the spill returned is how
    many candidate lines of the next chunk still belong to a window. Any other line
    fires nothing and changes no state, so the matches are the same as feeding every
    candidate line. Without Hyperscan: all candidate lines (:func:`find_candidates`).
    """
    prog = program if program is not None else _program(None)
    end = len(buf) if end is None else end
    lines, newlines, spill_out = _select(prog, buf, 0, end, spill)
    return [(n, raw) for n, raw, _ in lines], newlines, spill_out


_PLUS_ONE = (1).__add__  # a line's length with its newline, in C

# A line the matcher must see: its number in the chunk (from 1), its bytes without the
# newline, and the bits of the stage literals it holds (0 without the stage).
_Line = tuple[int, bytes, int]


def _select(
    prog: _Program, buf: Buffer, begin: int, end: int, spill: int
) -> tuple[list[_Line], int, int]:
    """:func:`select_lines` of ``buf[begin:end]`` (``begin`` 0 or just past a newline),
    with each line's literal bits."""
    if prog.hits is None:
        candidates, newlines = _candidates(prog, buf, begin, end)
        return [(n, raw, 0) for n, raw in candidates], newlines, 0
    # Two passes: Hyperscan finds the candidate lines (few short tokens: its fast case),
    # then the required literals in just those lines, joined (a few % of the chunk).
    # One pass over the chunk for all the literals costs more than both.
    cands = prog.finder.line_starts(buf, end, begin)
    find = buf.find
    raws = [buf[s : find(b"\n", s, end)] for s in cands]
    joined = b"\n".join(raws) + b"\n" if raws else b""
    offsets = list(itertools.accumulate(map(_PLUS_ONE, map(len, raws)), initial=0))
    masks: dict[int, int] = {}
    span = prog.window_span
    first_marked = prog.hits.first_marked
    windows: list[int] = []  # the line after each line holding a marked literal
    bisect_right = bisect.bisect_right
    line = -1
    line_end = 0
    for to, lit in prog.hits.literal_hits(joined, len(joined)):
        if to > line_end:  # a literal holds no newline: it ends in the line of to - 1
            line = bisect_right(offsets, to - 1) - 1
            line_end = offsets[line + 1]
        masks[line] = masks.get(line, 0) | 1 << lit
        if lit >= first_marked and span:
            windows.append(line + 1)
    chosen = set(masks)
    spill_out = max(0, spill - len(raws))
    if span and (windows or spill):
        chosen.update(range(min(spill, len(raws))))
        for i in windows:
            chosen.update(range(i, min(i + span, len(raws))))
            spill_out = max(spill_out, i + span - len(raws))
    picked = sorted(chosen)
    before, newlines = newlines_before(buf, end, [cands[i] for i in picked], begin)
    get = masks.get
    lines = [(n + 1, raws[i], get(i, 0)) for i, n in zip(picked, before, strict=True)]
    return lines, newlines, spill_out


# Compiled programs by catalog identity and engine (0: the packaged catalog). The
# catalog is kept alongside so its id cannot be reused by another object while the
# entry exists (catalogs hold dicts: unhashable).
_programs: dict[tuple[int, Engine], tuple[Catalog | None, _Program]] = {}


def _program(catalog: Catalog | None, engine: Engine = "auto") -> _Program:
    key = (0 if catalog is None else id(catalog), engine)
    hit = _programs.get(key)
    if hit is None:
        rules = packaged_rules() if catalog is None else rules_of(catalog)
        hit = _programs[key] = (catalog, _Program(rules, engine))
    return hit[1]


class KernelLogMatcher:
    """Stateful matcher for one log stream (one node's kernel log, one saved dump).

    Feed it lines in order with :meth:`feed`, or raw chunks with :meth:`feed_bytes` (the
    fast path; chunks may split lines anywhere) and :meth:`finish` at the end. It keeps
    the open multi-line windows and the PCI → GPU UUID map the driver prints.

    ``gpu_indexes`` maps PCI addresses (any spelling) to GPU indexes; the agent knows
    it from NVML, and matches then carry ``gpu_index``. ``engine`` picks the prefilter
    (:mod:`gpufleet.core.signatures.prefilter`); every engine gives the same matches.
    """

    def __init__(
        self,
        catalog: Catalog | None = None,
        *,
        gpu_indexes: Mapping[str, int] | None = None,
        year: int | None = None,
        engine: Engine = "auto",
    ) -> None:
        self._program = _program(catalog, engine)
        self._year = year
        self._indexes = {
            p: i for raw, i in (gpu_indexes or {}).items() if (p := normalize_pci(raw))
        }
        self._uuids: dict[str, str] = {}
        self._pending: list[_Pending] = []
        self._tail = b""
        self._line_number = 0  # lines consumed by feed_bytes so far
        self._spill = 0  # candidate lines of the next chunk an open window may join

    def feed(self, line: str, *, line_number: int | None = None) -> list[Match]:
        """Match one line (with or without its newline)."""
        targets = self._program.targets(line)
        if not targets:
            return []
        parsed = split_line(line, self._year)
        message = parsed[0]
        out: list[Match] = []
        if self._pending:
            self._continue(line, message, out)
        self._note_uuid(message)
        for target in targets:
            need = target.need
            if need is not None and not need.held_by(message):
                continue  # neither its regex nor its window's start can match
            self._try(target, line, message, parsed, line_number, out)
        return out

    def _try(
        self,
        target: _Group | _MultiRule,
        line: str,
        message: str,
        parsed: Split,
        line_number: int | None,
        out: list[Match],
    ) -> None:
        if isinstance(target, _MultiRule):
            if not target.start.search(message):
                return
            if full := target.full.search(message):
                out.append(self._match(target.rule, full, message, line, parsed, line_number))
            else:
                self._pending.append(
                    _Pending(target, [line], [message], line_number, target.max_lines - 1)
                )
            return
        m = target.regex.search(message)
        if m is None:
            return
        rule = target.pick(m, message)
        if rule is not None:
            out.append(self._match(rule, m, message, line, parsed, line_number))

    def _note_uuid(self, message: str) -> None:
        if (
            "GPU at PCI:" in message
            and (u := _UUID_LINE.search(message))
            and (pci := normalize_pci(u[1]))
        ):
            self._uuids[pci] = u[2]

    def feed_bytes(self, data: bytes, *, emits: list[int] | None = None) -> list[Match]:
        """Match a chunk of a byte stream; a trailing partial line waits for the next.

        ``emits``, if given, gets the number of the line that completed each match (for
        a multi-line message the last line, where ``line_number`` is the first).
        """
        buf = self._tail + data if self._tail else data
        cut = buf.rfind(b"\n") + 1
        self._tail = buf[cut:]
        return self._scan(buf, cut, emits)

    def feed_lines(self, buf: bytes, end: int, *, emits: list[int] | None = None) -> list[Match]:
        """Match ``buf[:end]``, whole lines (``end`` just past a newline), without the copy
        :meth:`feed_bytes` makes to join a chunk to the partial line before it. Only when
        no partial line is pending (never after a :meth:`feed_bytes` chunk that ended
        mid-line)."""
        if self._tail:
            raise ValueError("a partial line is pending: use feed_bytes")
        return self._scan(buf, end, emits)

    def finish(self) -> list[Match]:
        """Match the last line of a stream that did not end with a newline."""
        buf, self._tail = self._tail, b""
        out = self._scan(buf + b"\n", len(buf) + 1) if buf else []
        self._pending.clear()
        self._spill = 0
        return out

    def feed_range(
        self, buf: Buffer, begin: int, end: int, *, emits: list[int] | None = None
    ) -> list[Match]:
        """Match ``buf[begin:end]``, whole lines (``begin`` and ``end`` 0 or just past a
        newline), read in place: ``buf`` may be an mmap of the file. As :meth:`feed_lines`,
        only when no partial line is pending."""
        if self._tail:
            raise ValueError("a partial line is pending: use feed_bytes")
        return self._scan(buf, end, emits, begin)

    def _scan(
        self, buf: Buffer, end: int, emits: list[int] | None = None, begin: int = 0
    ) -> list[Match]:
        lines, newlines, self._spill = _select(self._program, buf, begin, end, self._spill)
        out = self._feed_selected(lines, emits)
        self._line_number += newlines
        return out

    def _feed_selected(self, lines: list[_Line], emits: list[int] | None) -> list[Match]:
        """:meth:`feed_candidates` of the lines :func:`_select` picked: a line whose
        literal bits say which targets to try (:meth:`_Program.fast_path`) skips the
        token and literal checks of :meth:`feed`."""
        out: list[Match] = []
        base = self._line_number
        program = self._program
        cached = program.fast_paths
        year = self._year
        try_target = self._try
        for number, raw, mask in lines:
            line = raw.decode("utf-8", errors="replace")
            fast = cached.get(mask, _UNSEEN)
            if fast is _UNSEEN:
                fast = program.fast_path(mask)
            if fast is None or self._pending:
                found = self.feed(line, line_number=base + number)
                if found:
                    out.extend(found)
                    if emits is not None:
                        emits.extend([base + number] * len(found))
                continue
            parsed = split_line(line, year)
            if fast.uuid:
                self._note_uuid(parsed[0])
            had = len(out)
            for target, token in fast.targets:
                if token in line:
                    try_target(target, line, parsed[0], parsed, base + number, out)
            if emits is not None and len(out) > had:
                emits.extend([base + number] * (len(out) - had))
        return out

    def feed_candidates(
        self, lines: list[tuple[int, bytes]], *, emits: list[int] | None = None
    ) -> list[Match]:
        """Match candidate lines that :func:`find_candidates` picked from the stream.

        Line numbers are relative to the lines consumed so far; the caller advances the
        count with :meth:`skip_lines` by the chunk's newlines. ``emits`` as for
        :meth:`feed_bytes`.
        """
        out: list[Match] = []
        base = self._line_number
        for number, raw in lines:
            line = raw.decode("utf-8", errors="replace")
            found = self.feed(line, line_number=base + number)
            if found:
                out.extend(found)
                if emits is not None:
                    emits.extend([base + number] * len(found))
        return out

    @property
    def line_count(self) -> int:
        """Lines consumed by :meth:`feed_bytes` (and :meth:`skip_lines`) so far."""
        return self._line_number

    def windows_open(self) -> bool:
        """Whether a multi-line message is waiting for its next lines."""
        return bool(self._pending)

    def uuid_map(self) -> dict[str, str]:
        """The PCI address → GPU UUID map the driver's lines gave so far (a copy)."""
        return dict(self._uuids)

    def continue_windows(self, line: str) -> list[Match]:
        """Give ``line`` only to the open multi-line windows (and note a PCI → UUID line).

        For the lines after a part of a stream that another matcher reads in full
        (``gpufleet scan --jobs``): what :meth:`feed` would add to this matcher's own
        messages, without the line's own matches.
        """
        if not self._pending or not self._program.targets(line):
            return []
        message = split_line(line, self._year)[0]
        out: list[Match] = []
        self._continue(line, message, out)
        self._note_uuid(message)
        return out

    def skip_lines(self, count: int) -> None:
        """Advance the line count past ``count`` lines given to :meth:`feed_candidates`."""
        self._line_number += count

    def _continue(self, raw: str, message: str, out: list[Match]) -> None:
        still: list[_Pending] = []
        for p in self._pending:
            p.raws.append(raw)
            p.messages.append(message)
            joined = " ".join(p.messages)
            if full := p.multi.full.search(joined):
                parsed = split_line(p.raws[0], self._year)
                out.append(
                    self._match(
                        p.multi.rule, full, joined, "\n".join(p.raws), parsed, p.line_number
                    )
                )
            elif p.remaining > 1:
                p.remaining -= 1
                still.append(p)
        self._pending = still

    def _match(
        self,
        rule: _Rule,
        m: re.Match[str],
        message: str,
        raw: str,
        stamp: Split,
        line_number: int | None,
    ) -> Match:
        # One dict of the groups: a lookup of each name in the pattern, then in the
        # match, cost as much as the rest of the match together.
        got = m.groupdict()
        raw_pci = got.get("pci")
        pci = normalize_pci(raw_pci) if raw_pci else None
        severity, action = rule.verdict(message)
        xid = got.get("xid")
        sxid = got.get("sxid")
        link = got.get("link")
        sig = rule.sig
        return Match(  # positional: keywords cost a third of the call
            sig.id,
            sig.title,
            severity,
            action,
            None if xid is None else int(xid),
            None if sxid is None else int(sxid),
            pci,
            self._indexes.get(pci) if pci else None,
            self._uuids.get(pci) if pci else None,
            raw.rstrip("\r\n"),
            message,
            line_number,
            stamp[1],
            stamp[2],
            stamp[3],
            got.get("device"),
            None if link is None else int(link),
        )


def match_line(line: str, *, catalog: Catalog | None = None) -> list[Match]:
    """Match one line on its own (no multi-line state; a joined message still matches)."""
    return KernelLogMatcher(catalog).feed(line)
