"""The report's latency formatting picks its unit by the value as rounded (QA hunt:
report vs recording): a P95 of 0.9996 s read "1e+03 ms" in the text, HTML and comparison."""

from __future__ import annotations

import pytest

from llmtop.recording.report.fmt import secs


@pytest.mark.parametrize(("value", "shown"), [
    (0.0, "0 µs"),
    (0.000_999_4, "999 µs"),
    (0.000_999_6, "1 ms"),
    (0.0123, "12.3 ms"),
    (0.999_4, "999 ms"),
    (0.999_6, "1 s"),
    (0.999_999, "1 s"),
    (1.0, "1 s"),
    (12.34, "12.3 s"),
    (99.94, "99.9 s"),
    (99.96, "100 s"),
    (1234.5, "1234 s"),
])
def test_latency_unit_follows_the_rounded_value(value: float, shown: str) -> None:
    assert secs(value) == shown
    assert "e+" not in secs(value)
