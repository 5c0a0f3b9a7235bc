"""The samples of Prometheus text exposition (format 0.0.4), read with two regular expressions.

An engine's ``/metrics`` is scraped every second, on the observers' thread, which shares the
interpreter lock with the forwarding loop: what the scrape costs is taken from forwarding.
``prometheus_client.parser`` reads labels one character at a time (about 4 ms for a 7 KB vLLM
exposition on this project's 2-core machine); this reads a sample line with one match and its
labels with one ``finditer``, several times faster, with the same results (a test compares
both parsers on the fixtures and on generated text).

Only what :mod:`llmtop.engines.recognise` needs: sample name (as written), labels and value.
``# HELP``/``# TYPE`` and other comments (OpenMetrics' ``# EOF`` too) are skipped; an optional
timestamp and an OpenMetrics exemplar are ignored. A line
that is not a sample raises ``ValueError`` (an HTML page or a JSON body instead of metrics).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator

# Possessive quantifiers (*+ ++) throughout: each run of blanks or characters has one
# reading, so a line that does not match fails in linear time. With plain ones the blanks
# after the name could be split between ``[ \t]*`` and ``[ \t]+`` in every way: a line of
# a name, 100,000 blanks and "x y z" took a minute of CPU to refuse.
_SAMPLE = re.compile(
    r'[ \t]*+([a-zA-Z_:][a-zA-Z0-9_:]*+)'                                # name
    r'(?:[ \t]*+\{((?:[^"}]++|"(?:[^"\\]++|\\.)*+")*+)\})?+'           # {labels}: "" may hold }
    r'[ \t]++([^ \t]++)(?:[ \t]++[^ \t#][^ \t]*+)?+'                     # value, timestamp
    r'(?:[ \t]++\#[ \t]*+\{(?:[^"}]++|"(?:[^"\\]++|\\.)*+")*+\}'          # exemplar: {labels}
    r'[ \t]++[^ \t]++(?:[ \t]++[^ \t]++)?+)?+'                              # value, timestamp
    r'[ \t]*+\r?'
)
"""A sample line; an OpenMetrics exemplar after the value (``# {trace_id="..."} 0.05 ts``,
on a bucket or a counter: an exporter that serves OpenMetrics whatever is asked, with
tracing on) is read past, as prometheus_client's parsers do: before, its first one failed
the whole scrape."""
# A label value is read a run of plain characters at a time (``[^"\\]++``), not one
# character per alternation: that pushed a backtracking point per character, and a valid
# line with an 8 MB label value took 2.4 s of CPU in one call holding the interpreter lock.
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*+)[ \t]*+=[ \t]*+"((?:[^"\\]++|\\.)*+)"')
_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*+[ \t]*+=[ \t]*+"(?:[^"\\]++|\\.)*+"[ \t]*+'
_LABELS = re.compile(  # the whole block: pairs separated by commas, a trailing comma allowed
    rf'[ \t]*+(?:{_PAIR},[ \t]*+)*+(?:{_PAIR})?+')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: _ESCAPED.get(m.group(1), "\\" + m.group(1)), value)


def _labels(block: str, i: int) -> dict[str, str]:
    if _LABELS.fullmatch(block) is None:
        raise ValueError(f"line {i}: bad labels {{{block[:80]}}}")
    if "\\" not in block:
        return dict(_LABEL.findall(block))
    return {k: _unescape(v) for k, v in _LABEL.findall(block)}


def iter_samples(text: str, keep_buckets: Collection[str] | None = None
                 ) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in ``text``, in order; the ``_bucket`` samples
    of a histogram whose base name is not in ``keep_buckets`` are skipped unread (None: all
    kept). Raises ValueError at the first line that is not a sample or a comment."""
    match = _SAMPLE.fullmatch
    # not splitlines: a label value may hold \r, \x1c, \u2028...
    for i, line in enumerate(text.split("\n"), 1):
        s = line.lstrip(" \t")
        if not s or s[0] == "#" or s == "\r":  # "\r": a blank line of CRLF text
            continue
        m = match(s)
        if m is None:
            raise ValueError(f"line {i}: {line[:80]!r}")
        name, block, raw = m.groups()
        if keep_buckets is not None and name.endswith("_bucket") and (
                name[:-7] not in keep_buckets):
            continue
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"line {i}: bad value {raw[:40]!r}") from None
        yield name, (_labels(block, i) if block else {}), value
