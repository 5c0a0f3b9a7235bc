"""A recording as Parquet tables for DuckDB, pandas, Polars or Spark.

``requests.parquet``, ``gpu.parquet``, ``engine.parquet`` and ``warnings.parquet`` — always
all four (an empty table keeps its schema). Written in row groups of ``batch_rows`` while
the recording streams past, so memory stays bounded; each file is written under a temporary
name and renamed at the end, so a failed export leaves no half file behind.

Columns follow the recording's field names (``shared/docs/interfaces.md``); times are unix
seconds (``float64``) plus a ``time`` column as a UTC timestamp for SQL engines. Requests
carry their derived figures too (``t_end``, ``tpot_s``, ``tps``) and their chunk offsets
and tokens as list columns.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from llmtop.events import EngineReading, GpuReading, RequestRecord, WarningEvent
from llmtop.recording.errors import RecordingError
from llmtop.recording.parts import Source, open_recording
from llmtop.recording.paths import PARQUET_TABLES, part_path
from llmtop.recording.reader import Progress

_TS = pa.timestamp("us", tz="UTC")

REQUESTS_SCHEMA: Final = pa.schema([
    ("id", pa.string()), ("user", pa.string()), ("model", pa.string()),
    ("dialect", pa.string()), ("path", pa.string()), ("stream", pa.bool_()),
    ("status", pa.int32()), ("outcome", pa.string()), ("t_start", pa.float64()),
    ("time", _TS), ("t_end", pa.float64()), ("ttft_s", pa.float64()), ("e2e_s", pa.float64()),
    ("tpot_s", pa.float64()), ("tps", pa.float64()), ("prompt_tokens", pa.int64()),
    ("completion_tokens", pa.int64()), ("token_source", pa.string()),
    ("chunk_offsets_s", pa.list_(pa.float64())), ("chunk_tokens", pa.list_(pa.int64())),
    ("concurrency_at_start", pa.int64()), ("error", pa.string()),
    ("upstream_id", pa.string()),
])
GPU_SCHEMA: Final = pa.schema([
    ("t", pa.float64()), ("time", _TS), ("index", pa.int32()), ("name", pa.string()),
    ("mem_used_bytes", pa.int64()), ("mem_total_bytes", pa.int64()),
    ("util_gpu", pa.float64()), ("mem_busy", pa.float64()), ("dram_bw_util", pa.float64()),
    ("power_w", pa.float64()), ("simulated", pa.bool_()), ("sm_activity", pa.float64()),
    ("power_limit_w", pa.float64()), ("sm_clock_mhz", pa.float64()),
    ("mem_clock_mhz", pa.float64()), ("temperature_c", pa.float64()),
    ("pcie_rx_bytes_s", pa.float64()), ("pcie_tx_bytes_s", pa.float64()),
])
ENGINE_SCHEMA: Final = pa.schema([
    ("t", pa.float64()), ("time", _TS), ("kind", pa.string()), ("running", pa.float64()),
    ("waiting", pa.float64()), ("kv_cache_usage", pa.float64()), ("preemptions", pa.float64()),
    ("ttft_buckets", pa.list_(pa.struct([("le", pa.float64()), ("count", pa.float64())]))),
    ("raw", pa.map_(pa.string(), pa.float64())),
])
WARNINGS_SCHEMA: Final = pa.schema([
    ("t", pa.float64()), ("time", _TS), ("code", pa.string()), ("severity", pa.string()),
    ("message", pa.string()), ("state", pa.string()), ("since", pa.float64()),
])


def _ts(t: float | None) -> int | None:
    return None if t is None else round(t * 1e6)


def _request_row(r: RequestRecord) -> dict[str, Any]:
    d = r.to_json_dict()
    del d["type"]
    d["time"] = _ts(r.t_start)
    d["t_end"] = r.t_start + r.e2e_s
    d["tpot_s"] = r.tpot_s()
    d["tps"] = r.tps()
    return d


def _gpu_row(g: GpuReading) -> dict[str, Any]:
    d = g.to_json_dict()
    del d["type"]
    d["time"] = _ts(g.t)
    return d


def _engine_row(e: EngineReading) -> dict[str, Any]:
    return {
        "t": e.t, "time": _ts(e.t), "kind": e.kind, "running": e.running,
        "waiting": e.waiting, "kv_cache_usage": e.kv_cache_usage, "preemptions": e.preemptions,
        "ttft_buckets": [{"le": le, "count": c} for le, c in e.ttft_buckets],
        "raw": list(e.raw.items()),
    }


def _warning_row(w: WarningEvent) -> dict[str, Any]:
    d = w.to_json_dict()
    del d["type"]
    d["time"] = _ts(w.t)
    d["since"] = w.since  # (null but for a warning a rotated part carried in)
    return d


BATCH_CELLS = 200_000
"""A row group is also written once its rows' list cells (chunk offsets and tokens) reach
this many: 50,000 rows of 2,000-chunk answers held ~7 GB before (QA soak)."""


class _Table:
    """Rows buffered and written to one Parquet file in row groups."""

    def __init__(self, path: Path, schema: pa.Schema, batch_rows: int) -> None:
        self.path = path
        self.tmp = part_path(path)
        self.schema = schema
        self.batch_rows = batch_rows
        self.rows: list[dict[str, Any]] = []
        self.cells = 0
        self.count = 0
        self.writer = pq.ParquetWriter(str(self.tmp), schema, compression="zstd")

    def add(self, row: dict[str, Any], cells: int = 0) -> None:
        self.rows.append(row)
        self.cells += cells
        if len(self.rows) >= self.batch_rows or self.cells >= BATCH_CELLS:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        table = pa.Table.from_pylist(self.rows, schema=self.schema)
        try:
            self.writer.write_table(table)
        except OSError as exc:
            raise self._failed(exc) from None
        self.count += len(self.rows)
        self.rows = []
        self.cells = 0

    def finish(self) -> None:
        """Write what is left and the file's footer, under its temporary name (where a
        full disk or the file size limit fails: before any table is renamed)."""
        self.flush()
        try:
            if self.count == 0:
                self.writer.write_table(self.schema.empty_table())
            self.writer.close()
        except OSError as exc:
            raise self._failed(exc) from None

    def commit(self) -> None:
        """Rename the finished file into place."""
        os.replace(self.tmp, self.path)

    def _failed(self, exc: OSError) -> OSError:
        """A failed write as an error naming this table (pyarrow's name none)."""
        if exc.filename is not None:
            return exc
        why = f"cannot write: {os.strerror(exc.errno)}" if exc.errno else str(exc)
        return OSError(exc.errno, why, str(self.path))

    def abort(self) -> None:
        """Close and remove the ``.part`` file. A close that fails (the disk full or the
        file size limit reached: its footer cannot be written either) is let go and
        marked closed, so that no other table's ``.part`` is left behind and pyarrow's
        ``__del__`` does not try again (it printed a traceback at exit)."""
        try:
            self.writer.close()
        except OSError:
            self.writer.is_open = False
        finally:
            self.tmp.unlink(missing_ok=True)


TABLES: Final = PARQUET_TABLES


def export_parquet(
    recording: Source,
    out_dir: str | Path,
    *,
    batch_rows: int = 50_000,
    progress: Progress | None = None,
    summary: dict[str, Any] | None = None,
) -> dict[str, int]:
    """Write the four tables into ``out_dir`` (created if missing — its parent must exist,
    as ``--hlog``'s and ``report -o``'s must: a mistyped path is not made; existing files of the
    same names are replaced). Returns ``{table: rows}``. :class:`RecordingError` for an
    unreadable recording or an unwritable directory. ``summary``, when given, is filled with
    the reader's :meth:`~RecordingReader.summary` (lines skipped, footer or not)."""
    out = Path(out_dir)
    with open_recording(recording, progress=progress) as reader:
        try:
            out.mkdir(exist_ok=True)
        except FileNotFoundError as exc:
            if out.parent.is_dir():  # (a file system that makes nothing: /proc, /sys)
                raise RecordingError(f"{out}: cannot create directory: {exc.strerror}"
                                     ) from None
            raise RecordingError(f"{out}: cannot write: no directory {out.parent}") from None
        except FileExistsError:
            raise RecordingError(f"{out}: exists and is not a directory") from None
        except OSError as exc:
            raise RecordingError(f"{out}: cannot create directory: {exc.strerror}") from None
        if not os.access(out, os.W_OK):
            raise RecordingError(f"{out}: directory is not writable")
        for name in TABLES:  # (told now, not after reading the whole recording)
            if (out / f"{name}.parquet").is_dir():
                raise RecordingError(f"{out / f'{name}.parquet'}: is a directory")
        schemas = {"requests": REQUESTS_SCHEMA, "gpu": GPU_SCHEMA, "engine": ENGINE_SCHEMA,
                   "warnings": WARNINGS_SCHEMA}
        tables: dict[str, _Table] = {}
        opening: Path | None = None  # a table's .part made but the table not yet held
        try:
            for name in TABLES:
                opening = part_path(out / f"{name}.parquet")
                tables[name] = _Table(out / f"{name}.parquet", schemas[name], batch_rows)
            opening = None
            rows: dict[type, tuple[_Table, Callable[[Any], dict[str, Any]]]] = {
                RequestRecord: (tables["requests"], _request_row),
                GpuReading: (tables["gpu"], _gpu_row),
                EngineReading: (tables["engine"], _engine_row),
                WarningEvent: (tables["warnings"], _warning_row),
            }
            for ev in reader:
                table, fn = rows[type(ev)]
                table.add(fn(ev), len(ev.chunk_offsets_s) if isinstance(ev, RequestRecord)
                          else 0)
            # every table finished before any is renamed: a table that cannot be finished
            # leaves the directory as it was, not holding the tables before it alone (or
            # beside an older export's others)
            for t in tables.values():
                t.finish()
            for t in tables.values():
                t.commit()
            if summary is not None:
                summary.update(reader.summary())
        except BaseException:
            for t in tables.values():
                if t.tmp.exists():
                    t.abort()
            if opening is not None:  # Ctrl-C or SIGTERM while a table was being opened
                opening.unlink(missing_ok=True)
            raise
    return {name: t.count for name, t in tables.items()}
