"""llmtop's exposition reader against prometheus_client's parser, the reference: the same
samples (name as written, labels, value) from every engine fixture and from generated text
with escapes, odd label values, special floats and timestamps."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from llmtop.engines.exposition import iter_samples

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
Sample = tuple[str, dict[str, str], float]


def reference(text: str) -> list[Sample]:
    return [(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text) for s in fam.samples]


def same(a: list[Sample], b: list[Sample]) -> bool:
    return len(a) == len(b) and all(
        x[0] == y[0] and x[1] == y[1]
        and (x[2] == y[2] or (math.isnan(x[2]) and math.isnan(y[2])))
        for x, y in zip(a, b, strict=True))


def _names_as_written(text: str) -> set[str]:
    return {ln.split("{")[0].split()[0] for ln in text.splitlines()
            if ln.strip() and not ln.startswith("#")}


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*_metrics.txt")), ids=lambda p: p.name)
def test_fixtures_read_as_the_reference_reads_them(path: Path) -> None:
    text = path.read_text()
    ours = list(iter_samples(text))
    written = _names_as_written(text)
    # the reference renames a counter's sample that lacks _total; ours keeps it as written
    ref = [(n[:-6] if n not in written and n.endswith("_total") else n, lb, v)
           for n, lb, v in reference(text)]
    assert ours and same(ours, ref)
    assert {n for n, _, _ in ours} == written


def test_bucket_lines_of_other_histograms_are_skipped() -> None:
    text = ('h_bucket{le="1"} 2\nh_bucket{le="+Inf"} 3\nh_sum 4\nh_count 3\n'
            'g_bucket{le="1"} 5\ng_count 5\n')
    names = [n for n, _, _ in iter_samples(text, {"h"})]
    assert names == ["h_bucket", "h_bucket", "h_sum", "h_count", "g_count"]
    assert len(list(iter_samples(text))) == 6


@pytest.mark.parametrize("line", [
    "<html><body>Not Found</body></html>", "hello world", "{}", 'a{x="1" y="2"} 1',
    'a{x="1",,} 1', 'a{x=1} 1', 'a{x="unclosed} 1', "a 1 2 3", "a",
])
def test_lines_that_are_not_samples_raise(line: str) -> None:
    with pytest.raises(ValueError):
        list(iter_samples("ok 1\n" + line + "\n"))


def test_whitespace_trailing_comma_timestamp_and_crlf() -> None:
    text = '  a { x = "1" , y="2", } 3.5 1700000000000\r\nb\t7\r\n'
    assert list(iter_samples(text)) == [("a", {"x": "1", "y": "2"}, 3.5), ("b", {}, 7.0)]


NAME = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True)
LABEL = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True)
VALUE_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
NUMBER = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**12, 10**12))


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(x: float | int) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, float) and math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(x)


@st.composite
def expositions(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(1, 8))):
        name = draw(NAME.filter(lambda n: not n.endswith(("_total", "_created"))))
        if draw(st.booleans()):
            lines.append(f"# HELP {name} some help")
            lines.append(f"# TYPE {name} gauge")
        labels = draw(st.dictionaries(LABEL, VALUE_TEXT, max_size=4))
        block = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        ts = f" {draw(st.integers(0, 2**40))}" if draw(st.booleans()) else ""
        lines.append(f"{name}{{{block}}} {_number(draw(NUMBER))}{ts}" if labels or
                     draw(st.booleans()) else f"{name} {_number(draw(NUMBER))}{ts}")
    return "\n".join(lines) + "\n"


@settings(max_examples=150, deadline=None)
@given(expositions())
def test_generated_text_reads_as_the_reference_reads_it(text: str) -> None:
    try:
        ref = reference(text)
    except ValueError:
        return  # the reference refuses it (e.g. a name it will not take): nothing to compare
    assert same(list(iter_samples(text)), ref), text
