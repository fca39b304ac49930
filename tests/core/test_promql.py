"""The selector injector: every selector gets project="a", nothing else changes, and what
the lexer cannot check is refused (never passed on unchecked)."""

from __future__ import annotations

import pytest

from gpufleet.core.errors import InvalidInput
from gpufleet.core.promql import enforce_label

P = 'project="a"'


@pytest.mark.parametrize(
    ("query", "want"),
    [
        ("up", f"up{{{P}}}"),
        ("up{}", f"up{{{P}}}"),
        ('up{job="x"}', f'up{{job="x",{P}}}'),
        ('up{job="x",}', f'up{{job="x",{P}}}'),
        ('{__name__=~".+"}', f'{{__name__=~".+",{P}}}'),
        ("{}", f"{{{P}}}"),
        ('up{project="b"}', f'up{{project="b",{P}}}'),
        ('up{project=~".*"}', f'up{{project=~".*",{P}}}'),
        ('up{project!="a"}', f'up{{project!="a",{P}}}'),
        ("rate(x[5m])", f"rate(x{{{P}}}[5m])"),
        ("rate(x[5m:1m])", f"rate(x{{{P}}}[5m:1m])"),
        (
            "max_over_time(rate(x[1m])[1h:5m] offset 1d)",
            f"max_over_time(rate(x{{{P}}}[1m])[1h:5m] offset 1d)",
        ),
        ("job:rate:5m", f"job:rate:5m{{{P}}}"),
        ("sum by (project) (up)", f"sum by (project) (up{{{P}}})"),
        ("sum(up) without (node, gpu)", f"sum(up{{{P}}}) without (node, gpu)"),
        ("a / on(node) group_left(gpu) b", f"a{{{P}}} / on(node) group_left(gpu) b{{{P}}}"),
        ("a or b", f"a{{{P}}} or b{{{P}}}"),
        ('up unless {project="b"}', f'up{{{P}}} unless {{project="b",{P}}}'),
        ("a and bool b", f"a{{{P}}} and bool b{{{P}}}"),
        (
            'label_replace(up{project="b"}, "project", "a", "", "")',
            f'label_replace(up{{project="b",{P}}}, "project", "a", "", "")',
        ),
        ('count_values("v", up)', f'count_values("v", up{{{P}}})'),
        ("topk(5, up) @ end()", f"topk(5, up{{{P}}}) @ end()"),
        ("up @ 1700000000", f"up{{{P}}} @ 1700000000"),
        ("up offset -5m", f"up{{{P}}} offset -5m"),
        ("1 + Inf - NaN", "1 + Inf - NaN"),
        ('"just a string"', '"just a string"'),
        ('up # a comment {project="b"}\n', f'up{{{P}}} # a comment {{project="b"}}\n'),
        ('up{job="}{,"}', f'up{{job="}}{{,",{P}}}'),
        (r'up{job="a\"}b"}', rf'up{{job="a\"}}b",{P}}}'),
        ("up{job=`raw\\`}", f"up{{job=`raw\\`,{P}}}"),
        ("SUM BY (x) (up)", f"SUM BY (x) (up{{{P}}})"),
        ("absent(nonexistent)", f"absent(nonexistent{{{P}}})"),
        ("vector(1)", "vector(1)"),
    ],
)
def test_every_selector_gets_the_matcher(query: str, want: str) -> None:
    assert enforce_label(query, name="project", value="a") == want


def test_the_value_is_quoted() -> None:
    assert enforce_label("up", name="project", value='x"} or {a="') == (
        'up{project="x\\"} or {a=\\""}'
    )


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("", "empty"),
        ('up{job="x}', "unterminated"),
        ('up{job="a\nb"}', "unterminated"),
        ('{"up"}', "bare name"),
        ("up{job}", "bare name"),
        ("up{job=x}", "quoted value"),
        ('up{job="x" env="y"}', "',' or '}'"),
        ("up{", "unclosed"),
        ("up}", "unexpected"),
        ("(up", "unbalanced"),
        ("up)", "unbalanced"),
        ("rate(up[up])", "durations"),
        ("rate(up[5m)", "durations"),
        ('sum by (up{a="b"}) (x)', "label names"),
        ("up ; down", "character"),
        ("up.down", "character"),
        ("up" * 40_000, "longer"),
    ],
)
def test_what_cannot_be_checked_is_refused(query: str, why: str) -> None:
    with pytest.raises(InvalidInput, match=None) as raised:
        enforce_label(query, name="project", value="a")
    assert why in str(raised.value)
