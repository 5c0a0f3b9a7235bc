"""The dialects' JSON reader: orjson first, ``json`` for what orjson refuses — the same
values (or ``BAD``) as ``json.loads`` for anything an upstream or a client can send."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from llmtop.proxy.dialects._common import BAD, loads

_INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
_SCALARS = (
    st.none() | st.booleans() | _INT64 | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)  # fmt: skip
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def _json_or_bad(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError, TypeError):
        return BAD


@settings(max_examples=300, deadline=None)
@given(_VALUES, st.booleans())
def test_any_json_value_reads_as_json_reads_it(value: Any, ascii_only: bool) -> None:
    data = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    assert loads(data) == json.loads(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_arbitrary_bytes_are_bad_exactly_when_json_refuses_them(data: bytes) -> None:
    got, want = loads(data), _json_or_bad(data)
    assert (got is BAD) == (want is BAD)
    if got is not BAD:
        assert got == want or (got != got and want != want)  # NaN == NaN aside


def test_what_orjson_refuses_goes_to_json() -> None:
    # lone surrogates (broken UTF-8 tokens escaped by an engine), NaN, a BOM, past a double
    assert loads(b'{"content":"\\ud83d"}') == {"content": "\ud83d"}
    assert loads(b'{"logprob":-Infinity}') == {"logprob": float("-inf")}
    assert loads(b'\xef\xbb\xbf{"a":1}') == {"a": 1}
    assert loads(b'{"a":1e400}') == {"a": float("inf")}
    assert loads(b'{"a":1} x') is BAD
    assert loads(b'{"a":') is BAD
    assert loads(b"[" * 100_000) is BAD  # too deep for both


def test_an_integer_past_64_bits_is_no_token_count() -> None:
    """The one difference from ``json``: orjson reads such a number as a float."""
    obj = loads(b'{"completion_tokens":123456789012345678901234567890}')
    assert isinstance(obj, dict) and type(obj["completion_tokens"]) is float
    assert loads(b'{"completion_tokens":18446744073709551615}') == {
        "completion_tokens": 2**64 - 1
    }
