"""Force one label matcher into every selector of a PromQL expression.

What prom-label-proxy does with Prometheus's own parser, done here with a lexer that
follows Prometheus's (``promql/parser/lex.go``) closely enough to find every vector and
matrix selector: a metric name (``up``), a matcher list (``{job="x"}``) or both. The
matcher ``name="value"`` is *added* to each one and never replaces anything, so a user's
own ``project="other"`` or ``project=~".+"`` is ANDed with it and matches nothing of
another project. No selector can name series without being one of those forms, and
functions, operators, ``by (...)`` label lists, offsets, ``@`` and subquery ranges
select nothing.

Where the lexer could disagree with Prometheus (a character it does not know, an
unterminated string, a quoted metric name of Prometheus 3, a label list it cannot
read), the query is refused with ``InvalidInput`` naming why: refusing is safe, a
selector left alone is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpufleet.core.errors import InvalidInput

# Prometheus's keywords (lex.go ``key``) and aggregation operators: never a selector.
KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "atan2",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "sum",
        "avg",
        "count",
        "min",
        "max",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "count_values",
        "quantile",
        "limitk",
        "limit_ratio",
        "start",
        "end",
    }
)
# Followed by a parenthesised list of label names, not expressions.
LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
MAX_QUERY_CHARS = 64 * 1024

_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# Numbers and durations: 1, 1.5, .5, 0x1f, 1e5, 5m, 1h30m (anything alphanumeric after).
_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[a-zA-Z0-9_.]*")
_OPERATORS = ("==", "!=", "<=", ">=", "=~", "!~", "+", "-", "*", "/", "%", "^", "<", ">", "=")
_PUNCT = "(){}[],:@"


@dataclass(frozen=True)
class Token:
    kind: str  # ident, number, string, op, punct
    text: str
    start: int
    end: int


def tokenize(query: str) -> list[Token]:
    """The tokens of ``query`` (comments and whitespace dropped); ``InvalidInput`` on
    anything Prometheus's lexer would read differently."""
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidInput(f"query longer than {MAX_QUERY_CHARS} characters", field="query")
    tokens: list[Token] = []
    i, n = 0, len(query)
    in_brackets = False  # as lex.go's bracketOpen: there ':' is a colon, not a name
    while i < n:
        ch = query[i]
        if ch in " \t\r\n":
            i += 1
        elif ch == "#":  # a comment runs to the end of the line
            newline = query.find("\n", i)
            i = n if newline < 0 else newline + 1
        elif ch in "\"'`":
            end = _string_end(query, i)
            tokens.append(Token("string", query[i:end], i, end))
            i = end
        elif ch.isdigit() or (ch == "." and i + 1 < n and query[i + 1].isdigit()):
            match = _NUMBER.match(query, i)
            assert match is not None
            tokens.append(Token("number", match.group(), i, match.end()))
            i = match.end()
        elif ch == ":" and in_brackets:
            tokens.append(Token("punct", ch, i, i + 1))
            i += 1
        elif _IDENT.match(query, i):
            match = _IDENT.match(query, i)
            assert match is not None
            word = match.group()
            kind = "number" if word.lower() in ("inf", "nan") else "ident"
            tokens.append(Token(kind, word, i, match.end()))
            i = match.end()
        elif ch in _PUNCT:
            in_brackets = {"[": True, "]": False}.get(ch, in_brackets)
            tokens.append(Token("punct", ch, i, i + 1))
            i += 1
        else:
            op = next((o for o in _OPERATORS if query.startswith(o, i)), None)
            if op is None:
                raise InvalidInput(
                    f"query: character {ch!r} at {i} is not PromQL the proxy can check",
                    field="query",
                )
            tokens.append(Token("op", op, i, i + len(op)))
            i += len(op)
    return tokens


def _string_end(query: str, start: int) -> int:
    quote = query[start]
    i = start + 1
    while i < len(query):
        ch = query[i]
        if quote != "`" and ch == "\\":
            i += 2
            continue
        if quote != "`" and ch == "\n":
            break  # Prometheus: unterminated quoted string
        if ch == quote:
            return i + 1
        i += 1
    raise InvalidInput(f"query: unterminated string at {start}", field="query")


