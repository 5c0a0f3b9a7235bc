"""The SSE framer and the line splitter under the framing details that break naive parsers."""

from __future__ import annotations

import pytest

from llmtop.proxy.dialects.lines import LineSplitter
from llmtop.proxy.dialects.sse import SSEEvent, SSEFramer


def frame_all(pieces: list[bytes], max_event_bytes: int = 1 << 20) -> list[SSEEvent]:
    f = SSEFramer(max_event_bytes)
    out: list[SSEEvent] = []
    for p in pieces:
        out.extend(f.feed(p))
    out.extend(f.finish())
    return out


def every_split(raw: bytes) -> list[list[bytes]]:
    return [[raw[:i], raw[i:]] for i in range(len(raw) + 1)] + [
        [raw[i : i + 1] for i in range(len(raw))]
    ]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_line_ends_all_frame_the_same(eol: bytes) -> None:
    raw = (b"data: a\n\n: keep-alive\n\nevent: x\ndata: b\ndata: c\n\n").replace(b"\n", eol)
    want = [SSEEvent("", b"a"), SSEEvent("x", b"b\nc")]
    for pieces in every_split(raw):
        assert frame_all(pieces) == want


def test_cr_then_lf_across_reads_is_one_line_end() -> None:
    f = SSEFramer()
    assert f.feed(b"data: a\r") == []
    # "\r" ended the data line at once; "\n" is its second half, not a blank line
    assert f.feed(b"\n") == []
    assert f.feed(b"\r") == [SSEEvent("", b"a")]
    assert f.feed(b"\ndata: b\r\n\r\n") == [SSEEvent("", b"b")]


def test_cr_cr_is_a_blank_line() -> None:
    assert frame_all([b"data: a\r\r", b"data: b\r", b"\r"]) == [
        SSEEvent("", b"a"), SSEEvent("", b"b")]


def test_event_is_dispatched_on_the_read_with_its_blank_line() -> None:
    f = SSEFramer()
    assert f.feed(b"data: {\"a\":1}\n") == []
    assert f.feed(b"\n") == [SSEEvent("", b'{"a":1}')]


def test_fields_and_comments() -> None:
    raw = (b":comment\nid: 7\nretry: 100\nevent:update\ndata:no-space\ndata:  two spaces\n"
           b"unknown: x\ndata\n\n")
    # one space after the colon is dropped, not two; a bare "data" line is an empty line
    assert frame_all([raw]) == [SSEEvent("update", b"no-space\n two spaces\n")]


def test_event_name_resets_after_each_event_and_empty_events_are_not_dispatched() -> None:
    raw = b"event: a\n\ndata: x\n\nevent: b\ndata:\n\n"
    assert frame_all([raw]) == [SSEEvent("", b"x"), SSEEvent("b", b"")]


def test_missing_final_blank_line_and_missing_final_newline() -> None:
    assert frame_all([b"data: a\n\ndata: b\n"]) == [SSEEvent("", b"a"), SSEEvent("", b"b")]
    assert frame_all([b"data: a\n\ndata: b"]) == [SSEEvent("", b"a"), SSEEvent("", b"b")]
    assert frame_all([b"data: a\r"]) == [SSEEvent("", b"a")]


def test_byte_order_mark_is_ignored_even_when_split() -> None:
    raw = b"\xef\xbb\xbfdata: a\n\n"
    for pieces in every_split(raw):
        assert frame_all(pieces) == [SSEEvent("", b"a")]


def test_oversized_line_is_discarded_and_framing_recovers() -> None:
    big = b"data: " + b"x" * 5000
    raw = big + b"\n\ndata: after\n\n"
    for pieces in ([raw], [raw[:100], raw[100:4000], raw[4000:]],
                   [raw[i : i + 7] for i in range(0, len(raw), 7)]):
        f = SSEFramer(max_event_bytes=1024)
        out = [e for p in pieces for e in f.feed(p)] + f.finish()
        assert out == [SSEEvent("", b"after")]
        assert f.error is not None and "1024" in f.error
        assert f.buffered_bytes <= 1024


def test_oversized_multi_line_event_is_discarded() -> None:
    raw = b"".join(b"data: " + b"y" * 100 + b"\n" for _ in range(50)) + b"\ndata: ok\n\n"
    f = SSEFramer(max_event_bytes=1024)
    out = f.feed(raw) + f.finish()
    assert out == [SSEEvent("", b"ok")]
    assert f.error is not None


def test_unbounded_garbage_without_newline_stays_bounded() -> None:
    f = SSEFramer(max_event_bytes=64 * 1024)
    block = b"z" * 65536
    for _ in range(800):  # 50 MiB
        assert f.feed(block) == []
        assert f.buffered_bytes <= 64 * 1024
    assert f.error is not None
    assert f.feed(b"\ndata: ok\n\n") == [SSEEvent("", b"ok")]


def test_line_splitter_ndjson_mode_keeps_cr() -> None:
    s = LineSplitter(cr_is_eol=False)
    assert s.feed(b'{"a":1}\r\n{"b"') == [b'{"a":1}\r']
    assert s.feed(b":2}\r") == []
    assert s.finish() == b'{"b":2}\r'
    assert s.finish() is None


def test_line_splitter_long_line_inside_one_read_is_dropped() -> None:
    s = LineSplitter(16)
    assert s.feed(b"short\n" + b"L" * 40 + b"\nok\n") == [b"short", b"ok"]
    assert s.error is not None
