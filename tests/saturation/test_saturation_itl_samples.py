"""RequestRecord.itl_samples_s (the detectors' per-request ITL P95 reads it for every
finished request): its one-token-a-chunk shortcut gives exactly the general rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmtop.events import RequestRecord
from llmtop.saturation.signals import itl_p95


def _rule(offs: tuple[float, ...], toks: tuple[int, ...]) -> list[float]:
    out: list[float] = []
    for i in range(1, len(offs)):
        k = toks[i] if i < len(toks) else 1
        if k > 0:
            out.extend([(offs[i] - offs[i - 1]) / k] * k)
    return out


@given(st.lists(st.floats(0, 10), max_size=40).map(lambda xs: tuple(sorted(xs))),
       st.lists(st.sampled_from([1, 1, 1, 1, 2, 0]), max_size=41).map(tuple))
def test_itl_samples_follow_the_rule(offs: tuple[float, ...], toks: tuple[int, ...]) -> None:
    r = RequestRecord(id="r", user="u", model=None, dialect="openai", path="/",
                      stream=True, status=200, outcome="ok", t_start=0.0,
                      ttft_s=offs[0] if offs else None, e2e_s=1.0, prompt_tokens=None,
                      completion_tokens=None, token_source="chunks",
                      chunk_offsets_s=offs, chunk_tokens=toks)
    want = _rule(offs, toks)
    assert r.itl_samples_s() == want
    ones = RequestRecord(**{**{f: getattr(r, f) for f in r.__slots__},  # type: ignore[arg-type]
                            "chunk_tokens": (1,) * len(offs)})
    assert ones.itl_samples_s() == _rule(offs, ())
    assert (itl_p95(r) is None) == (not want)
