"""The workers' shared table on a full memory filesystem (``/dev/shm`` full: Docker gives a
container 64 MB of it, and NCCL and PyTorch on an inference host fill it). Creating a file
there still works, and so does mapping it; the first write to the page then kills the
process with SIGBUS — a worker at its first request, again at each restart, and the
coordinator itself when it clears a dead worker's slot. Now the table's bytes are
allocated when it is made (ENOSPC then, not SIGBUS later) and it goes to the next place,
the temporary directory."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmtop.fleet_counts import FleetCounts


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, filled (needs the right to mount: root, as on the CI machine)."""
    mnt = tmp_path / "shm"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                       capture_output=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        with open(mnt / "fill", "wb", buffering=0) as f, pytest.raises(OSError):
            while True:
                f.write(b"\0" * 4096)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_full_memory_filesystem_is_passed_over(full_tmpfs: Path, tmp_path: Path) -> None:
    spare = tmp_path / "spare"
    spare.mkdir()
    counts, path = FleetCounts.create(2, dirs=(str(full_tmpfs), str(spare)))
    try:
        assert Path(path).parent == spare
        # a worker maps it and counts an open request (in a process of its own: before,
        # this was SIGBUS)
        code = ("import sys; from llmtop.fleet_counts import FleetCounts\n"
                "t = FleetCounts.attach(sys.argv[1], 1); t.set_mine(3); print(t.others())")
        r = subprocess.run([sys.executable, "-c", code, path], capture_output=True,
                           text=True, timeout=60, check=False)
        assert r.returncode == 0, (r.returncode, r.stderr[-500:])
        assert counts.count(1) == 3
        counts.clear(1)  # the coordinator's own write
        assert counts.count(1) == 0
    finally:
        counts.close()
        os.unlink(path)
