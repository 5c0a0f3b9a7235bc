"""One vocabulary of warning codes: what the detectors evaluate is what /metrics exports,
every code present (0) from the start so "no warning" differs from "no data"."""

from __future__ import annotations

from prometheus_client import generate_latest

from llmtop.config import load_config
from llmtop.events import OPERATIONAL_CODES, WARNING_CODES
from llmtop.metrics.aggregator import Aggregator
from llmtop.metrics.prometheus import make_registry
from llmtop.saturation import SaturationMonitor


def test_detectors_evaluate_exactly_the_known_codes() -> None:
    mon = SaturationMonitor(load_config(None, env={}), lambda ev: None)
    mon.tick(1_800_000_000.0, 0)
    assert set(mon.states) == set(WARNING_CODES)


def test_metrics_export_every_code_as_zero_before_any_warning() -> None:
    agg = Aggregator(load_config(None, env={}), {})
    text = generate_latest(make_registry(agg)).decode()
    for code in (*WARNING_CODES, *OPERATIONAL_CODES):
        assert f'llmtop_warning_active{{code="{code}"}} 0.0' in text
