"""The soak: 1,024 concurrent streams from the simulator through ``llmtop run --headless``
with recording on, for a bounded time (see soak_driver.py, which also runs by hand for
longer soaks).

Asserted: every request the clients made has exactly one record (matched by a unique
user per request), no error the upstream did not cause, the proxy exits 0 with a complete
recording, open fds return to their warm level and stay bounded by the connections, RSS
grows by no more than a small bound after warm-up, and the admin API answered every
poll throughout. The admin latency (p50/p99 of ``GET /llmtop/v1/snapshot``) is printed
and held to a loose bound: the 50 ms bar on a shared machine is a benchmark figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONCURRENCY = 1024
DURATION_S = 60


def test_soak_1024_streams_every_request_recorded_once(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    subprocess.run(
        [sys.executable, str(HERE / "soak_driver.py"), "--concurrency", str(CONCURRENCY),
         "--duration", str(DURATION_S), "--step", "1.0", "--max-tokens", "8",
         "--out", str(out)],
        check=True, timeout=DURATION_S + 120)
    r = json.loads(out.read_text())
    figures = {k: r[k] for k in (
        "requests_sent", "records", "client_results", "record_outcomes", "rps",
        "rss_first_mb", "rss_start_mb", "rss_end_mb", "rss_after_load_mb", "fds_first",
        "fds_start", "fds_end", "fds_max", "fds_after_load",
        "admin_polls", "admin_p50_ms", "admin_p99_ms", "admin_max_ms", "proxy_cpu_share")}
    print("soak:", json.dumps(figures))
    # every request: exactly one record, and nothing else
    assert r["requests_sent"] > 2 * CONCURRENCY
    assert r["requests_unique"] == r["requests_sent"]
    assert r["records"] == r["records_unique_users"] == r["requests_sent"], r["missing_records"]
    assert not r["duplicate_records"] and not r["unexpected_records"]
    # no error that the upstream did not cause (the simulator causes none here)
    assert r["client_results"] == {"ok": r["requests_sent"]}, r["client_results"]
    assert r["record_outcomes"] == {"ok": r["records"]}, r["record_errors"]
    assert r["proxy_exit"] == 0, r["logs_tail"]
    rec = r["recording"]
    assert rec["complete"] and rec["bad_lines"] == 0 and rec["truncated_lines"] == 0
    assert "Traceback" not in r["logs_tail"]
    # resources: fds bounded by the connections (client + upstream side) and flat
    assert r["fds_max"] <= 2 * CONCURRENCY + 64
    assert abs(r["fds_end"] - r["fds_start"]) <= 16
    # after the load: the clients' connections are gone (idle upstream ones may be pooled)
    assert r["fds_after_load"] <= r["fds_first"] + CONCURRENCY + 16
    # RSS after warm-up (30 s): the 5-minute metric windows are still filling, so a
    # little growth is expected (in a 150 s soak here: +6 MB from 20 s to 50 s, then about
    # +1 MB a minute); with ~30 s of steady state at ~70 requests/s, 6 MB catches a leak
    # of ~3 KiB a request
    assert r["rss_end_mb"] - r["rss_start_mb"] <= 6.0, figures
    # the admin API answered every poll, all through
    assert not r["admin_failures"], r["admin_failures"]
    assert r["admin_polls"] >= DURATION_S
    # ... and promptly: the target is p99 <= 50 ms (measured 36-37 ms over 550 polls on this
    # 2-core machine when quiet, see llmtop/bus.py); the bound here is loose enough for a
    # loaded CI machine and still catches the admin API going back onto the proxy's event
    # loop (p99 0.4-1 s there) or observer work blocking it for long
    assert r["admin_p99_ms"] <= 250, figures
