"""Who made a request ("Who is the user" in shared/docs/interfaces.md).

First match wins: the configured header (default ``X-LLMTOP-User``), the request body's
``user`` field (OpenAI), the API key (``Authorization: Bearer …`` or ``x-api-key``) as a
salted-hash pseudonym ``key:`` + 8 hex digits, then the client address. Names are always
valid text (bytes that are not UTF-8 become U+FFFD). A raw key is never
stored or returned: it is hashed with a salt (``user_salt`` from the config, else random per
process — pseudonyms are then stable only for the life of the process).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Final

from llmtop.proxy.dialects._common import as_text

MAX_USER_LEN: Final = 128
"""Longer header or body values are cut (a user id, not a payload)."""


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


class IdentityResolver:
    """Maps a request to its user name; one per proxy (it holds the salt)."""

    __slots__ = ("_header", "_salt", "header_names")

    def __init__(self, user_header: str, salt: str | bytes = "") -> None:
        self._header = user_header
        if isinstance(salt, str):
            salt = salt.encode()
        self._salt = salt or os.urandom(32)
        self.header_names: frozenset[bytes] = frozenset(
            {b"authorization", b"x-api-key"}
            | ({user_header.lower().encode("latin-1", "replace")} if user_header else set()))
        """The only headers :meth:`resolve` reads (lower-case): a request read by hand
        need not decode the others."""

    def api_key(self, headers: Mapping[str, str]) -> str | None:
        """The credential a request carries: a Bearer token, else ``x-api-key``, else the
        whole ``Authorization`` value for other schemes."""
        auth = headers.get("Authorization")
        if auth:
            scheme, _, token = auth.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        xkey = headers.get("x-api-key")
        if xkey and xkey.strip():
            return xkey.strip()
        if auth and auth.strip():
            return auth.strip()
        return None

    def resolve(
        self, headers: Mapping[str, str], body_user: str | None, remote: str | None
    ) -> str:
        """The user for one request (never a raw key)."""
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
        return remote or "unknown"
