"""Who the user is: header, then body ``user``, then API-key pseudonym, then address."""

from __future__ import annotations

import re

import aiohttp
from multidict import CIMultiDict
from test_proxy_support import Script, running_proxy, scripted_upstream

from llmtop.proxy.identity import IdentityResolver, key_pseudonym


def test_order_header_then_body_then_key_then_address() -> None:
    ids = IdentityResolver("X-LLMTOP-User", "salt")
    h = {"X-LLMTOP-User": "alice", "Authorization": "Bearer sk-1"}
    assert ids.resolve(h, "bob", "10.0.0.1") == "alice"
    assert ids.resolve({"Authorization": "Bearer sk-1"}, "bob", "10.0.0.1") == "bob"
    assert ids.resolve({"Authorization": "Bearer sk-1"}, None, "10.0.0.1") == key_pseudonym(
        "sk-1", b"salt")
    assert ids.resolve({}, None, "10.0.0.1") == "10.0.0.1"
    assert ids.resolve({}, None, None) == "unknown"
    # blank values do not count as a match
    assert ids.resolve({"X-LLMTOP-User": "  "}, "", "10.0.0.1") == "10.0.0.1"


def test_key_pseudonym_is_salted_stable_and_never_the_key() -> None:
    a = IdentityResolver("X-LLMTOP-User", "s1")
    b = IdentityResolver("X-LLMTOP-User", "s2")
    bearer = {"Authorization": "Bearer sk-live-abcdef123456"}
    u1 = a.resolve(bearer, None, None)
    assert re.fullmatch(r"key:[0-9a-f]{8}", u1)
    # header names are case-insensitive on the wire (aiohttp hands over a CIMultiDict)
    loose = CIMultiDict({"authorization": "bearer  sk-live-abcdef123456 "})
    assert u1 == a.resolve(loose, None, None)
    assert u1 != b.resolve(bearer, None, None)
    assert "abcdef" not in u1
    # x-api-key (Anthropic) names the same credential the same way
    assert a.resolve({"x-api-key": "sk-live-abcdef123456"}, None, None) == u1
    # other auth schemes still become pseudonyms, never the raw value
    basic = a.resolve({"Authorization": "Basic dXNlcjpwYXNz"}, None, None)
    assert basic.startswith("key:") and "dXNl" not in basic
    # no salt configured: a random one per process (not guessable, still stable)
    r = IdentityResolver("X-LLMTOP-User", "")
    assert r.resolve(bearer, None, None) == r.resolve(bearer, None, None)
    assert r.resolve(bearer, None, None) != key_pseudonym("sk-live-abcdef123456", b"")


def test_long_names_are_cut() -> None:
    ids = IdentityResolver("X-User", "s")
    assert len(ids.resolve({"X-User": "u" * 1000}, None, None)) == 128


async def test_identity_over_the_wire() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=[b"{}"])
        async with running_proxy(up.url, user_header="X-Team-User", user_salt="pepper") as (
                _, url, recs), aiohttp.ClientSession() as s:
            chat = url + "/v1/chat/completions"
            body = {"model": "m", "messages": [], "user": "body-user"}
            auth = {"Authorization": "Bearer sk-abc"}
            await (await s.post(chat, json=body, headers={"X-Team-User": "hdr", **auth})).read()
            await (await s.post(chat, json=body, headers=auth)).read()
            await (await s.post(chat, json={"model": "m"}, headers=auth)).read()
            await (await s.post(chat, json={"model": "m"})).read()
            got = [r.user for r in await recs.wait(4)]
    assert got == ["hdr", "body-user", key_pseudonym("sk-abc", b"pepper"), "127.0.0.1"]
    # the credential itself still reaches the upstream untouched
    assert dict(up.seen[2].headers)["Authorization"] == "Bearer sk-abc"
