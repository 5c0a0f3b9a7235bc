"""The HTML report's per-user plot with user names as long as the proxy writes them (128
characters: a header or body 'user' field is cut there). The bars' labels squeezed the
plot to nothing: matplotlib warned 'constrained_layout not applied because axes sizes
collapsed to zero' on stderr (an error under this suite) and drew no bars; and users that
differ only at their end must stay apart."""

from __future__ import annotations

import re
from pathlib import Path

from rec_helpers import session, write_recording

from llmtop.cli import main
from llmtop.proxy.identity import MAX_USER_LEN

USERS = tuple("team-" + "x" * (MAX_USER_LEN - 6) + str(i) for i in range(3))


def test_users_named_at_the_proxys_length_limit_plot(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    write_recording(path, session(60, duration_s=10, users=USERS))
    out = tmp_path / "r.html"
    # (a warning is an error in this suite: the collapsed layout's failed here)
    assert main(["report", str(path), "-q", "--format", "html", "-o", str(out)]) == 0
    page = out.read_text()
    svg = page[page.index('<svg id="plot-users"'):]
    svg = svg[:svg.index("</svg>")]
    labels = re.findall(r">([^<>]*…[^<>]*)<", svg)
    assert len(set(labels)) == 3, labels  # one shortened label each, still told apart
    assert all(len(x) <= 40 for x in labels), labels
    for u in USERS:  # the table keeps each whole name
        assert u in page
