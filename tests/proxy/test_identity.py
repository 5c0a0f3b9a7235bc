"""Who the user is: header, then body ``user``, then API-key pseudonym, then address."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict
from test_proxy_support import Script, running_proxy, scripted_upstream

from llmtop.proxy.identity import SALT_FILE_ENV, IdentityResolver, key_pseudonym, stored_salt


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
    # x-api-key (Anthropic), api-key (Azure OpenAI) and x-goog-api-key (Gemini) name the
    # same credential the same way; a Bearer token goes first, then the fields in that order
    for field in ("x-api-key", "api-key", "x-goog-api-key", "Api-Key"):
        assert a.resolve(CIMultiDict({field: " sk-live-abcdef123456"}), None, None) == u1
    assert a.resolve({"api-key": "other", **bearer}, None, None) == u1
    assert a.resolve({"x-goog-api-key": "sk-live-abcdef123456", "x-api-key": "other"},
                     None, None) == a.resolve({"x-api-key": "other"}, None, None)
    # other auth schemes still become pseudonyms, never the raw value
    basic = a.resolve({"Authorization": "Basic dXNlcjpwYXNz"}, None, None)
    assert basic.startswith("key:") and "dXNl" not in basic
    # no salt configured: the stored one (not guessable, stable)
    r = IdentityResolver("X-LLMTOP-User", "")
    assert r.resolve(bearer, None, None) == r.resolve(bearer, None, None)
    assert r.resolve(bearer, None, None) != key_pseudonym("sk-live-abcdef123456", b"")


def test_without_a_configured_salt_a_key_keeps_its_pseudonym_across_proxies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """QA: the same key was key:73af17a8 on one proxy and key:e32102a8 on the next (a
    random salt per process): `attach A B` split one user in two, `report before after`
    could not match users, Prometheus labels changed at every restart. Now the salt is made
    once (0600) and read by every later proxy of this machine user."""
    path = tmp_path / "state" / "llmtop" / "user_salt"
    monkeypatch.setenv(SALT_FILE_ENV, str(path))
    bearer = {"Authorization": "Bearer sk-live-abcdef123456"}
    first = IdentityResolver("X-LLMTOP-User", "").resolve(bearer, None, None)
    assert path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "sk-live" not in path.read_text()
    assert IdentityResolver("X-LLMTOP-User", "").resolve(bearer, None, None) == first
    assert IdentityResolver("X-LLMTOP-User", "other").resolve(bearer, None, None) != first
    # a place where no file can be made: a random salt, and the proxy still works
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv(SALT_FILE_ENV, str(blocker / "user_salt"))
    assert stored_salt() is None
    assert IdentityResolver("X-LLMTOP-User", "").resolve(bearer, None, None).startswith("key:")


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


_NAMES = st.sampled_from([b"Authorization", b"authorization", b"AUTHORIZATION", b"x-api-key",
                          b"X-Api-Key", b"api-key", b"Api-Key", b"x-goog-api-key",
                          b"X-LLMTOP-User", b"x-llmtop-user", b"X-Team",
                          b"Accept", b"Content-Type", b"User-Agent"])
_VALUES = st.sampled_from([b"Bearer sk-1", b"bearer  sk-2 ", b"Basic abc", b"", b"  ",
                           b"alice", b"b\xc3\xb6b", b"\xff\xfe", b"sk-3", b"Bearer "])


@settings(max_examples=400, deadline=None)
@given(raw=st.lists(st.tuples(_NAMES, _VALUES), max_size=6),
       header=st.sampled_from(["X-LLMTOP-User", "x-team", ""]),
       body_user=st.sampled_from([None, "", "carol", "  "]),
       remote=st.sampled_from([None, "10.0.0.1"]))
def test_resolve_raw_equals_resolve_on_the_decoded_fields(
        raw: list[tuple[bytes, bytes]], header: str, body_user: str | None,
        remote: str | None) -> None:
    """The direct path names the user from the raw header pairs (``resolve_raw``): the
    same user as ``resolve`` given those fields decoded into a ``CIMultiDict`` (what the
    direct path built before), repeated fields and any case of the names included."""
    ids = IdentityResolver(header, "salt")
    decoded = CIMultiDict((n.decode("latin-1"), v.decode("utf-8", "surrogateescape"))
                          for n, v in raw if n.lower() in ids.header_names)
    assert ids.resolve_raw(raw, body_user, remote) == ids.resolve(decoded, body_user, remote)
