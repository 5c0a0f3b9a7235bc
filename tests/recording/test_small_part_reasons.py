"""A file named like a part that is no readable part is left out and told — with why. A
part whose bytes never reached the disk (zero-filled after a power loss) and one
compressed with xz or zstd were told "does not begin with a part's header", which sent the
user looking for the wrong damage; a file read alone says what such compression is."""

from __future__ import annotations

import lzma
from collections.abc import Callable
from pathlib import Path

import pytest
from rec_helpers import feed

from llmtop.cli import main
from llmtop.recording.parts import Series, resolve
from llmtop.recording.writer import Recorder


def rotated(stem: Path) -> list[Path]:
    """A run's parts in order (the real Recorder, rotating every ~3 kB)."""
    rec = Recorder(stem, header={"upstream": "http://127.0.0.1:9/v1", "slo": {"ttft_s": 0.5}},
                   flush_s=0.1, order_hold_s=0.0, rotate_bytes=3000)
    rec.start()
    feed(rec, 60)
    rec.stop()
    src = resolve(stem)
    assert isinstance(src, Series) and not src.missing and len(src.files) >= 4, src
    return list(src.files)


def _zeros(p: Path) -> str:
    p.write_bytes(b"\0" * p.stat().st_size)
    return "begins with nothing but zero bytes (its data never reached the disk: a crash?)"


def _xz(p: Path) -> str:
    p.write_bytes(lzma.compress(p.read_bytes()))
    return ("is compressed with xz, which llmtop does not read (only gzip): decompress it "
            "first (xz -d)")


def _zstd(p: Path) -> str:
    p.write_bytes(b"\x28\xb5\x2f\xfd" + p.read_bytes())  # (the magic is what is looked at)
    return ("is compressed with zstd, which llmtop does not read (only gzip): decompress "
            "it first (zstd -d)")


@pytest.mark.parametrize("damage", [_zeros, _xz, _zstd])
def test_a_part_left_out_is_told_with_its_real_reason(
        tmp_path: Path, damage: Callable[[Path], str],
        capsys: pytest.CaptureFixture[str]) -> None:
    stem = tmp_path / "p.jsonl"
    parts = rotated(stem)
    why = damage(parts[1])
    src = resolve(stem)
    assert isinstance(src, Series) and parts[1] not in src.files
    said = [n for n in src.notes if parts[1].name in n]
    assert said == [f"{stem}: {parts[1].name} is named like one of its parts but {why}: "
                    "left out"], src.notes
    capsys.readouterr()
    assert main(["report", str(stem), "--format", "json", "-o",
                 str(tmp_path / "r.json")]) == 0
    err = capsys.readouterr().err
    assert why in err
    assert f"part 2 of {len(parts)} missing (deleted, or in a file left out)" in err
