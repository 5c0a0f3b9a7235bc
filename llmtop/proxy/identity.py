"""Who made a request ("Who is the user" in shared/docs/interfaces.md).

First match wins: the configured header (default ``X-LLMTOP-User``), the request body's
``user`` field (OpenAI), the API key (``Authorization: Bearer …``, else one of
:data:`KEY_FIELDS`: ``x-api-key``, Azure OpenAI's ``api-key``, Gemini's ``x-goog-api-key``)
as a salted-hash pseudonym ``key:`` + 8 hex digits, then the client address — when the
connection comes from one of the ``trusted_proxies`` (a load balancer), the address it
forwards (:mod:`llmtop.proxy.forwarded`). Names are always valid text (bytes that are
not UTF-8 become U+FFFD). A raw key is never stored or returned: it is hashed with a
salt — ``user_salt`` from the config, else this machine user's stored salt
(:func:`stored_salt`: made once, kept in a 0600 file), so a key keeps its pseudonym across
restarts and across the proxies of one host; only when that file cannot be read or made
is the salt random per process. Proxies on several hosts share a ``user_salt``
(docs/fleet.md).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from llmtop.proxy.dialects._common import as_text
from llmtop.proxy.forwarded import FIELD_NAMES, FIELDS, TrustedProxies

MAX_USER_LEN: Final = 128
"""Longer header or body values are cut (a user id, not a payload)."""


SALT_FILE_ENV: Final = "LLMTOP_SALT_FILE"
"""Where the stored salt lives, when set (tests point it at a temporary file)."""


def salt_path() -> Path:
    """``$LLMTOP_SALT_FILE``, else ``$XDG_STATE_HOME/llmtop/user_salt`` (by default
    ``~/.local/state/llmtop/user_salt``)."""
    env = os.environ.get(SALT_FILE_ENV)
    if env:
        return Path(env)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state")
    return Path(state) / "llmtop" / "user_salt"


def stored_salt() -> bytes | None:
    """This machine user's pseudonym salt: read from :func:`salt_path`, or made there
    (32 random bytes as hex, mode 0600; a concurrent maker's file wins). None when the file
    can be neither read nor made (read-only home): the caller falls back to a random salt."""
    path = salt_path()
    for _ in range(2):
        try:
            text = path.read_text("ascii").strip()
            if len(text) >= 32:
                return text.encode()
            return None  # damaged: never overwritten (it may be a user's own choice)
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError):
            return None
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue  # made meanwhile by another proxy or worker: read theirs
        except OSError:
            return None
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(secrets.token_hex(32) + "\n")
        except OSError:  # a full disk, a file size limit: no half salt left to read later
            try:
                path.unlink()  # (an empty one reads as damaged, for good)
            except OSError:
                pass
            return None
    return None


def key_pseudonym(key: str, salt: bytes) -> str:
    """``key:`` + the first 8 hex digits of a keyed BLAKE2b hash of the credential."""
    mac_key = salt if len(salt) <= 64 else hashlib.blake2b(salt).digest()
    digest = hashlib.blake2b(key.encode("utf-8", "surrogateescape"), key=mac_key, digest_size=4)
    return "key:" + digest.hexdigest()


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    return as_text(value[:MAX_USER_LEN])


class _LowerKeys(dict[str, str]):
    """Fields by lower-case name, read by any case (``get`` only: what ``resolve`` uses)."""

    __slots__ = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict.get(self, key.lower(), default)


_NO_FIELDS = _LowerKeys()


KEY_FIELDS: Final = ("x-api-key", "api-key", "x-goog-api-key")
"""Fields that carry an API key by themselves, in the order looked at (after a Bearer
token): Anthropic's, Azure OpenAI's and Google Gemini's. Without the last two, every user of
an Azure or Gemini-style endpoint behind one gateway was named by the gateway's address."""


class IdentityResolver:
    """Maps a request to its user name; one per proxy (it holds the salt)."""

    __slots__ = ("_header", "_salt", "_trusted", "header_names")

    def __init__(self, user_header: str, salt: str | bytes = "",
                 trusted_proxies: Iterable[str] = ()) -> None:
        self._header = user_header
        if isinstance(salt, str):
            salt = salt.encode()
        self._salt = salt or stored_salt() or os.urandom(32)
        trusted = TrustedProxies(trusted_proxies)
        self._trusted: TrustedProxies | None = trusted if trusted else None
        """None without ``trusted_proxies``: the address step is the peer's, at no cost."""
        self.header_names: frozenset[bytes] = frozenset(
            {b"authorization", *(f.encode() for f in KEY_FIELDS)}
            | ({user_header.lower().encode("latin-1", "replace")} if user_header else set()))
        """The only headers :meth:`resolve` reads (lower-case) — but for the forwarded
        client's (:data:`llmtop.proxy.forwarded.FIELDS`), read only from a trusted proxy:
        a request read by hand need not decode the others."""

    def resolve_raw(self, raw: Sequence[tuple[bytes, bytes]], body_user: str | None,
                    remote: str | None) -> str:
        """:meth:`resolve` on a request's raw headers (name and value bytes as sent): the
        few it reads (:attr:`header_names`) are decoded, the first of each name — what
        ``resolve`` is given as a ``CIMultiDict`` of those fields reads (its names match
        as ``str.lower()`` makes them), without building one per request. The forwarded
        client's fields are looked for only when the peer is a trusted proxy."""
        names = self.header_names
        found: _LowerKeys | None = None
        for name, value in raw:
            low = name.lower()
            if low in names:
                key = low.decode("latin-1")
                if found is None:
                    found = _LowerKeys()
                if key not in found:
                    found[key] = value.decode("utf-8", "surrogateescape")
        named = self._named(found if found is not None else _NO_FIELDS, body_user)
        if named is not None:
            return named
        trusted = self._trusted
        if trusted is not None and remote is not None and trusted.trusts_peer(remote):
            lines: tuple[list[str], list[str], list[str]] = ([], [], [])
            for name, value in raw:
                low = name.lower()
                if low in FIELDS:
                    lines[FIELDS.index(low)].append(value.decode("utf-8", "surrogateescape"))
            client = trusted.client(*lines)
            if client is not None:
                return client
        return _address(remote)

    def api_key(self, headers: Mapping[str, str]) -> str | None:
        """The credential a request carries: a Bearer token, else the first of
        :data:`KEY_FIELDS` sent, else the whole ``Authorization`` value for other schemes."""
        auth = headers.get("Authorization")
        if auth:
            scheme, _, token = auth.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        for name in KEY_FIELDS:
            xkey = headers.get(name)
            if xkey and xkey.strip():
                return xkey.strip()
        if auth and auth.strip():
            return auth.strip()
        return None

    def resolve(
        self, headers: Mapping[str, str], body_user: str | None, remote: str | None
    ) -> str:
        """The user for one request (never a raw key). ``headers`` is the request's
        ``CIMultiDict`` (a plain mapping: one line of each field)."""
        named = self._named(headers, body_user)
        if named is not None:
            return named
        trusted = self._trusted
        if trusted is not None and remote is not None and trusted.trusts_peer(remote):
            client = trusted.client(*(_lines(headers, name) for name in FIELD_NAMES))
            if client is not None:
                return client
        return _address(remote)

    def _named(self, headers: Mapping[str, str], body_user: str | None) -> str | None:
        """The user the request names (header, body, API key), else None: its address."""
        if self._header:
            named = _clean(headers.get(self._header))
            if named is not None:
                return named
        named = _clean(body_user)
        if named is not None:
            return named
        key = self.api_key(headers)
        if key is not None:
            return key_pseudonym(key, self._salt)
        return None


def _address(remote: str | None) -> str:
    if remote is not None and remote.startswith("::ffff:") and "." in remote:
        # an IPv4 client of a [::] listener (dual-stack): named as on 0.0.0.0
        return remote[7:]
    return remote or "unknown"


def _lines(headers: Mapping[str, str], name: str) -> list[str]:
    """Every line of field ``name``: a ``CIMultiDict``'s ``getall``, else the one value."""
    getall = getattr(headers, "getall", None)
    if getall is not None:
        got: list[str] = getall(name, [])
        return got
    value = headers.get(name)
    return [] if value is None else [value]
