"""Per-request fault injection: the ``X-Sim-Fault`` request header.

Several faults may be combined, separated by commas, e.g.
``X-Sim-Fault: slow-headers:200, stall:500@3``.

============================  ==========================================================
``status:CODE``               answer ``CODE`` (400–599) at once with the dialect's error
                              body (``429`` adds ``Retry-After: 1``); nothing reaches
                              the engine
``disconnect-after:N``        drop the connection (TCP abort) after N content chunks;
                              non-streaming: once N tokens are generated, with no body;
                              an answer shorter than N ends normally
``malformed-after:N``         after N content chunks, send one broken-JSON event/line,
                              then carry on; non-streaming: a truncated JSON body
``stall:MS`` / ``stall:MS@N``  pause MS milliseconds after content chunk N (default 1)
                              while the engine carries on (the backlog then arrives);
                              non-streaming: the body is held MS longer
``slow-headers:MS``           send the response headers MS after the request arrived
                              (the engine works meanwhile)
============================  ==========================================================

Fault durations are wall-clock milliseconds; ``time_scale`` does not apply to them.
"""

from __future__ import annotations

from dataclasses import dataclass

HEADER = "X-Sim-Fault"


@dataclass(frozen=True, slots=True)
class Faults:
    """The parsed header; every field None/absent when that fault was not asked for."""

    status: int | None = None
    disconnect_after: int | None = None
    malformed_after: int | None = None
    stall_s: float | None = None
    stall_after: int = 1
    slow_headers_s: float | None = None

    @property
    def any_mid_stream(self) -> bool:
        """True when a fault acts after some chunk count."""
        return (self.disconnect_after is not None or self.malformed_after is not None
                or self.stall_s is not None)

    def hits(self, chunks: int) -> bool:
        """True when a mid-stream fault acts right after content chunk number ``chunks``."""
        return chunks in (self.disconnect_after, self.malformed_after) or (
            self.stall_s is not None and chunks == self.stall_after)


NONE = Faults()


def _int(name: str, text: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{HEADER} {name}:{text}: '{text}' is not a whole number") from None
    if value < low or (high is not None and value > high):
        bound = f"{low}–{high}" if high is not None else f"≥ {low}"
        raise ValueError(f"{HEADER} {name}:{text}: must be {bound}")
    return value


def parse_faults(header: str | None) -> Faults:
    """Parse an ``X-Sim-Fault`` value; ValueError (one line, naming the item) when bad."""
    if not header or not header.strip():
        return NONE
    status = disconnect = malformed = None
    stall_s = slow_s = None
    stall_after = 1
    for raw in header.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, arg = item.partition(":")
        name, arg = name.strip().lower(), arg.strip()
        if not sep or not arg:
            raise ValueError(f"{HEADER} item '{item}' must look like NAME:VALUE")
        if name == "status":
            status = _int(name, arg, 400, 599)
        elif name == "disconnect-after":
            disconnect = _int(name, arg, 0)
        elif name == "malformed-after":
            malformed = _int(name, arg, 0)
        elif name == "stall":
            ms, _, after = arg.partition("@")
            stall_s = _int(name, ms.strip(), 0) / 1000.0
            if after:
                stall_after = _int(name, after.strip(), 0)
        elif name == "slow-headers":
            slow_s = _int(name, arg, 0) / 1000.0
        else:
            raise ValueError(
                f"{HEADER} fault '{name}' is unknown (known: status, disconnect-after, "
                "malformed-after, stall, slow-headers)"
            )
    return Faults(status=status, disconnect_after=disconnect, malformed_after=malformed,
                  stall_s=stall_s, stall_after=stall_after, slow_headers_s=slow_s)
