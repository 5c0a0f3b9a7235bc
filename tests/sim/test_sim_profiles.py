"""Profiles: the built-ins, overrides (typed and from strings), and clear errors."""

from __future__ import annotations

import dataclasses

import pytest

from llmtop.sim.profiles import OVERRIDABLE, PROFILES, get_profile, parse_set_options


def test_builtin_profiles_match_their_documented_hardware() -> None:
    assert set(PROFILES) == {"tiny", "h200-llama8b"}
    h = PROFILES["h200-llama8b"]
    assert h.peak_bw_bytes_per_s == 4.8e12
    assert h.kv_bytes_per_token == 128 * 1024
    assert 140e9 < h.mem_total_bytes < 152e9
    assert 0.0035 <= h.base_step_s <= 0.0045  # ≈ 4 ms
    # the base step is at least the time to read the weights once
    assert h.base_step_s >= h.weights_bytes / h.peak_bw_bytes_per_s
    assert h.per_kv_token_s == pytest.approx(h.kv_bytes_per_token / h.peak_bw_bytes_per_s)
    # KV pool + weights + overhead fit in memory
    assert (h.kv_cache_tokens * h.kv_bytes_per_token + h.weights_bytes
            + h.runtime_overhead_bytes) < h.mem_total_bytes
    t = PROFILES["tiny"]
    assert t.max_num_seqs <= 8  # saturates at a handful of requests
    assert t.kv_cache_tokens * t.kv_bytes_per_token + t.weights_bytes < t.mem_total_bytes


def test_overrides_typed_and_from_strings() -> None:
    p = get_profile("tiny", max_num_seqs="8", time_scale="0.1", per_seq_s=2e-3,
                    weights_bytes="1_000", model="x")
    assert (p.max_num_seqs, p.time_scale, p.per_seq_s, p.weights_bytes, p.model) == (
        8, 0.1, 2e-3, 1000, "x")
    assert get_profile("tiny", kv_cache_tokens="4e3").kv_cache_tokens == 4000
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.max_num_seqs = 3  # type: ignore[misc]
    assert "name" not in OVERRIDABLE and "time_scale" in OVERRIDABLE
    assert parse_set_options(["a=1", " b = x "]) == {"a": "1", "b": "x"}


@pytest.mark.parametrize(("name", "overrides", "message"), [
    ("nope", {}, "unknown sim profile 'nope' (known: tiny, h200-llama8b)"),
    ("tiny", {"colour": 1}, "unknown sim parameter 'colour'"),
    ("tiny", {"max_num_seqs": "many"}, "max_num_seqs must be a number"),
    ("tiny", {"max_num_seqs": 2.5}, "max_num_seqs must be a whole number"),
    ("tiny", {"max_num_seqs": 0}, "max_num_seqs must be ≥ 1"),
    ("tiny", {"time_scale": 0}, "time_scale must be > 0"),
    ("tiny", {"max_model_len": 4096}, "must not exceed kv_cache_tokens"),
    ("tiny", {"output_tokens_dist": "zipf"}, "output_tokens_dist 'zipf' is not one of"),
    ("tiny", {"model": 3}, "model must be a string"),
    ("tiny", {"model": " "}, "model must not be empty"),
    ("tiny", {"time_scale": "1e300"}, "time_scale must be at most 1000"),
])
def test_bad_profiles_and_overrides(name: str, overrides: dict[str, object],
                                    message: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        get_profile(name, **overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_set_option() -> None:
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_set_options(["max_num_seqs"])
