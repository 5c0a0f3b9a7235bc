"""Shared pieces of the command line."""

from __future__ import annotations

import argparse
import os
from typing import Any

from llmtop.config import Config, load_config


class UsageError(ValueError):
    """A user mistake: printed as one line, exit code 2."""


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by commands that run a proxy (``run``, ``demo``)."""
    p.add_argument("--config", metavar="FILE", help="TOML config file (see config.example.toml)")
    p.add_argument("--listen", metavar="HOST:PORT", help="proxy address (default 127.0.0.1:8080)")
    p.add_argument(
        "--admin", metavar="HOST:PORT", help="admin API address (default 127.0.0.1:8081)"
    )
    p.add_argument("--admin-token", metavar="TOKEN", help="required when --admin is not loopback")
    p.add_argument("--record", metavar="FILE", help="record the session (.jsonl or .jsonl.gz)")
    p.add_argument("--workers", type=int, metavar="N", help="proxy processes sharing the port")
    p.add_argument("--gpus", metavar="LIST", help="GPU indices to sample, e.g. 0,1 (default all)")
    p.add_argument(
        "--gpu-source", choices=("auto", "nvml", "sim", "none"), help="where GPU readings come from"
    )
    p.add_argument("--slo-ttft", type=float, metavar="S", help="TTFT SLO in seconds")
    p.add_argument("--slo-itl-p95", type=float, metavar="S", help="per-request ITL p95 SLO, s")
    p.add_argument("--slo-tpot", type=float, metavar="S", help="TPOT SLO in seconds")
    p.add_argument("--slo-e2e", type=float, metavar="S", help="end-to-end SLO in seconds")
    p.add_argument("--slo-target", type=float, metavar="F", help="attainment target (0.95)")


def config_from_args(args: argparse.Namespace, **extra: Any) -> Config:
    gpus = getattr(args, "gpus", None)
    devices: list[int] | None = None
    if gpus:
        try:
            devices = [int(x) for x in gpus.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"--gpus '{gpus}' must be a comma-separated list of indices") from None
    overrides: dict[str, Any] = {
        "upstream": getattr(args, "upstream", None),
        "listen": getattr(args, "listen", None),
        "admin": getattr(args, "admin", None),
        "admin_token": getattr(args, "admin_token", None),
        "workers": getattr(args, "workers", None),
        "recording.path": getattr(args, "record", None),
        "gpu.devices": devices,
        "gpu.source": getattr(args, "gpu_source", None),
        "slo.ttft_s": getattr(args, "slo_ttft", None),
        "slo.itl_p95_s": getattr(args, "slo_itl_p95", None),
        "slo.tpot_s": getattr(args, "slo_tpot", None),
        "slo.e2e_s": getattr(args, "slo_e2e", None),
        "slo.target": getattr(args, "slo_target", None),
    }
    overrides.update(extra)
    return load_config(getattr(args, "config", None), os.environ, overrides)
