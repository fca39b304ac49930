from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.exposition import Exposition, format_value


def test_values_keep_every_digit() -> None:
    assert format_value(2**64 - 1) == "18446744073709551615"
    assert format_value(123456789.0) == "123456789"
    assert format_value(341.839) == "341.839"
    assert format_value(0.1 + 0.2) == "0.30000000000000004"
    assert format_value(math.nan) == "NaN"
    assert format_value(-math.inf) == "-Inf"
    assert format_value(1e300) == "1e+300"


def test_families_stay_together_and_labels_are_escaped() -> None:
    exp = Exposition(const_labels=(("hostname", "n-1"),))
    exp.add("a_total", "counter", "A\nthing \\ here.", (("x", "1"),), 1)
    exp.add("b", "gauge", "B.", (("path", 'C:\\a "b"\nc'),), 2.5)
    exp.add("a_total", "counter", "ignored", (("x", "2"), ("skip", None)), 3)
    exp.add("c", "gauge", "C.", (), 4)
    text = exp.text()
    assert text.index('a_total{x="2",hostname="n-1"} 3') < text.index("# HELP b ")
    assert "# HELP a_total A\\nthing \\\\ here." in text
    assert 'c{hostname="n-1"} 4' in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert [s.labels["path"] for s in families["b"].samples] == ['C:\\a "b"\nc']
    assert [s.value for s in families["a"].samples] == [1, 3]
