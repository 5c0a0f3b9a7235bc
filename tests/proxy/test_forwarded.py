"""The client behind a trusted proxy (llmtop/proxy/forwarded.py): which forwarded address
is believed, read as nginx's ``real_ip_recursive on`` and uvicorn's
``--forwarded-allow-ips`` read it, and never from a peer that is not trusted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from llmtop.proxy.forwarded import TrustedProxies, address_of, network_of, split_list
from llmtop.proxy.identity import IdentityResolver, key_pseudonym

LB = TrustedProxies(["10.0.0.0/8", "192.168.1.5", "2001:db8:ff::/48"])
"""A balancer network, one balancer address, an IPv6 balancer network."""


def xff(*lines: str) -> str | None:
    return LB.client([], list(lines), [])


def fwd(*lines: str) -> str | None:
    return LB.client(list(lines), [], [])


@pytest.mark.parametrize(("lines", "client"), [
    (["203.0.113.7"], "203.0.113.7"),
    # a chain: walked from the right past the trusted hops
    (["203.0.113.7, 10.1.2.3, 192.168.1.5"], "203.0.113.7"),
    # the client's own (spoofed) hops left of the first untrusted one count for nothing
    (["6.6.6.6, 1.1.1.1, 203.0.113.7, 10.1.2.3"], "203.0.113.7"),
    (["10.9.9.9, 203.0.113.7, 10.1.2.3"], "203.0.113.7"),
    # every hop trusted: the leftmost
    (["10.0.0.1, 10.0.0.2, 192.168.1.5"], "10.0.0.1"),
    (["192.168.1.5"], "192.168.1.5"),
    # several lines are one list, in order
    (["6.6.6.6, 203.0.113.7", "10.1.2.3"], "203.0.113.7"),
    (["203.0.113.7", "10.1.2.3", "192.168.1.5"], "203.0.113.7"),
    (["10.1.1.1", "203.0.113.7"], "203.0.113.7"),
    # ports and IPv6, bare and bracketed; named as ipaddress writes them
    (["203.0.113.7:51234, 10.1.2.3:443"], "203.0.113.7"),
    (["2001:DB8::0001"], "2001:db8::1"),
    (["[2001:db8::1]:4711, 2001:db8:ff::9"], "2001:db8::1"),
    (["::ffff:203.0.113.7"], "203.0.113.7"),
    # empty list elements are no hops (RFC 9110 5.6.1)
    ([" , 203.0.113.7,, 10.1.2.3 ,"], "203.0.113.7"),
    # garbage where the client would be: no client (the peer's address stays)
    (["not-an-ip"], None),
    (["203.0.113.7, garbage, 10.1.2.3"], None),
    (["203.0.113.7:99999"], None),
    (["[2001:db8::1"], None),
    (["unknown"], None),
    (["1.2.3.4.5"], None),
    ([""], None),
    # ...and garbage left of it is never read
    (["garbage, 203.0.113.7, 10.1.2.3"], "203.0.113.7"),
])
def test_x_forwarded_for_is_walked_from_the_right(lines: list[str], client: str | None) -> None:
    assert xff(*lines) == client


@pytest.mark.parametrize(("lines", "client"), [
    (["for=203.0.113.7"], "203.0.113.7"),
    (['for="[2001:db8:cafe::17]:4711"'], "2001:db8:cafe::17"),
    (['for="203.0.113.7:80";proto=https;by=10.0.0.1'], "203.0.113.7"),
    (['proto=https; For="203.0.113.7"'], "203.0.113.7"),  # names are case-insensitive
    (['for=203.0.113.7, for=10.1.2.3;by="_lb1"', "for=192.168.1.5"], "203.0.113.7"),
    (["for=6.6.6.6, for=203.0.113.7, for=10.1.2.3"], "203.0.113.7"),
    (["for=10.1.2.3, for=192.168.1.5"], "10.1.2.3"),  # every hop trusted: the leftmost
    (['for="203.0.113.7:_port9"'], "203.0.113.7"),  # an obfuscated port
    (['for=203.0.113.7;by="a,b;c", for=10.1.2.3'], "203.0.113.7"),  # quoted , and ;
    (['for="\\2\\03.0.113.7"'], "203.0.113.7"),  # quoted-pairs
    # RFC 7239 identifiers that name no address: no client
    (["for=unknown"], None),
    (["for=_hidden"], None),
    (["for=203.0.113.7, for=_gateway"], None),
    (["for=unknown, for=203.0.113.7"], "203.0.113.7"),  # left of the client: not read
    (["proto=https"], None),  # an element without for
    (["for="], None),
    (['for="203.0.113.7'], None),  # an unclosed quote
    (["for=[2001:db8::1"], None),
    (["for=garbage, for=10.1.2.3"], None),
])
def test_forwarded_for_rfc_7239(lines: list[str], client: str | None) -> None:
    assert fwd(*lines) == client


def test_the_first_field_present_decides() -> None:
    """Forwarded, else X-Forwarded-For, else X-Real-IP — the one present decides even when
    it names no client (another field is not asked: it may be the client's own)."""
    assert LB.client(["for=203.0.113.1"], ["203.0.113.2"], ["203.0.113.3"]) == "203.0.113.1"
    assert LB.client([], ["203.0.113.2"], ["203.0.113.3"]) == "203.0.113.2"
    assert LB.client([], [], ["203.0.113.3"]) == "203.0.113.3"
    assert LB.client([], [], ["203.0.113.3:8080"]) == "203.0.113.3"
    assert LB.client(["for=_hidden"], ["203.0.113.2"], []) is None
    assert LB.client([], ["junk"], ["203.0.113.3"]) is None
    assert LB.client([], [], []) is None


def test_which_peers_are_trusted() -> None:
    assert LB.trusts_peer("10.200.0.1") and LB.trusts_peer("192.168.1.5")
    assert not LB.trusts_peer("192.168.1.6") and not LB.trusts_peer("11.0.0.1")
    assert LB.trusts_peer("2001:db8:ff:1::2") and not LB.trusts_peer("2001:db8:fe::2")
    # an IPv4 balancer seen by a [::] listener, a link-local balancer with its zone
    assert LB.trusts_peer("::ffff:10.1.1.1") and LB.trusts_peer("::ffff:192.168.1.5")
    one = TrustedProxies(["127.0.0.1", "fe80::1", "::ffff:192.0.2.1"])
    assert one.trusts_peer("127.0.0.1") and one.trusts_peer("::ffff:127.0.0.1")
    assert one.trusts_peer("fe80::1%eth0") and one.trusts_peer("192.0.2.1")
    assert not one.trusts_peer("127.0.0.2") and not one.trusts_peer("garbage")
    assert not TrustedProxies([]) and not TrustedProxies([]).trusts_peer("127.0.0.1")


@pytest.mark.parametrize(("entry", "message"), [
    ("10.0.0.300", "'10.0.0.300' is not an IP address or network"),
    ("lb.example.com", "'lb.example.com' is not an IP address or network"),
    ("10.0.0.0/33", "'10.0.0.0/33' is not an IP address or network"),
    ("10.0.0.1/8", "'10.0.0.1/8' has bits set past its prefix length: the network is "
                   "10.0.0.0/8"),
    ("fe80::1%eth0", "leave the IPv6 zone"),
])
def test_a_bad_entry_is_named(entry: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        network_of(entry)


def test_address_and_list_reading() -> None:
    assert str(address_of(" [::1]:80 ")) == "::1"
    assert address_of("1.2.3.4:") is None and address_of("1.2.3.4:_") is None
    assert address_of("[::1]x") is None and address_of("1.2.3.4:8a") is None
    assert split_list('a, "b,c" ,, d') == ["a", '"b,c"', "d"]


# -- in the identity order ----------------------------------------------------------------


def test_the_forwarded_client_is_only_the_address_step() -> None:
    """Header, body ``user`` and API key still win; the forwarded client replaces only
    the peer's address, and only when the peer is trusted."""
    ids = IdentityResolver("X-LLMTOP-User", "salt", ["10.0.0.0/8"])
    h = CIMultiDict({"X-Forwarded-For": "203.0.113.7, 10.1.1.1"})
    assert ids.resolve(h, None, "10.0.0.1") == "203.0.113.7"
    assert ids.resolve(h, None, "127.0.0.1") == "127.0.0.1"  # an untrusted peer
    assert ids.resolve(CIMultiDict(h, **{"X-LLMTOP-User": "alice"}), None,
                       "10.0.0.1") == "alice"
    assert ids.resolve(h, "bob", "10.0.0.1") == "bob"
    assert ids.resolve(CIMultiDict(h, Authorization="Bearer sk-1"), None,
                       "10.0.0.1") == key_pseudonym("sk-1", b"salt")
    assert ids.resolve(CIMultiDict({"X-Forwarded-For": "junk"}), None, "10.0.0.1") == (
        "10.0.0.1")
    assert ids.resolve(CIMultiDict(), None, "::ffff:10.0.0.1") == "10.0.0.1"
    # a plain mapping: its one value of each field
    assert ids.resolve({"X-Real-IP": "203.0.113.9"}, None, "10.0.0.1") == "203.0.113.9"
    # without trusted_proxies the fields are never believed
    plain = IdentityResolver("X-LLMTOP-User", "salt")
    assert plain.resolve(h, None, "10.0.0.1") == "10.0.0.1"
    assert plain.resolve_raw([(b"X-Forwarded-For", b"203.0.113.7")], None,
                             "10.0.0.1") == "10.0.0.1"


_NAMES = st.sampled_from([b"X-Forwarded-For", b"x-forwarded-for", b"Forwarded",
                          b"FORWARDED", b"X-Real-IP", b"x-real-ip", b"Authorization",
                          b"X-LLMTOP-User", b"Accept"])
_VALUES = st.sampled_from([
    b"203.0.113.7", b"203.0.113.7, 10.0.0.1", b"10.0.0.2", b"for=203.0.113.8",
    b'for="[2001:db8::1]:80", for=10.0.0.3', b"for=_hidden", b"unknown", b"junk", b"",
    b"\xff\xfe", b"Bearer sk-1", b"alice", b" , ", b"198.51.100.1:4711"])


@settings(max_examples=400, deadline=None)
@given(raw=st.lists(st.tuples(_NAMES, _VALUES), max_size=6),
       body_user=st.sampled_from([None, "carol"]),
       remote=st.sampled_from([None, "10.0.0.9", "127.0.0.1", "::ffff:10.0.0.9"]))
def test_both_paths_name_the_forwarded_client_alike(
        raw: list[tuple[bytes, bytes]], body_user: str | None, remote: str | None) -> None:
    """The direct path (raw header pairs) and aiohttp's (a ``CIMultiDict`` of every
    field, decoded as aiohttp decodes them) give the same user, repeated fields included."""
    ids = IdentityResolver("X-LLMTOP-User", "salt", ["10.0.0.0/8"])
    decoded = CIMultiDict((n.decode("latin-1"), v.decode("utf-8", "surrogateescape"))
                          for n, v in raw)
    assert ids.resolve_raw(raw, body_user, remote) == ids.resolve(decoded, body_user, remote)
