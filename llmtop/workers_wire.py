"""The private wire format between ``llmtop run --workers N``'s workers and their
coordinator (see :mod:`llmtop.workers`).

The ingest wire format (:func:`encode_batch` / :func:`decode_batch`) is private to one
llmtop version talking to itself: a pickle (protocol 5) of plain tuples — each finished
request as the values of its fields in order (``RECORD_FIELDS``), each open request likewise
(``ACTIVE_FIELDS``). JSON of ``to_json_dict`` dicts cost a worker about 230 µs per 32-chunk
record (``dataclasses.asdict`` deep-copying, then every float through ``repr``) and the
coordinator 70 µs to rebuild it; the tuples cost about 2 and 6 µs, and a float survives
bit for bit. The coordinator unpickles with :class:`PlainUnpickler`, which refuses every
global (no class, no function: only tuples, lists, dicts, str, bytes, numbers, bools and
None can be built, so nothing runs), then checks every field's type before it publishes
anything; a payload that fails gets 400.
"""

from __future__ import annotations

import dataclasses
import io
import operator
import pickle
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any

from llmtop.events import (
    DIALECTS,
    OUTCOMES,
    ActiveRequest,
    ChunkSlice,
    EngineReading,
    Event,
    GpuReading,
    RequestRecord,
    WarningEvent,
)

INGEST_PATH = "/llmtop/v1/_ingest"
WIRE_VERSION = "llmtop-ingest/4"
"""First item of every ingest payload: a worker of another llmtop version gets 400."""
ACTIVE_FIELDS = tuple(f.name for f in dataclasses.fields(ActiveRequest)
                      if f.metadata.get("wire", True))
"""The fields of an open request that travel (not those only its own process has, such as
its stream's parser)."""
_ACTIVE_READ = {"prompt_tokens": "prompt_so_far", "upstream_id": "upstream_id_so_far"}
"""What a worker ships for a field: the prompt's size and the engine's id of the request as
its stream's parser has them now (read here, twice a second, rather than copied from the
parser as each read is parsed)."""
ACTIVE_ROW = operator.attrgetter(*(_ACTIVE_READ.get(n, n) for n in ACTIVE_FIELDS))
"""An open request as a tuple of its fields (a fifth of ``dataclasses.asdict``'s cost,
which recursed and deep-copied; a worker ships every open request twice a second)."""
RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(RequestRecord))
RECORD_ROW = operator.attrgetter(*RECORD_FIELDS)
"""A finished request as a tuple of its fields (its tuples of chunk offsets and counts are
immutable, so they are shipped as they are, not copied)."""
TOKEN_HEADER = "X-LLMTOP-Ingest-Token"
MAX_BODY = 64 * 1024 * 1024
"""The largest ingest payload the coordinator reads (a worker sends at most
``BATCH_CHUNKS`` chunk offsets per POST, a few MiB)."""
BATCH_EVENTS = 20_000
BATCH_CHUNKS = 400_000
"""A worker's POST carries at most this many events, and stops adding records once their
chunks reach this many (a backlog after the coordinator was busy goes in several POSTs)."""

_STR = (str,)
_OPT_STR = (str, type(None))
_BOOL = (bool,)
_INT = (int,)
_OPT_INT = (int, type(None))
_REAL = (float, int)
_OPT_REAL = (float, int, type(None))
_TUPLE = (tuple,)
_TYPES: dict[str, tuple[type, ...]] = {
    "id": _STR, "user": _STR, "model": _OPT_STR, "dialect": _STR, "path": _STR,
    "stream": _BOOL, "status": _INT, "outcome": _STR, "t_start": _REAL, "ttft_s": _OPT_REAL,
    "e2e_s": _REAL, "prompt_tokens": _OPT_INT, "completion_tokens": _OPT_INT,
    "token_source": _STR, "chunk_offsets_s": _TUPLE, "chunk_tokens": _TUPLE,
    "concurrency_at_start": _INT, "error": _OPT_STR, "upstream_id": _OPT_STR,
    "t0_ns": _INT, "first_token_ns": _OPT_INT, "last_chunk_ns": _OPT_INT, "chunks": _INT,
    "tokens": _INT,
}
RECORD_TYPES = tuple(_TYPES[n] for n in RECORD_FIELDS)
ACTIVE_TYPES = tuple(_OPT_INT if n == "status" else _TYPES[n] for n in ACTIVE_FIELDS)
"""(An open request's ``status`` is None until its response head has gone out.)"""
TOKEN_SOURCES = frozenset(("usage", "chunks", "estimate"))
_I_DIALECT = RECORD_FIELDS.index("dialect")
_I_OUTCOME = RECORD_FIELDS.index("outcome")
_I_SOURCE = RECORD_FIELDS.index("token_source")
_I_OFFSETS = RECORD_FIELDS.index("chunk_offsets_s")
_I_TOKENS = RECORD_FIELDS.index("chunk_tokens")
_A_DIALECT = ACTIVE_FIELDS.index("dialect")


