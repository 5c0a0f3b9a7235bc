"""Reading a gzip- or deflate-encoded response: its parser is fed a decompressed copy.

The client still receives the upstream's compressed bytes, unchanged and at once; only the
copy the parser reads is inflated, read by read (a read that completes no deflate block
yields nothing yet and is timed with the read that does — the bytes the client could
decode at that moment). A body that inflates past :data:`MAX_INFLATED` per read (a
decompression bomb) or is not valid compressed data stops being parsed and sets ``error``;
it is still relayed as sent. Encodings the standard library cannot read (``br``, ``zstd``)
are not wrapped: those bodies are timed as dialect ``other`` (see ``ProxyServer``).
"""

from __future__ import annotations

import zlib

from llmtop.proxy.dialects.base import StreamParser

MAX_INFLATED = 16 * 1024 * 1024
"""Most decompressed bytes one read may give the parser."""

INFLATABLE = frozenset({"gzip", "x-gzip", "deflate"})
"""Content-Encoding values this module reads."""


class InflatingParser:
    """A :class:`StreamParser` reading ``inner``'s dialect from a compressed body."""

    __slots__ = ("_d", "_head", "_inner", "ended", "error", "error_kind", "model",
                 "usage_completion_tokens", "usage_prompt_tokens", "usage_seen")

    def __init__(self, inner: StreamParser, encoding: str) -> None:
        self._inner = inner
        # gzip; for "deflate" zlib-wrapped deflate (what it means in HTTP) or the raw
        # deflate some servers send instead, told apart by the first two bytes
        self._d: zlib._Decompress | None = (zlib.decompressobj(47) if encoding != "deflate"
                                            else None)
        self._head: bytes | None = None if encoding != "deflate" else b""
        self.usage_prompt_tokens: int | None = None
        self.usage_completion_tokens: int | None = None
        self.model: str | None = None
        self.error: str | None = None
        self.error_kind: str | None = None
        self.usage_seen = False
        self.ended = False

    def _sync(self, got: tuple[int, int]) -> tuple[int, int]:
        inner = self._inner
        self.usage_prompt_tokens = inner.usage_prompt_tokens
        self.usage_completion_tokens = inner.usage_completion_tokens
        self.model = inner.model
        self.usage_seen = inner.usage_seen
        self.ended = inner.ended
        if self.error is None:
            self.error = inner.error
            self.error_kind = inner.error_kind
        return got

    @property
    def response_id(self) -> str | None:
        """``inner``'s, asked for when wanted (not copied per read: the OpenAI parser
        decodes it then)."""
        return self._inner.response_id

    @property
    def buffered_bytes(self) -> int:
        inner = getattr(self._inner, "buffered_bytes", 0)
        return int(inner) if isinstance(inner, int) else 0

    def _inflate(self, data: bytes) -> bytes:
        if self._head is not None:  # "deflate": which kind, once two bytes are here
            data = self._head + data
            if len(data) < 2:
                self._head = data
                return b""
            self._head = None
            zlib_header = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self._d = zlib.decompressobj(15 if zlib_header else -15)
        d = self._d
        if d is None or not data:
            return b""
        try:
            out = d.decompress(data, MAX_INFLATED)
        except zlib.error:
            return self._stop("malformed compressed body")
        if d.unconsumed_tail:
            return self._stop(f"compressed body inflates past {MAX_INFLATED} bytes in one "
                              "read; not parsed further")
        return out

    def _stop(self, why: str) -> bytes:
        self._d = None
        if self.error is None:
            self.error = why
        return b""

    def feed(self, data: bytes) -> tuple[int, int]:
        plain = self._inflate(data)
        return self._sync(self._inner.feed(plain)) if plain else (0, 0)

    def finish(self) -> tuple[int, int]:
        d = self._d
        events = toks = 0
        if d is not None:
            self._d = None
            try:
                rest = d.flush()
            except zlib.error:
                rest = b""
            if rest:
                events, toks = self._inner.feed(rest)
        e2, t2 = self._inner.finish()
        return self._sync((events + e2, toks + t2))
