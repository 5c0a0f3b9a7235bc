"""A recording compressed with something other than gzip is told as such, with what to
do, not as 'not an llmtop recording (the first line is not JSON)'."""

from __future__ import annotations

import bz2
import lzma
import zipfile
from pathlib import Path

import pytest
from rec_helpers import session, write_recording

from llmtop.cli import main
from llmtop.recording.errors import RecordingError
from llmtop.recording.reader import RecordingReader


def _zip(data: bytes, path: Path) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("rec.jsonl", data)


KINDS = {
    "xz": (lambda d, p: p.write_bytes(lzma.compress(d)), "xz -d"),
    "bz2": (lambda d, p: p.write_bytes(bz2.compress(d)), "bzip2 -d"),
    "zst": (lambda d, p: p.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(64)), "zstd -d"),
    "zip": (_zip, "unzip"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_another_compression_is_named(tmp_path: Path, kind: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "r.jsonl"
    write_recording(plain, session(5, duration_s=2))
    make, tool = KINDS[kind]
    path = tmp_path / f"r.jsonl.{kind}"
    make(plain.read_bytes(), path)
    name = {"bz2": "bzip2", "zst": "zstd"}.get(kind, kind)
    want = (f"r.jsonl.{kind}: compressed with {name}, which llmtop does not read (only "
            f"gzip): decompress it first ({tool})")
    with pytest.raises(RecordingError) as e:
        RecordingReader(path)
    assert str(e.value) == want
    assert main(["report", str(path), "-q"]) == 2
    assert capsys.readouterr().err.strip() == f"llmtop report: error: {want}"
