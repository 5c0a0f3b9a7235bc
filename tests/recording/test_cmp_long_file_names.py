"""Two recordings with long file names (240 characters, well inside a file system's 255)
compare in HTML with their knee plot drawn: the legend names each file shortened (start
and end kept), as the per-user plot shortens users. Before, the legend held each name
whole, matplotlib collapsed the axes to make room ('UserWarning: constrained_layout not
applied because axes sizes collapsed to zero' on stderr; an error under -W error) and
the plot had no room for its curves."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from rec_helpers import session, write_recording

from llmtop.cli import main


def test_a_comparison_of_long_file_names_plots_them_short(tmp_path: Path) -> None:
    a = tmp_path / ("a" * 234 + ".jsonl")
    b = tmp_path / ("b" * 234 + ".jsonl")
    write_recording(a, session(120, seed=1, duration_s=20.0))
    write_recording(b, session(120, seed=2, duration_s=20.0))
    out = tmp_path / "c.html"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["report", str(a), str(b), "-q", "--format", "html", "-o", str(out)]) == 0
    assert not [str(w.message) for w in caught], [str(w.message) for w in caught]
    page = out.read_text()
    knee = page.split('data-plot="plot-compare-knee"', 1)[1].split("</figure>", 1)[0]
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", knee)
    legend = [t for t in texts if t.startswith(("A: ", "B: "))]
    assert len(legend) == 2, texts
    assert all(len(t) <= 3 + 32 for t in legend), legend
    assert legend[0].startswith("A: aaaa") and legend[0].endswith("a.jsonl")
    assert "a" * 234 + ".jsonl" in page  # the page still names the file whole
