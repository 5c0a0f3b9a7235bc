"""The snapshot example of shared/docs/interfaces.md ("GET /llmtop/v1/snapshot"), copied as
written there (two lines re-wrapped), for the tests that hold the admin API to it."""

from __future__ import annotations

import json
from typing import Any

SNAPSHOT_EXAMPLE: dict[str, Any] = json.loads("""
{
  "version": 1,
  "time": 1796000000.123,
  "window_s": 60,
  "system": {"rps": 0.0, "output_tps": 0.0, "input_tps": 0.0,
             "in_flight": 0, "waiting": 0, "streaming": 0,
             "requests": 0, "errors": 0, "cancelled": 0,
             "goodput_rps": 0.0, "goodput_tps": 0.0, "slo_attainment": null},
  "latency": {"ttft": {"count": 0, "p50": null, "p90": null, "p95": null, "p99": null, "max": null},
              "itl": {}, "chunk_gap": {}, "tpot": {}, "e2e": {}},
  "users": [{"user": "alice", "requests": 0, "in_flight": 0, "output_tps": 0.0,
             "ttft_p95": null, "itl_p95": null, "slo_attainment": null}],
  "gpus": [{"index": 0, "name": "...", "mem_used_bytes": 0, "mem_total_bytes": 0,
            "util_gpu": null, "mem_busy": null, "dram_bw_util": null, "power_w": null}],
  "engine": {"kind": "vllm", "running": null, "waiting": null, "kv_cache_usage": null},
  "capacity": {"max_concurrency_at_slo": null, "goodput_tps_at_slo": null},
  "warnings": [{"code": "QUEUEING", "severity": "warning", "since": 1796000000.0,
                "message": "..."}],
  "histograms": {"ttft": "<base64 HdrHistogram V2 compressed>", "itl": "...",
                 "chunk_gap": "...", "tpot": "...", "e2e": "..."}
}
""")
"""As written: ``"itl": {}`` and the like stand for the same keys as ``"ttft"``."""
