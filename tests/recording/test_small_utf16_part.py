"""A part of a rotated recording re-saved as UTF-16 (Windows PowerShell's `>`, an editor).
`llmtop report PART` reads such a file whole (and says it is UTF-16), but the stem left the
part out as "does not begin with a part's header" and told its number as missing: its
requests were gone from the whole, for a reason that was not the one. The part is now read
as what it is, and which part is UTF-16 is said; a gzip part holding UTF-16, which the
reader cannot read, is left out as exactly that."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from rec_helpers import feed

from llmtop.cli import main
from llmtop.recording.parts import Series, open_recording, resolve
from llmtop.recording.writer import Recorder

N = 60
CODECS = {"bom": "utf-16", "le": "utf-16-le", "be": "utf-16-be"}


def rotated(stem: Path, rotate_bytes: int = 3000) -> list[Path]:
    """A run's parts in order (the real Recorder, rotating every ~3 kB)."""
    rec = Recorder(stem, header={"upstream": "http://127.0.0.1:9/v1", "slo": {"ttft_s": 0.5}},
                   flush_s=0.1, order_hold_s=0.0, rotate_bytes=rotate_bytes)
    rec.start()
    feed(rec, N)
    rec.stop()
    src = resolve(stem)
    assert isinstance(src, Series) and not src.missing and len(src.files) >= 4, src
    return list(src.files)


def _report(stem: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[
        dict[str, object], str]:
    out = tmp_path / "rep.json"
    capsys.readouterr()
    assert main(["report", str(stem), "--format", "json", "-o", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().err


@pytest.mark.parametrize("which", [0, 1, -1])
@pytest.mark.parametrize("codec", list(CODECS))
def test_a_utf16_part_is_read_and_named(tmp_path: Path, which: int, codec: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    stem = tmp_path / "p.jsonl"
    parts = rotated(stem)
    part = parts[which]
    part.write_bytes(part.read_text(encoding="utf-8").encode(CODECS[codec]))

    src = resolve(stem)
    assert isinstance(src, Series)
    assert src.files == tuple(parts) and not src.missing
    assert not any("left out" in n or "missing" in n for n in src.notes), src.notes
    with open_recording(src) as r:
        assert sum(1 for _ in r) == N
        s = r.summary()
    assert s["bad_lines"] == 0 and s["complete"]
    assert s["problems"][0].startswith(f"{part.name}: the file is UTF-16"), s["problems"]

    rep, err = _report(stem, tmp_path, capsys)
    assert rep["conditions"]["requests"] == N  # type: ignore[index]
    assert "missing" not in err and "left out" not in err


def test_which_part_is_utf16_is_said_past_other_parts_problems(tmp_path: Path) -> None:
    """Earlier parts' damaged lines fill the problems told (5): the UTF-16 part is still
    named, first."""
    stem = tmp_path / "p.jsonl"
    parts = rotated(stem)
    head, rest = parts[0].read_text().split("\n", 1)
    parts[0].write_text(head + "\n" + "not json\n" * 7 + rest)
    parts[2].write_bytes(parts[2].read_text(encoding="utf-8").encode("utf-16"))
    with open_recording(resolve(stem)) as r:
        assert sum(1 for _ in r) == N
        s = r.summary()
    assert s["bad_lines"] == 7
    assert s["problems"][0].startswith(f"{parts[2].name}: the file is UTF-16")
    assert len(s["problems"]) == 5


def test_a_gzip_part_holding_utf16_is_left_out_as_such(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stem = tmp_path / "p.jsonl.gz"
    parts = rotated(stem, rotate_bytes=300)  # (compressed bytes)
    part = parts[1]
    text = gzip.decompress(part.read_bytes()).decode("utf-8")
    part.write_bytes(gzip.compress(text.encode("utf-16")))

    src = resolve(stem)
    assert isinstance(src, Series) and part not in src.files
    note = next(n for n in src.notes if part.name in n)
    assert "is UTF-16 compressed with gzip, which llmtop does not read" in note
    assert "does not begin with a part's header" not in note
    _, err = _report(stem, tmp_path, capsys)
    assert f"{part.name} is named like one of its parts but is UTF-16 compressed" in err
    assert "part 2 of" in err and "missing" in err