def enforce_label(query: str, *, name: str, value: str) -> str:
    """``query`` with ``name="value"`` added to every selector.

    Raises ``InvalidInput`` (naming why) for what the lexer cannot check: the caller
    answers 400 and forwards nothing.
    """
    if not _IDENT.fullmatch(name) or ":" in name:
        raise ValueError(f"not a label name: {name!r}")
    matcher = f"{name}={_quote(value)}"
    tokens = tokenize(query)
    if not tokens:
        raise InvalidInput("query is empty", field="query")
    inserts: list[tuple[int, str]] = []
    i = 0
    depth = 0  # parentheses, to check they balance as Prometheus would
    while i < len(tokens):
        tok = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if tok.kind == "punct" and tok.text == "{":
            close = _matchers_end(tokens, i)
            inserts.append(_insert_into(tokens, i, close, matcher))
            i = close + 1
        elif tok.kind == "ident" and tok.text.lower() in LABEL_LIST_KEYWORDS:
            i = _skip_label_list(tokens, i + 1)
        elif tok.kind == "ident" and tok.text.lower() in KEYWORDS:
            i += 1
        elif tok.kind == "ident":
            if nxt is not None and nxt.kind == "punct" and nxt.text == "(":
                i += 1  # a function call
            elif nxt is not None and nxt.kind == "punct" and nxt.text == "{":
                close = _matchers_end(tokens, i + 1)
                inserts.append(_insert_into(tokens, i + 1, close, matcher))
                i = close + 1
            else:
                inserts.append((tok.end, "{" + matcher + "}"))
                i += 1
        elif tok.kind == "punct" and tok.text == "[":
            i = _skip_range(tokens, i)
        else:
            if tok.kind == "punct" and tok.text == "(":
                depth += 1
            elif tok.kind == "punct" and tok.text == ")":
                depth -= 1
                if depth < 0:
                    raise InvalidInput(f"query: unbalanced ')' at {tok.start}", field="query")
            elif tok.kind == "punct" and tok.text == "}":
                raise InvalidInput(f"query: unexpected '}}' at {tok.start}", field="query")
            i += 1
    if depth != 0:
        raise InvalidInput("query: unbalanced parentheses", field="query")
    out = query
    for at, text in sorted(inserts, reverse=True):
        out = out[:at] + text + out[at:]
    return out


def _quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _matchers_end(tokens: list[Token], open_at: int) -> int:
    """Index of the ``}`` closing the matcher list opened at ``open_at``; checks each
    matcher is ``label op "string"`` so nothing else hides inside."""
    i = open_at + 1
    while True:
        if i >= len(tokens):
            raise InvalidInput("query: unclosed '{'", field="query")
        tok = tokens[i]
        if tok.kind == "punct" and tok.text == "}":
            return i
        label = tok
        op = tokens[i + 1] if i + 1 < len(tokens) else None
        val = tokens[i + 2] if i + 2 < len(tokens) else None
        if label.kind not in ("ident", "string", "number") or label.kind == "number":
            raise InvalidInput(
                f"query: expected a label name at {label.start}, got {label.text!r}", field="query"
            )
        if op is None or op.kind != "op" or op.text not in ("=", "!=", "=~", "!~"):
            raise InvalidInput(
                f"query: a bare name in braces at {label.start} is not supported; write "
                'label="value" matchers',
                field="query",
            )
        if val is None or val.kind != "string":
            raise InvalidInput(f"query: expected a quoted value at {op.end}", field="query")
        i += 3
        sep = tokens[i] if i < len(tokens) else None
        if sep is not None and sep.kind == "punct" and sep.text == ",":
            i += 1
        elif not (sep is not None and sep.kind == "punct" and sep.text == "}"):
            raise InvalidInput(f"query: expected ',' or '}}' at {val.end}", field="query")


def _insert_into(tokens: list[Token], open_at: int, close_at: int, matcher: str) -> tuple[int, str]:
    empty = close_at == open_at + 1
    trailing_comma = tokens[close_at - 1].kind == "punct" and tokens[close_at - 1].text == ","
    prefix = "" if empty or trailing_comma else ","
    return (tokens[close_at].start, prefix + matcher)


def _skip_label_list(tokens: list[Token], at: int) -> int:
    """After by/without/on/ignoring/group_*: an optional ``(name, ...)``."""
    if at >= len(tokens) or tokens[at].text != "(" or tokens[at].kind != "punct":
        return at
    i = at + 1
    while i < len(tokens):
        tok = tokens[i]
        if tok.kind == "punct" and tok.text == ")":
            return i + 1
        if tok.kind not in ("ident", "string") and not (tok.kind == "punct" and tok.text == ","):
            raise InvalidInput(
                f"query: expected label names in the list at {tokens[at].start}", field="query"
            )
        i += 1
    raise InvalidInput("query: unclosed label list", field="query")


def _skip_range(tokens: list[Token], at: int) -> int:
    """A range or subquery ``[5m]``, ``[1h:1m]``: durations only, nothing to select."""
    i = at + 1
    while i < len(tokens):
        tok = tokens[i]
        if tok.kind == "punct" and tok.text == "]":
            return i + 1
        if tok.kind not in ("number",) and tok.text not in (":", "+", "-"):
            raise InvalidInput(
                f"query: only durations may stand in [...] (at {tok.start})", field="query"
            )
        i += 1
    raise InvalidInput("query: unclosed '['", field="query")
