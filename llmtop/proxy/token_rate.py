"""Tokens per counted event, learned per model in the proxy, for streams without usage.

Engines that pack several tokens into one stream event (vLLM/SGLang with a stream interval
above 1, speculative decoding, llama.cpp under load) report the true count in their final
``usage``. A stream that ends before it (the client cancelled, the stream broke off, the
client did not ask for usage) is otherwise counted one token per content event: 7 events
of 3 tokens become 7 tokens, not ~21, and output tokens/s and per-user totals come out too
low exactly when users cancel.

:class:`TokenRates` learns, per model, the engine's tokens per token counted by the parser
(one per content event unless the stream says exactly: continuous usage, Ollama/TGI) after
the first, from finished streams that did carry usage, and :meth:`TokenRates.estimate`
scales a stream without usage by it. The first content event is the first token (what
prefill produces: one token, even from engines that pack several into later events — the
rule ``relay.scale_tokens`` keeps), so a stream of ``E`` events and ``n`` tokens teaches
``(n - 1) / (E - 1)`` and ``E'`` events are estimated as ``1 + (E' - 1) × rate``: exact for a
stream interval of ``k`` (``1 + (E - 1)k`` tokens), where ``E' × n / E`` over-counted a
short stream by up to ``k - 1`` (seen against ``llmtop sim``). The learning rule is the
metrics aggregator's live tokens-per-event rule (``llmtop.metrics.aggregator``): a model's
first stream sets the rate, later ones move it by :data:`RATE_ALPHA`, samples are clamped
to [:data:`RATE_MIN`, :data:`RATE_MAX`], and a rate within :data:`UNIT_BAND` of 1 is 1
(then there is nothing to estimate). The proxy keeps its own copy because the aggregator
runs in another layer, thread, and with ``--workers`` in another process; each proxy
process learns on its own. ``llmtop bench``'s client keeps one too, learned from its own
streams, so a broken stream counts the same at the client as at a proxy in front.

It runs once per finished request (from ``Exchange.to_record``), never per chunk; it is
used from the proxy's event loop only (no lock).
"""

from __future__ import annotations

from typing import Final

RATE_ALPHA: Final = 0.3
"""Weight of a finished stream in its model's rate."""
RATE_MIN_EVENTS: Final = 8
"""Streams with fewer tokens counted teach nothing (too coarse a ratio)."""
RATE_MODELS: Final = 64
"""Models whose rate is remembered (a flood of model names cannot grow memory)."""
RATE_MIN: Final = 0.5
RATE_MAX: Final = 64.0
UNIT_BAND: Final = 0.02
"""A rate this close to 1 is 1: the counts need no estimate."""
UNNAMED: Final = "unknown"
"""The key of answers that name no model."""


def next_rate(old: float | None, sample: float) -> float:
    """``old`` moved towards ``sample`` (the first sample sets it), clamped, snapped to 1.0
    within :data:`UNIT_BAND` — the aggregator's ``_learn_tpe`` step."""
    sample = min(max(sample, RATE_MIN), RATE_MAX)
    new = sample if old is None else old + RATE_ALPHA * (sample - old)
    return 1.0 if abs(new - 1.0) < UNIT_BAND else new


class TokenRates:
    """Per model: the engine's output tokens per token the parser counted, after the first
    (see the module docstring). One per proxy process."""

    __slots__ = ("_rates",)

    def __init__(self) -> None:
        self._rates: dict[str, float] = {}

    def learn(self, model: str | None, usage_tokens: int, counted: int) -> None:
        """A finished stream of ``model`` whose usage said ``usage_tokens`` and whose
        content events counted ``counted`` tokens (at least :data:`RATE_MIN_EVENTS`)."""
        if counted < RATE_MIN_EVENTS or usage_tokens <= 0:
            return
        key = model or UNNAMED
        rates = self._rates
        old = rates.get(key)
        if old is None and len(rates) >= RATE_MODELS:
            return
        rates[key] = next_rate(old, (usage_tokens - 1) / (counted - 1))

    def rate(self, model: str | None) -> float | None:
        """``model``'s learned rate (None: nothing learned yet)."""
        return self._rates.get(model or UNNAMED)

    def estimate(self, model: str | None, counted: int) -> int | None:
        """The output tokens of a stream of ``model`` that counted ``counted`` tokens and
        ended without usage: the first, and ``counted - 1`` more at the learned rate
        (rounded); None when no rate is learned, the rate is 1, or nothing was counted
        (keep the plain count)."""
        r = self._rates.get(model or UNNAMED)
        if r is None or r == 1.0 or counted <= 0:
            return None
        return 1 + int((counted - 1) * r + 0.5)

    def __len__(self) -> int:
        return len(self._rates)
