"""The request's field lines as they go upstream, made in one pass
(``headers.upstream_field_lines``): byte for byte what the two passes made before —
``upstream_request_headers`` (hop-by-hop fields, those ``Connection`` lists, ``Host``,
``Content-Length`` and ``Expect: 100-continue`` dropped — the proxy answers that one; any
other expectation goes upstream), then ``Accept-Encoding`` set to ``identity``
when usage is injected, then ``Name: value\\r\\n`` per field."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmtop.proxy.headers import upstream_field_lines, upstream_request_headers

_NAMES = st.sampled_from([
    b"Host", b"Content-Length", b"Expect", b"Connection", b"connection", b"Keep-Alive",
    b"Proxy-Authorization", b"proxy-foo", b"TE", b"Trailer", b"Transfer-Encoding",
    b"Upgrade", b"Accept-Encoding", b"accept-encoding", b"Authorization", b"X-Foo",
    b"x-foo", b"Close", b"Accept", b"Content-Type", b"X-Keep"])
_CONNECTION = st.sampled_from([
    b"keep-alive", b"close", b"Keep-Alive, TE", b"x-foo", b"X-Foo, keep-alive", b"",
    b" , ", b"proxy-bar", b"upgrade", b"accept-encoding", b"x-keep,close"])
_VALUES = st.sampled_from([b"a", b"gzip, deflate", b"", b"Bearer sk-1", b"\xff",
                          b"100-continue", b" 100-Continue "])


def _old(raw: list[tuple[bytes, bytes]], identity: bool) -> bytes:
    headers = upstream_request_headers(raw)
    if identity and any(k.lower() == b"accept-encoding" for k, _ in headers):
        headers = [(k, b"identity") if k.lower() == b"accept-encoding" else (k, v)
                   for k, v in headers]
    return b"".join(n + b": " + v + b"\r\n" for n, v in headers)


@settings(max_examples=500, deadline=None)
@given(fields=st.lists(st.tuples(_NAMES, _VALUES, _CONNECTION), max_size=8),
       identity=st.booleans())
def test_one_pass_equals_the_two_passes(fields: list[tuple[bytes, bytes, bytes]],
                                        identity: bool) -> None:
    raw = [(n, c if n.lower() == b"connection" else v) for n, v, c in fields]
    assert upstream_field_lines(raw, identity) == _old(raw, identity)


def test_the_openai_sdks_fields() -> None:
    raw = [(b"Host", b"h:1"), (b"Accept-Encoding", b"gzip, deflate"),
           (b"Connection", b"keep-alive"), (b"Authorization", b"Bearer sk-1"),
           (b"Content-Length", b"12")]
    assert upstream_field_lines(raw, True) == (
        b"Accept-Encoding: identity\r\nAuthorization: Bearer sk-1\r\n")
    assert upstream_field_lines(raw) == (
        b"Accept-Encoding: gzip, deflate\r\nAuthorization: Bearer sk-1\r\n")
