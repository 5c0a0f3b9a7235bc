"""A user or model name with a byte that is not UTF-8 (a client's raw header, a JSON
``\\udcff`` escape) reads with one U+FFFD for it, on both request paths (aiohttp's, the
first request on a connection; the direct path, the next ones): each lone surrogate
went through UTF-8's ``surrogatepass`` as its three bytes, and ``bad\\xff`` showed as
``bad`` and three U+FFFD in the snapshot, the TUI and the Prometheus labels."""

from __future__ import annotations

from test_proxy_support import Script, running_proxy, scripted_upstream
from test_qa_hostile import exchange


def _post(user: bytes, model: str) -> bytes:
    body = b'{"model": "' + model.encode() + b'", "messages": []}'
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-LLMTOP-User: " + user
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


async def test_one_bad_byte_is_one_replacement_character() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=[b"{}"])
        async with running_proxy(up.url) as (_, url, recs):
            answers = await exchange(url, [_post(b"bad\xff", "m\\udcffx"),
                                           _post(b"b\xfe\xffd", "ok")], wait_s=5)
            assert [a[0] for a in answers] == [200, 200]
            got = [(x.user, x.model) for x in await recs.wait(2)]
    assert got == [("bad\ufffd", "m\ufffdx"), ("b\ufffd\ufffdd", "ok")]
