"""The ``other`` dialect: any response llmtop does not understand.

Nothing is parsed. The first non-empty read counts as one content event (so TTFT is the
time to the first byte) carrying no tokens; there is no usage, model or error. An error
response (``timed=False``: status 400 or more) has no content event, as in every other
dialect: a 404 page is not a first token.
"""

from __future__ import annotations

from llmtop.proxy.dialects._common import ZERO, ParserState

__all__ = ["PlainParser"]


class PlainParser(ParserState):
    """Times a body without reading it."""

    __slots__ = ("_seen",)

    def __init__(self, timed: bool = True) -> None:
        super().__init__()
        self._seen = not timed

    buffered_bytes = 0
    """Nothing is ever held."""

    def feed(self, data: bytes) -> tuple[int, int]:
        if data and not self._seen:
            self._seen = True
            return (1, 0)
        return ZERO

    def finish(self) -> tuple[int, int]:
        return ZERO
