"""Required literals of a regex: strings one of which every match must contain.

The Hyperscan stage of the matcher (:mod:`gpufleet.core.signatures.matcher`) searches a
chunk for these instead of the catalog's short prefilter tokens: ``NVRM: Xid`` instead of
``NVRM``, `` Link DOWN`` instead of ``mlx5``. A line without any of a pattern's required
literals cannot match it, so only the lines holding one reach Python, and the regex still
decides there. The answer is always safe: when no literal is found for a pattern, the
caller keeps the rule's prefilter tokens.

The pattern is read with the ``re`` module's own parser (``re._parser``, not a public
API but stable across 3.11-3.13; :func:`required_literals` returns ``None`` if it
changes shape), so what counts as a literal is exactly what ``re`` will match:

* only ASCII literals (a UTF-8 line decoded with ``errors="replace"`` turns no other
  byte into an ASCII character, so the literal is in the raw bytes whenever it is in the
  decoded message);
* under ``(?i)`` a literal matches either case, and never spans ``i``, ``k`` or ``s``:
  Unicode case folding lets those match ``ı``/``İ``, ``K`` (Kelvin) and ``ſ`` as well;
* a literal never spans anything that is not itself a literal (a class, a repeat, a
  group boundary), and optional parts (``?``, ``*``, ``{0,n}``) give none.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

# ``re``'s parser; typeshed has no stubs for the private modules.
_parser: Any = importlib.import_module("re._parser")
_c: Any = importlib.import_module("re._constants")

# ASCII letters that Unicode case folding matches with a non-ASCII letter under (?i).
_FOLDS_BEYOND_ASCII = frozenset("iIkKsS")
_MIN_LEN = 3


@dataclass(frozen=True, slots=True)
class Literal:
    text: str
    caseless: bool


# One alternative set: a match contains at least one of these literals.
Factor = tuple[Literal, ...]


def required_literals(pattern: str, *, avoid: tuple[str, ...] = ()) -> Factor | None:
    """The best set of literals one of which every match of ``pattern`` contains.

    "Best" is the set whose weakest literal is longest once the ``avoid`` strings it
    contains are discounted (the prefilter tokens, common on purpose: ``mlx5_core ``
    is worth less than `` Link DOWN``). ``None`` when there is none of at least three
    characters.
    """
    try:
        parsed = _parser.parse(pattern)
    except (re.error, AttributeError, TypeError):  # pragma: no cover - re's parser changed
        return None
    caseless = bool(parsed.state.flags & _c.SRE_FLAG_IGNORECASE)
    try:
        factors = _factors(list(parsed), caseless)
    except (AttributeError, TypeError, ValueError):  # pragma: no cover - re's parser changed
        return None
    best: Factor | None = None
    best_score = 0
    for factor in factors:
        score = min(_score(lit.text, avoid) for lit in factor)
        if score > best_score or (
            score == best_score and best is not None and len(factor) < len(best)
        ):
            best, best_score = factor, score
    return best if best is not None and best_score >= 1 else None


def _score(text: str, avoid: tuple[str, ...]) -> int:
    return len(text) - sum(len(a) for a in avoid if a in text)


def _factors(items: list[tuple[Any, Any]], caseless: bool) -> list[Factor]:
    """Alternative sets of required literals of a sequence of parsed items."""
    out: list[Factor] = []
    run: list[str] = []

    def flush() -> None:
        if len(run) >= _MIN_LEN:
            out.append((Literal("".join(run), caseless),))
        run.clear()

    for op, av in items:
        if op is _c.LITERAL and av < 128 and chr(av) != "\n":
            char = chr(av)
            if caseless and char in _FOLDS_BEYOND_ASCII:
                flush()
                continue
            run.append(char)
            continue
        flush()
        if op is _c.SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            inner = caseless
            if add_flags & _c.SRE_FLAG_IGNORECASE:
                inner = True
            if del_flags & _c.SRE_FLAG_IGNORECASE:
                inner = False
            out.extend(_factors(list(sub), inner))
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
            low, _high, sub = av
            if low >= 1:
                out.extend(_factors(list(sub), caseless))
        elif op is _c.BRANCH:
            _none, branches = av
            per_branch: list[Factor] = []
            for branch in branches:
                options = _factors(list(branch), caseless)
                if not options:
                    break  # a branch without a required literal: the group gives none
                per_branch.append(max(options, key=lambda f: min(len(x.text) for x in f)))
            else:
                out.append(tuple(lit for f in per_branch for lit in f))
        elif op is _c.ATOMIC_GROUP:
            out.extend(_factors(list(av), caseless))
        # Anything else (classes, anchors, lookarounds, backreferences) is no literal.
    flush()
    return out
