"""QA: figures at a unit's edge are shown in the unit they round into.

A TTFT of 0.9996 s read "1000 ms", 999.6 µs "1000 µs", 9.996 ms "10.00 ms" (8 cells where
the column expects 7), 9.996 s "10.00 s"; a rate of 99.96 tok/s "100.0", a 9.996% share
"10.0%", 1023.9 bytes "1024 B", and a 0.4 µs gap "0 µs" (it took time). The unit (and the
number of decimals) is now chosen by the value as it will be shown."""

from __future__ import annotations

import pytest

from llmtop.tui import fmt


@pytest.mark.parametrize(("s", "shown"), [
    (0.9996, "1.00 s"),
    (0.9994, "999 ms"),
    (999.6e-6, "1.00 ms"),
    (999.4e-6, "999 µs"),
    (9.996e-3, "10.0 ms"),
    (99.96e-3, "100 ms"),
    (9.996, "10.0 s"),
    (4e-7, "<1 µs"),
    (1e-6, "1 µs"),
    (850e-6, "850 µs"),
    (12.34e-3, "12.3 ms"),
    (1.24, "1.24 s"),
    (42.0, "42.0 s"),
    (3600.0, "1h00m"),
    (0.0, "0 ms"),
])
def test_latency_at_unit_edges(s: float, shown: str) -> None:
    assert fmt.latency(s) == shown


@pytest.mark.parametrize(("x", "shown"), [
    (9.996, "10.0"), (99.96, "100"), (99.94, "99.9"), (9.994, "9.99"),
    (2_500_000.0, "2,500,000"), (0.0, "0"),
])
def test_rate_at_edges(x: float, shown: str) -> None:
    assert fmt.rate(x) == shown


def test_pct_and_bytes_at_edges() -> None:
    assert fmt.pct(0.09996, fraction=True) == "10%"
    assert fmt.pct(0.0994, fraction=True) == "9.9%"
    assert fmt.size_bytes(1023.9) == "1.0 KiB"
    assert fmt.size_bytes(1023.4) == "1023 B"
    assert fmt.size_bytes(1024 * 1023.99) == "1.0 MiB"
    assert fmt.size_bytes(80 * 2**30) == "80.0 GiB"


def test_no_unit_edge_ever_shows_four_digits_of_a_smaller_unit() -> None:
    for k in range(-7, 3):
        for m in (0.99949, 0.9995, 0.99951, 0.99999):
            s = m * 10.0 ** k
            out = fmt.latency(s)
            number = out.split()[0]
            assert "1000" not in number and len(number) <= 5, (s, out)