class IngestError(ValueError):
    """An ingest payload that is not what this llmtop version's workers send."""


class PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only: every global (class, function) is refused, so nothing
    can be called while loading."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def event_from_json(d: Mapping[str, Any]) -> Event | None:
    kind = d.get("type")
    if kind == "request":
        return RequestRecord.from_json_dict(dict(d))
    if kind == "gpu":
        return GpuReading.from_json_dict(dict(d))
    if kind == "engine":
        return EngineReading.from_json_dict(dict(d))
    if kind == "warning":
        return WarningEvent.from_json_dict(dict(d))
    if kind == "chunks":  # an open stream's latest chunks (checked field by field)
        return ChunkSlice.from_json_dict(dict(d))
    return None


def record_from_row(row: Any) -> RequestRecord:
    """A RequestRecord from the values of ``RECORD_FIELDS`` (checked: IngestError if not)."""
    if (type(row) is not tuple or len(row) != len(RECORD_FIELDS)
            or not all(map(isinstance, row, RECORD_TYPES))
            or row[_I_DIALECT] not in DIALECTS or row[_I_OUTCOME] not in OUTCOMES
            or row[_I_SOURCE] not in TOKEN_SOURCES
            or not all(map(isinstance, row[_I_OFFSETS], repeat(_REAL)))
            or not all(map(isinstance, row[_I_TOKENS], repeat(_INT)))):
        raise IngestError("malformed request record")
    return RequestRecord(*row)


def active_from_row(row: Any) -> ActiveRequest:
    """An ActiveRequest from the values of ``ACTIVE_FIELDS`` (checked: IngestError if not)."""
    if (type(row) is not tuple or len(row) != len(ACTIVE_FIELDS)
            or not all(map(isinstance, row, ACTIVE_TYPES)) or row[_A_DIALECT] not in DIALECTS):
        raise IngestError("malformed open request")
    return ActiveRequest(*row)


def encode_batch(worker: int, dropped: int, events: Sequence[Event],
                 active: Sequence[ActiveRequest], *, sender: str = "", seq: int = 0) -> bytes:
    """A worker's ingest payload: finished requests as field tuples, any other event as its
    ``to_json_dict`` dict (in order), and the open requests as field tuples. ``sender`` (one
    per worker process) and ``seq`` (1, 2, ... per POST) let the coordinator take a POST
    that is sent again, after its reply was lost, only once."""
    row = RECORD_ROW
    items = [row(ev) if type(ev) is RequestRecord else ev.to_json_dict() for ev in events]
    arow = ACTIVE_ROW
    return pickle.dumps((WIRE_VERSION, worker, sender, seq, dropped, items,
                         [arow(a) for a in active]), protocol=5)


@dataclasses.dataclass
class IngestBatch:
    """A decoded ingest payload (see :func:`encode_batch`)."""

    worker: int
    sender: str
    seq: int
    dropped: int
    events: list[Event]
    active: list[ActiveRequest]


def decode_batch(body: bytes) -> IngestBatch:
    """The coordinator's side of :func:`encode_batch`; IngestError for anything else."""
    try:
        data = PlainUnpickler(io.BytesIO(body)).load()
    except Exception as exc:  # any malformed pickle: truncated, bad opcode, refused global
        raise IngestError(f"not an ingest payload ({type(exc).__name__})") from None
    if type(data) is not tuple or len(data) != 7 or data[0] != WIRE_VERSION:
        raise IngestError(f"not an ingest payload of this llmtop version ({WIRE_VERSION})")
    _, worker, sender, seq, dropped, items, rows = data
    if (type(worker) is not int or type(sender) is not str or type(seq) is not int
            or type(dropped) is not int or type(items) is not list or type(rows) is not list):
        raise IngestError("malformed ingest payload")
    events: list[Event] = []
    for it in items:
        if type(it) is tuple:
            events.append(record_from_row(it))
        elif type(it) is dict:
            try:
                ev = event_from_json(it)
            except (ValueError, KeyError, TypeError) as exc:
                raise IngestError(f"malformed event: {exc}") from None
            if ev is not None:
                events.append(ev)
        else:
            raise IngestError("malformed event")
    return IngestBatch(worker, sender, seq, dropped, events, [active_from_row(r) for r in rows])
