"""The admin API: snapshot, requests, recording control and ``/metrics`` (aiohttp)."""

from typing import Final

AGE_HEADER: Final = "X-Llmtop-Age"
"""On snapshot and request-list answers: seconds since the answer was built (``0``: just
now; more when ``max_age`` let a shared one do). A client polling faster than its
``max_age`` keeps an answer until it is that old instead of asking for the same bytes
again (:class:`llmtop.tui.source.AdminSource` does)."""
