"""The one Config object: TOML file < ``LLMTOP_*`` environment < command-line flags.

Every key is documented with its default in ``config.example.toml`` (a test keeps the two
in step). An unknown key or a wrong type raises :class:`ConfigError` naming the key and
where it came from; the CLI turns that into a one-line message and exit code 2.

Environment names are ``LLMTOP_`` + the dotted key upper-cased with dots as underscores:
``slo.ttft_s`` → ``LLMTOP_SLO_TTFT_S``. Optional numbers accept ``none`` to unset.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import math
import os
import re
import socket
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

from llmtop.recording_names import nameless
from llmtop.textsafe import printable

DIALECT_SETTINGS: Final = ("auto", "openai", "anthropic", "ollama", "tgi", "sglang", "other")
"""What the ``dialect`` setting accepts: the names of ``llmtop.proxy.dialects.registry.
DIALECTS``, written out so that reading a config does not import the parsers (a test holds
the two equal)."""


class ConfigError(ValueError):
    """Bad configuration: the message names the key and its source."""


@dataclass
class TimeoutConfig:
    connect_s: float = 10.0
    """Upstream TCP/TLS connect timeout."""
    first_byte_s: float = 600.0
    """From sending the request upstream to its response headers (queueing + prefill)."""
    idle_s: float = 300.0
    """Longest silence allowed between two reads of a streaming response (the stream is
    cut off, recorded ``timeout``), and longest a client may leave a started response
    unread while the upstream waits on it (cut off, recorded ``cancelled``)."""
    shutdown_grace_s: float = 10.0
    """On SIGINT/SIGTERM, how long in-flight streams may finish before they are cancelled."""


@dataclass
class SloConfig:
    ttft_s: float | None = 0.5
    itl_p95_s: float | None = 0.05
    tpot_s: float | None = None
    e2e_s: float | None = None
    target: float = 0.95
    """Share of requests that must meet every SLO (attainment target)."""


@dataclass
class GpuConfig:
    source: str = "auto"
    """auto (NVML if present), nvml, sim (the simulator's /sim/gpu), none."""
    devices: list[int] = field(default_factory=list)
    """GPU indices to sample; empty = all."""
    interval_s: float = 0.5
    sim_url: str = ""
    """Where the simulated GPU is served (default: the upstream's /sim/gpu)."""


@dataclass
class EngineConfig:
    enabled: bool = True
    metrics_url: str = ""
    """The engine's Prometheus endpoint; empty = the upstream URL less a trailing /v1, +
    /metrics (a gateway's path prefix is kept)."""
    interval_s: float = 1.0


@dataclass
class RecordingConfig:
    path: str = ""
    """Record to this file from start-up (.jsonl or .jsonl.gz); empty = not recording."""
    record_content: bool = False
    """Opt in to storing prompt/completion text (off: never stored)."""
    flush_s: float = 1.0
    queue_max: int = 100_000
    """Lines buffered before the recorder drops (and counts) instead of stalling streams."""
    queue_max_chunks: int = 4_000_000
    """...and chunks in the buffered requests (~40 bytes each): a stalled disk with long
    answers queued must not grow memory without bound."""
    rotate_mb: float = 0.0
    """Rotate: close a part once its file reaches this many MB (10^6 bytes, as written:
    compressed for .gz); 0 = off. With rotation the path is the parts' stem."""
    rotate_s: float = 0.0
    """...or once it has been open this many seconds (whichever first); 0 = off."""
    keep: int = 0
    """With rotation, keep at most this many parts of a recording, deleting the oldest
    (the stem's parts: this run's and those an earlier run with the same path left;
    nothing else); 0 = keep every part."""


@dataclass
class TuiConfig:
    refresh_hz: float = 4.0
    window_s: int = 60


@dataclass
class WarningsConfig:
    kv_cache_usage: float = 0.95
    """KV_CACHE when the engine's KV-cache usage fraction reaches this."""
    gpu_memory: float = 0.95
    """GPU_MEMORY when used / total memory reaches this fraction — and, when the engine's
    KV-cache usage is known (a fresh reading from vLLM, SGLang, llama.cpp or the simulator),
    only while that is at ``kv_cache_usage`` too: vLLM and SGLang reserve their KV cache at
    start-up (``--gpu-memory-utilization`` 0.9 and more), so memory alone reads full on an
    idle server. Without a KV reading memory alone decides (the message says which)."""
    bandwidth_pct: float = 80.0
    """BANDWIDTH when DRAM bandwidth (or memory busy) % reaches this while ITL rises."""
    error_rate: float = 0.05
    """ERRORS when errors + timeouts reach this share of requests in the window."""
    window_s: int = 10
    """Window the detectors look at."""
    clear_after_s: float = 15.0
    """A warning clears only after its condition has been false this long (hysteresis)."""
    raise_after_s: float = 2.0
    """A warning is raised only after its condition has held this long (hysteresis)."""
    stall_s: float = 60.0
    """UPSTREAM_STALLED when streamed requests have waited this long for a first token
    while nothing at all came back from the engine (a hung engine accepts and never
    answers: no other warning sees it until the first-byte timeouts)."""


@dataclass
class Config:
    upstream: str = ""
    """Base URL of the inference endpoint (may include a path prefix)."""
    upstream_ca: str = ""
    """PEM file of CA certificates to trust for an https upstream (a private CA, a
    self-signed certificate); empty = the system's store (SSL_CERT_FILE is honoured)."""
    upstream_verify: bool = True
    """false: do not verify the https upstream's certificate (testing only)."""
    listen: str = "127.0.0.1:8080"
    """``:PORT`` keeps the host 127.0.0.1 (``--listen :0``: a free loopback port)."""
    admin: str = "127.0.0.1:8081"
    admin_token: str = ""
    """Required (as a Bearer token) when the admin API listens beyond loopback."""
    workers: int = 1
    split_observers: bool = False
    """Run the observers (metrics, saturation warnings, recording, admin API, GPU and
    engine sampling) in a process of their own even with one worker, as ``workers`` > 1
    always does: the forwarding process then never waits for them, which keeps the tail of
    a burst of chunks short (one engine step at 256 streams) on a machine with a core to
    spare, for a few % more CPU in all (the records reach the observers every 0.5 s)."""
    dialect: str = "auto"
    """One of :data:`DIALECT_SETTINGS`."""
    user_header: str = "X-LLMTOP-User"
    user_salt: str = ""
    """Salt for API-key pseudonyms; empty = the stored salt of this machine user
    (:func:`llmtop.proxy.identity.stored_salt`)."""
    trusted_proxies: list[str] = field(default_factory=list)
    """Addresses and CIDR networks of the load balancers in front of llmtop: a request
    from one of them is the user its ``Forwarded`` / ``X-Forwarded-For`` / ``X-Real-IP``
    names when nothing earlier names one (:mod:`llmtop.proxy.forwarded`); empty = the
    connection's address always (forwarded fields are any client's to write)."""
    inject_usage: bool = True
    """Ask OpenAI-style upstreams for usage in streams and hide it from clients that did not."""
    max_body_bytes: int = 64 * 1024 * 1024
    top_users: int = 20
    """Users tracked one by one (and labelled in /metrics); the rest count as 'other'."""
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    recording: RecordingConfig = field(default_factory=RecordingConfig)
    tui: TuiConfig = field(default_factory=TuiConfig)
    warnings: WarningsConfig = field(default_factory=WarningsConfig)


# -- introspection ---------------------------------------------------------------------


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def flat_keys(cls: type = Config, prefix: str = "") -> dict[str, Any]:
    """Every dotted key with its type: ``{"slo.ttft_s": float | None, ...}``."""
    out: dict[str, Any] = {}
    for name, tp in _hints(cls).items():
        if _is_section(tp):
            out.update(flat_keys(tp, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = tp
    return out


def env_name(key: str) -> str:
    return "LLMTOP_" + key.upper().replace(".", "_")


def _type_name(tp: Any) -> str:
    if tp is float:
        return "a number"
    if tp is int:
        return "an integer"
    if tp is bool:
        return "true or false"
    if tp is str:
        return "a string"
    if typing.get_origin(tp) is list:
        return "a list of integers" if typing.get_args(tp)[0] is int else "a list of strings"
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if args:
        return _type_name(args[0]) + " (or unset)"
    return str(tp)


def _coerce(tp: Any, value: Any, key: str, source: str, flag: str | None = None) -> Any:
    """Check a TOML or flag value against the key's type (ints may stand for floats).
    ``flag``: the command-line flag that gave it, which a message names instead of
    ``source: 'key'`` (the user typed ``--rotate-s nan``, not ``recording.rotate_s``)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = next(a for a in typing.get_args(tp) if a is not type(None))
        return _coerce(inner, value, key, source, flag)
    what = flag or f"{source}: '{key}'"
    ok: bool
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok:
            value = float(value)
            if not math.isfinite(value):
                raise ConfigError(f"{what} must be a finite number, got {value!r}")
    elif tp is str:
        ok = isinstance(value, str)
        if ok and "\0" in value:  # (TOML's "\u0000"): no path, URL or name holds one, and
            # a path with one failed with a ValueError traceback where it was opened
            raise ConfigError(f"{what} holds a NUL character (\\u0000)")
    elif origin is list:
        item = typing.get_args(tp)[0]
        ok = isinstance(value, list) and all(
            isinstance(v, item) and not isinstance(v, bool) for v in value
        )
    else:  # pragma: no cover - a new key type without a rule
        raise ConfigError(f"{key}: unsupported type {tp}")
    if not ok:
        raise ConfigError(f"{what} must be {_type_name(tp)}, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    """A value as a message quotes it: as the TOML file writes it (``true``, a date as
    written, a table), not as Python does (``True``, ``datetime.date(2026, 12, 7)``,
    ``{'host': ...}``); a string quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        return f"the date and time {value.isoformat()}"
    if isinstance(value, datetime.date):
        return f"the date {value.isoformat()}"
    if isinstance(value, datetime.time):
        return f"the time {value.isoformat()}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return repr(value)


def _parse_env(tp: Any, raw: str, key: str, source: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if raw.strip().lower() in ("", "none", "null"):
            return None
        inner = next(a for a in typing.get_args(tp) if a is not type(None))
        return _parse_env(inner, raw, key, source)
    try:
        if tp is bool:
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if tp is int:
            return int(raw)
        if tp is float:
            value = float(raw)
            if not math.isfinite(value):
                raise ConfigError(f"{source}: '{key}' must be a finite number, got {raw!r}")
            return value
        if origin is list:
            if typing.get_args(tp)[0] is str:  # 10.0.0.0/8, 192.168.1.5
                return split_list(raw)
            return [int(p) for p in raw.replace(" ", "").split(",") if p]
    except ConfigError:
        raise
    except ValueError:
        raise ConfigError(f"{source}: '{key}' must be {_type_name(tp)}, got {raw!r}") from None
    return raw


def split_list(raw: str) -> list[str]:
    """A list of strings as the environment (and a flag such as ``--trusted-proxies``)
    writes it: comma-separated, spaces around an item and empty items ignored."""
    return [p.strip() for p in raw.split(",") if p.strip()]


def _env_text(value: Any) -> str:
    """A key's value as :func:`_parse_env` reads it back."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)


def env_of(cfg: Config, keys: Iterable[str]) -> dict[str, str]:
    """The ``LLMTOP_*`` variables that give ``cfg``'s values of ``keys`` to a process that
    loads its own config (the environment outranks the file): how ``run --workers N``'s
    children get what the command line set, which their load would not see."""
    return {env_name(key): _env_text(_get(cfg, key)) for key in keys}


def _set(cfg: Config, key: str, value: Any) -> None:
    obj: Any = cfg
    *path, last = key.split(".")
    for p in path:
        obj = getattr(obj, p)
    setattr(obj, last, value)


def _flatten_toml(data: Mapping[str, Any], source: str, prefix: str = "") -> dict[str, Any]:
    keys = flat_keys()
    sections = {k.rsplit(".", 1)[0] for k in keys if "." in k}
    out: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and key in sections:
            out.update(_flatten_toml(value, source, key + "."))
        elif key in keys:
            out[key] = value
        elif key in sections:
            raise ConfigError(f"{source}: '{key}' is a section: write [{key}] and its keys "
                              "under it (see config.example.toml)")
        else:
            raise ConfigError(f"{source}: unknown key '{key}'{_suggest(key, keys, sections)}"
                              " (see config.example.toml)")
    return out


def _suggest(key: str, keys: Mapping[str, Any], sections: set[str]) -> str:
    """``; did you mean 'timeouts.idle_s'?`` for a near miss (a typo, a section name one
    letter off, a key under the wrong section), else ``""``."""
    import difflib

    known = [*keys, *sections]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    if not close:  # the right name under another section: tui.window vs warnings.window_s
        leaf = key.rsplit(".", 1)[-1]
        close = [k for k in keys if k.rsplit(".", 1)[-1] == leaf][:1]
    return f"; did you mean '{close[0]}'?" if close else ""


# -- loading ---------------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
    *,
    slo_only: bool = False,
) -> Config:
    """Build the Config: defaults < file < environment < overrides (dotted keys, e.g. from
    flags; ``None`` values are ignored so unset flags don't override). ``flags``: the
    command's flag for each key (:data:`RUN_FLAGS`); a message about a value an override
    gave names its flag, the one the user typed, instead of the key. ``slo_only``: the
    caller reads the SLOs alone (``bench``): every value is still checked against its
    key's type, but only the SLOs against their bounds, not the proxy's settings it never
    uses (its addresses, its workers for this machine's CPUs, its CA file)."""
    cfg = Config()
    names = KeyNames(flags or {}, frozenset(k for k, v in (overrides or {}).items()
                                            if v is not None))
    keys = flat_keys()
    if path is not None:
        source = str(path)
        try:
            with open(path, "rb") as fh:  # (at most a little more than the most it takes:
                raw = fh.read(MAX_CONFIG_BYTES + 1)  # /dev/zero was read until memory ran out)
            if len(raw) > MAX_CONFIG_BYTES:
                raise ConfigError(f"{source}: larger than {MAX_CONFIG_BYTES // MB} MB: not a "
                                  "config file (see config.example.toml)")
            data = tomllib.loads(raw.decode("utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{source}: config file not found") from None
        except IsADirectoryError:
            raise ConfigError(f"{source}: is a directory, not a config file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: not valid TOML: {exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{source}: not valid TOML: not UTF-8 text") from None
        except PermissionError:
            raise ConfigError(f"{source}: permission denied") from None
        except OSError as exc:  # EIO and the like: one line, not a traceback
            raise ConfigError(f"{source}: cannot read: {exc.strerror or exc}") from None
        for key, value in _flatten_toml(data, source).items():
            _set(cfg, key, _coerce(keys[key], value, key, source))
    environ = os.environ if env is None else env
    for key, tp in keys.items():
        name = env_name(key)
        if name in environ:
            _set(cfg, key, _parse_env(tp, environ[name], key, f"environment {name}"))
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in keys:
            raise ConfigError(f"unknown setting '{key}'")
        _set(cfg, key, _coerce(keys[key], value, key, "command line", names.flag(key)))
    (validate_slo if slo_only else validate)(cfg, names)
    return cfg


RUN_FLAGS: Final[Mapping[str, str]] = types.MappingProxyType({
    "upstream": "--upstream", "listen": "--listen", "admin": "--admin",
    "admin_token": "--admin-token", "upstream_ca": "--upstream-ca", "workers": "--workers",
    "split_observers": "--split-observers", "trusted_proxies": "--trusted-proxies",
    "recording.path": "--record", "recording.rotate_mb": "--rotate-mb",
    "recording.rotate_s": "--rotate-s", "recording.keep": "--keep", "gpu.devices": "--gpus",
    "gpu.source": "--gpu-source", "slo.ttft_s": "--slo-ttft", "slo.itl_p95_s": "--slo-itl-p95",
    "slo.tpot_s": "--slo-tpot", "slo.e2e_s": "--slo-e2e", "slo.target": "--slo-target",
})
"""The keys ``llmtop run``'s flags set, each with its flag (``--slo`` sets the ``slo.*``
ones too; the CLI checks those itself). A bad value from one is named by the flag; the
workers of ``--workers N`` are given these keys' values (:func:`env_of`), which their
own load of the file and the environment would not see (a test holds the table and
``run``'s flags equal)."""


@dataclass(frozen=True)
class KeyNames:
    """What a message calls a key: the flag the user typed when the command line gave it
    (``--keep``), else the key itself (``recording.keep``)."""

    flags: Mapping[str, str] = field(default_factory=dict)
    """The command's flag for each key it has one for."""
    given: frozenset[str] = frozenset()
    """The keys the command line gave."""

    def flag(self, key: str) -> str | None:
        return self.flags.get(key) if key in self.given else None

    def __call__(self, key: str) -> str:
        return self.flag(key) or key

    def beside(self, key: str, other: str) -> str:
        """``other`` named as ``key`` was: by its flag when ``key`` came from a flag (a
        hint to a flag's user names flags), else by its key."""
        return self.flags.get(other, other) if self.flag(key) else other


OTHER_ENV: Final = frozenset({
    "LLMTOP_SALT_FILE", "LLMTOP_BENCH_API_KEY", "LLMTOP_PARENT_PID", "LLMTOP_CLOCK_ANCHOR",
    "LLMTOP_CACHE", "LLMTOP_ENGINE_THREADS", "LLMTOP_BUILD_JOBS", "LLMTOP_UPDATE_SCREENSHOTS",
    "LLMTOP_FUZZ_EXAMPLES", "LLMTOP_E2E_P99_MS", "LLMTOP_E2E_TIMING_REQUESTS",
})
"""``LLMTOP_*`` names llmtop (its tools and tests included) reads besides the settings."""


def unknown_env(env: Mapping[str, str]) -> list[str]:
    """One line for each ``LLMTOP_*`` variable that is neither a setting nor one of
    :data:`OTHER_ENV` — a misspelt setting is otherwise ignored without a word
    (``LLMTOP_TIMEOUT_IDLE_S``) — with the nearest setting's name when there is one."""
    import difflib

    settings = {env_name(k) for k in flat_keys()}
    out = []
    for name in sorted(env):
        if not name.startswith("LLMTOP_") or name in settings or name in OTHER_ENV:
            continue
        close = difflib.get_close_matches(name, sorted(settings), n=1, cutoff=0.8)
        out.append(f"{printable(name)} is not an llmtop setting"
                   + (f" (did you mean {close[0]}?)" if close else "") + "; ignored")
    return out


def upstream_v1_note(upstream: str, name: str = "--upstream") -> str | None:
    """A line when ``upstream``'s path ends in ``/v1``: the proxy keeps that prefix and adds
    the client's path to it, so clients that send ``/v1/...`` themselves (the OpenAI SDK
    with ``base_url`` ending in ``/v1``) reach ``/v1/v1/...`` and get the engine's 404 —
    right for clients that leave ``/v1`` out, a puzzle for everyone else. ``name``: where
    the URL was given (``--upstream``, ``LLMTOP_UPSTREAM``, the config file's
    ``upstream``)."""
    try:
        path = urlsplit(upstream).path.rstrip("/")
    except ValueError:
        return None
    if not path.endswith("/v1"):
        return None
    return (f"{name} ends in /v1: a client's /v1/chat/completions goes upstream as "
            f"{printable(path)}/v1/chat/completions; give the engine's URL without /v1 if "
            "your clients send /v1 themselves (as the OpenAI SDK does)")


def upstream_tls_note(cfg: Config, ca_name: str = "upstream_ca") -> str | None:
    """A line when TLS settings are given (``upstream_ca``, named ``ca_name``;
    ``upstream_verify = false``) but no URL llmtop connects to is https: an https upstream
    meant and the s left out, the settings never used."""
    if not cfg.upstream_ca and cfg.upstream_verify:
        return None
    urls = (cfg.upstream, cfg.engine.metrics_url, cfg.gpu.sim_url)
    if any(url.strip().lower().startswith("https:") for url in urls):
        return None
    what = ca_name if cfg.upstream_ca else "upstream_verify = false"
    return (f"{what} is for an https upstream, and '{printable(cfg.upstream)}' is plain "
            "http: it is not used (https:// meant?)")


def gpu_devices_note(cfg: Config, devices_name: str = "gpu.devices",
                     source_name: str = "gpu.source") -> str | None:
    """A line when GPU indices are given for a source that reads no NVIDIA GPU (``none``;
    ``sim``: the simulator's one GPU): taken, never used."""
    if not cfg.gpu.devices or cfg.gpu.source not in ("none", "sim"):
        return None
    listed = ",".join(map(str, cfg.gpu.devices))
    return (f"{devices_name} {listed} picks NVIDIA GPUs to sample, and {source_name} is "
            f"'{cfg.gpu.source}': it is not used")


DEFAULT_HOST = "127.0.0.1"
"""The host of ``:PORT`` (the default listen and admin addresses' host)."""


def parse_hostport(value: str, what: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0 = pick a free one; ``:PORT`` keeps
    the default host, loopback ``127.0.0.1``). An unbracketed IPv6 address is taken when
    what is before the last colon is one (``::1:8080``)."""
    usage = f"{what} '{value}' must be HOST:PORT, e.g. 127.0.0.1:8080 or [::1]:8080"
    text = value.strip()
    if text.startswith(":") and not text.startswith("::"):
        text = DEFAULT_HOST + text
    if "://" in text:
        raise ConfigError(f"{what} '{value}' is an address, not a URL: HOST:PORT, e.g. "
                          "127.0.0.1:8080")
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ConfigError(usage)
        port_s = rest[1:]
    else:
        host, sep, port_s = text.rpartition(":")
        if not sep:
            raise ConfigError(usage)
        if ":" in host:
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise ConfigError(f"{what} '{value}': an IPv6 address goes in brackets before "
                                  "the port, e.g. [::1]:8080") from None
    if not host or any(c.isspace() or c in "[]/" for c in host):
        raise ConfigError(usage)
    if not (port_s.isascii() and port_s.isdigit()):
        raise ConfigError(f"{what} '{value}': port '{port_s}' is not a number")
    port = int(port_s)
    if not 0 <= port <= 65535:
        raise ConfigError(f"{what} '{value}': port must be 0..65535")
    if ":" in host:  # brackets hold an IPv6 address (RFC 3986), not a name to look up
        try:
            ip6 = ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"{what} '{value}': {host} is not an IPv6 address") from None
        if ip6.ipv4_mapped is not None:  # llmtop's IPv6 sockets take no IPv4 (v6only)
            raise ConfigError(f"{what} '{value}': {host} is an IPv4-mapped address; give "
                              f"the IPv4 address, e.g. {ip6.ipv4_mapped}:{port}")
    return host, port


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (127.0.0.0/8, ::1). A host *name*
    such as ``127.0.0.1.nip.io`` is not loopback: it resolves wherever DNS says."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


def max_workers() -> int:
    """The most ``workers`` accepted: 2 per usable CPU, and never fewer than 4."""
    return max(4, 2 * usable_cpus())


def validate_upstream(url: str) -> None:
    """ConfigError unless ``url`` is an http(s) base URL the proxy can forward to: a host, a
    port that is a number in range, no credentials (they would be stored in recordings and
    shown by the admin API, and the proxy does not send them: clients' own Authorization
    headers pass through) and no query or fragment (clients' queries are forwarded as
    sent)."""
    if any(c.isspace() for c in url) or has_control_char(url):
        # (urlsplit drops a tab or line end, takes a space in the host, and a space after
        # the port read as "Port could not be cast to integer value as '9 '")
        raise ConfigError(f"upstream '{url}' has whitespace or a control character in it (a "
                          "stray space or line end?): a URL has none; in a path, write a "
                          "space %20")
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError as exc:
        raise ConfigError(f"upstream '{url}' is not a valid URL: {exc}") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ConfigError(f"upstream '{url}' must be an http:// or https:// URL with a host")
    if port == 0:
        raise ConfigError(f"upstream '{url}': port 0 is not a port to connect to")
    if u.username is not None or u.password is not None:
        raise ConfigError(
            "upstream URL must not contain user:password@ (it would be stored in recordings "
            "and shown by the admin API; clients' Authorization headers are passed through)")
    if u.query or u.fragment or url.rstrip().endswith(("?", "#")):
        raise ConfigError(
            f"upstream '{u.scheme}://{u.netloc}{u.path}' must not have a query or fragment "
            "(each client request's own query is forwarded as sent)")


def network_of(entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A ``trusted_proxies`` entry — an address or a CIDR network, IPv4 or IPv6 — as a
    network (an address is a network of one); ValueError saying what is wrong. (Here, not
    in :mod:`llmtop.proxy.forwarded` that uses it: the config checks may not import the
    proxy.)"""
    text = entry.strip()
    if "%" in text:  # (ipaddress takes fe80::1%eth0; a forwarded hop never names a zone)
        raise ValueError(f"{entry!r}: leave the IPv6 zone (%...) out")
    try:
        return ipaddress.ip_network(text)
    except ValueError:
        pass
    try:
        loose = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ValueError(f"{entry!r} is not an IP address or network "
                         "(e.g. 10.0.0.5, 10.0.0.0/8, 2001:db8::/32)") from None
    raise ValueError(f"{entry!r} has bits set past its prefix length: the network is "
                     f"{loose}")


def socket_netloc(netloc: str) -> str:
    """A URL's ``HOST:PORT`` with an IPv6 zone as a socket takes it: a URL writes the zone
    ``%25`` (RFC 6874: ``[fe80::1%25eth0]``), and aiohttp hands that to the resolver as it
    is ("Name or service not known"); ``[fe80::1%eth0]`` is found."""
    if netloc.startswith("[") and "%25" in netloc.partition("]")[0]:
        return netloc.replace("%25", "%", 1)
    return netloc


def host_field_netloc(netloc: str) -> str:
    """A URL's ``HOST:PORT`` as a Host field carries it: an IPv6 zone means something on
    this machine only, and a Host field has no room for it (RFC 6874 §4, RFC 9110 §7.2):
    ``[fe80::1%25eth0]:8000`` → ``[fe80::1]:8000``."""
    inside, sep, rest = socket_netloc(netloc).partition("]")
    if netloc.startswith("[") and sep:
        return inside.partition("%")[0] + sep + rest
    return netloc


def check_zone(netloc: str) -> None:
    """ConfigError when a URL's ``HOST:PORT`` has an IPv6 zone no socket could connect
    with, said before any request fails as "host not found": an empty one
    (``[fe80::1%25]``), one on an address that is not link-local (the system takes a zone
    for fe80::/10 only: ``[::1%25lo]``), or one naming no network interface of this machine.
    The zone is written ``%25`` (RFC 6874), or ``%`` as llmtop prints its own addresses."""
    if not netloc.startswith("["):
        return
    host = socket_netloc(netloc)[1:].partition("]")[0]
    addr, sep, zone = host.partition("%")
    if not sep:
        return
    if not zone:
        raise ConfigError(f"[{host}]: the zone after % is empty; write it %25 and the "
                          "interface, e.g. [fe80::1%25eth0]")
    try:
        ip = ipaddress.IPv6Address(addr)
    except ValueError:
        raise ConfigError(f"[{host}]: {addr} is not an IPv6 address") from None
    if not ip.is_link_local and not (ip.is_multicast and (ip.packed[1] & 0x0F) == 2):
        raise ConfigError(f"[{host}]: a zone (%{zone}) goes with a link-local address "
                          f"(fe80::/10) only, and {addr} is not one; leave it out")
    try:
        if zone.isdigit():
            socket.if_indextoname(int(zone))
        else:
            socket.if_nametoindex(zone)
    except (OSError, OverflowError, ValueError):
        raise ConfigError(f"[{host}]: this machine has no network interface '{zone}' "
                          "(the zone names the interface to connect on)") from None


def is_this_machine(host: str) -> bool:
    """True for a host that names this machine without DNS: ``localhost``, a loopback
    literal, or an IP literal of one of this machine's own interfaces (its LAN address, its
    link-local address with or without a zone, written ``%25`` as in a URL or ``%``). A
    load generator aimed there loads nobody else's server."""
    if is_loopback(host):
        return True
    bare = host.strip("[]").replace("%25", "%", 1)
    return _local_address(bare)


def _local_address(host: str) -> bool:
    """True when ``host`` (an IP literal) is an address of this machine: one a socket can
    bind to. No DNS: a name other than ``localhost`` or this machine's own is not looked up."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        # (getaddrinfo: a zone, ``fe80::1%eth0``, becomes the scope id a bind needs)
        where = socket.getaddrinfo(host, 0, family, socket.SOCK_STREAM, 0,
                                   socket.AI_NUMERICHOST)[0][4]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind(where)
    except OSError:
        return False
    return True


def reaches_listener(url: str, host: str, port: int) -> bool:
    """True when a request to ``url`` would arrive at a listener on ``host:port`` of this
    machine (a wildcard host listens on every address), as far as can be told without DNS:
    IP literals, ``localhost`` and this machine's own name. Port 0 (not chosen yet): False."""
    u = urlsplit(url)
    target = (u.hostname or "").lower()
    try:
        target_port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        return False
    if port == 0 or target_port != port or not target:
        return False
    listen = host.strip("[]").lower()
    own_names = {"localhost", socket.gethostname().lower()}
    if listen in ("", "0.0.0.0", "::"):
        return target in own_names or _local_address(target)
    if target == listen:
        return True
    if listen == "localhost":  # it names loopback addresses (127.0.0.1, ::1)
        try:
            return ipaddress.ip_address(target).is_loopback
        except ValueError:
            return False
    try:
        listen_ip = ipaddress.ip_address(listen)
    except ValueError:
        return False
    if target == "localhost":
        return listen_ip.is_loopback
    try:
        return ipaddress.ip_address(target) == listen_ip
    except ValueError:
        return False


def _refuse_loop(cfg: Config) -> None:
    """ConfigError when the upstream is this proxy's own listen or admin address: every
    request would be forwarded back into the proxy, again and again."""
    for what, addr in (("listen", cfg.listen), ("admin", cfg.admin)):
        host, port = parse_hostport(addr, what)
        if reaches_listener(cfg.upstream, host, port):
            role = "proxy" if what == "listen" else "admin API"
            raise ConfigError(
                f"upstream '{cfg.upstream}' is llmtop's own {what} address {addr}: requests "
                f"would loop back into its {role}; point upstream at the inference engine "
                "(e.g. --upstream http://127.0.0.1:8000) or listen on another port")


TUI_WINDOWS = (10, 60, 300, 0)
"""The TUI's windows in seconds (``tui.window_s``; 0: the whole session)."""
MAX_REFRESH_HZ = 60.0
"""The most TUI refreshes per second (``tui.refresh_hz`` and every ``--refresh-hz``)."""
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP field name (an RFC 9110 token), for ``fullmatch``."""
MAX_GPU_INDEX = 1 << 16
MAX_TOP_USERS = 10_000
"""The most users tracked one by one (``top_users``): every window holds a row of counters
for each, and 1e8 of them took gigabytes and left the proxy deaf to its admin API and
SIGTERM."""
MB: Final = 1_000_000
"""A megabyte as ``recording.rotate_mb`` counts it (as disks and ``ls -h --si`` do)."""
MAX_CONFIG_BYTES: Final = MB
"""The largest config file read (config.example.toml, every key documented, is ~8 kB)."""
MIN_ROTATE_MB: Final = 0.01
"""The smallest part (10 kB): each part is a file with its header, footer and a fsync."""
MAX_ROTATE_MB: Final = 1_000_000.0
"""The largest part (a terabyte): past it no part is meant to close by size (leave
``rotate_mb`` at 0), and 1e308 MB overflowed turning it into bytes (a traceback at start)."""
MIN_ROTATE_S: Final = 1.0
"""The shortest part, in seconds (the writer thread looks at the time 4 times a flush)."""
MAX_DURATION_S = 86_400.0
"""The longest time any duration key accepts (a day): past it a timer overflows (a 1e300 s
timeout failed every request with an internal error) and no wait that long is meant."""
DURATION_KEYS = (
    "timeouts.connect_s", "timeouts.first_byte_s", "timeouts.idle_s",
    "timeouts.shutdown_grace_s", "slo.ttft_s", "slo.itl_p95_s", "slo.tpot_s", "slo.e2e_s",
    "gpu.interval_s", "engine.interval_s", "recording.flush_s", "warnings.window_s",
    "warnings.clear_after_s", "warnings.raise_after_s", "warnings.stall_s",
    "recording.rotate_s",
)
"""The keys that are seconds."""


def _validate_scrape_url(key: str, url: str) -> None:
    """ConfigError unless ``url`` is an http(s) URL with a host and a port in range: a URL
    llmtop polls (it said nothing when it could not, and its panel stayed empty)."""
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError as exc:
        raise ConfigError(f"{key} '{url}' is not a valid URL: {exc}") from None
    if u.scheme not in ("http", "https") or not u.hostname or port == 0:
        raise ConfigError(f"{key} '{url}' must be an http:// or https:// URL with a host, "
                          "e.g. http://127.0.0.1:8000/metrics (empty: the upstream's)")


def has_control_char(text: str) -> bool:
    """True when ``text`` holds a C0 control character or DEL (a line end from a token
    file, say): no HTTP client sends such a header value."""
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def validate(cfg: Config, names: KeyNames | None = None) -> None:
    """ConfigError for the first value that cannot be meant, named as ``names`` says (by
    its key unless a flag gave it)."""
    name = names or KeyNames()
    if cfg.upstream:
        validate_upstream(cfg.upstream)
    for key, url in (("engine.metrics_url", cfg.engine.metrics_url),
                     ("gpu.sim_url", cfg.gpu.sim_url)):
        if url:
            _validate_scrape_url(key, url)
    if cfg.upstream_ca:
        from llmtop.tls import ssl_context  # ConfigError when the file is not usable

        ssl_context(cfg.upstream_ca)
    parse_hostport(cfg.listen, "listen")
    tok = cfg.admin_token
    if tok != tok.strip() or has_control_char(tok):
        # the admin API strips what a client sends: such a token could never match
        raise ConfigError("admin_token has whitespace at its ends or a control character "
                          "(a line end from a token file?): no client could send it; "
                          "remove it")
    admin_host, _ = parse_hostport(cfg.admin, "admin")
    if not is_loopback(admin_host) and not cfg.admin_token:
        raise ConfigError(
            f"admin '{cfg.admin}' is not loopback: set admin_token (--admin-token or "
            "LLMTOP_ADMIN_TOKEN) so the admin API is not open to the network"
        )
    if cfg.upstream:
        _refuse_loop(cfg)
    if cfg.workers < 1:
        raise ConfigError("workers must be at least 1")
    if cfg.workers > (most := max_workers()):
        raise ConfigError(
            f"workers {cfg.workers} is more than this machine can use: at most {most} "
            f"(2 per CPU, 4 on one; it has {usable_cpus()}); each worker is a whole proxy process "
            "that wants a core of its own — past that, more only adds switching")
    if cfg.dialect not in DIALECT_SETTINGS:
        raise ConfigError(f"dialect '{cfg.dialect}' is not one of {', '.join(DIALECT_SETTINGS)}")
    validate_slo(cfg, name)
    if cfg.gpu.source not in ("auto", "nvml", "sim", "none"):
        raise ConfigError(f"gpu.source '{cfg.gpu.source}' is not one of auto, nvml, sim, none")
    if cfg.user_header and not HEADER_NAME.fullmatch(cfg.user_header):
        # no client can send such a header: every request would count as "anonymous"
        raise ConfigError(f"user_header {printable(cfg.user_header)!r} is not a header name "
                          "(letters, digits and !#$%&'*+-.^_`|~ only)")
    if cfg.trusted_proxies:
        for entry in cfg.trusted_proxies:
            try:
                network_of(entry)
            except ValueError as exc:
                raise ConfigError(f"{name('trusted_proxies')}: {printable(str(exc))}") from None
    if bad := [d for d in cfg.gpu.devices if not 0 <= d < MAX_GPU_INDEX]:
        raise ConfigError(f"gpu.devices holds {bad[0]}: GPU indices are 0 to "
                          f"{MAX_GPU_INDEX - 1}, as nvidia-smi lists them")
    if twice := sorted({d for d in cfg.gpu.devices if cfg.gpu.devices.count(d) > 1}):
        # (each listed GPU would be read as many times a round, its panel rows repeated)
        raise ConfigError(f"gpu.devices lists GPU {twice[0]} more than once")
    if cfg.max_body_bytes < 1:
        raise ConfigError("max_body_bytes must be positive")
    if cfg.top_users < 1:
        raise ConfigError("top_users must be at least 1")
    if cfg.top_users > MAX_TOP_USERS:
        raise ConfigError(f"top_users must be at most {MAX_TOP_USERS:,} (each is a row of "
                          f"counters in every window), got {cfg.top_users:,}")
    for key in ("timeouts.connect_s", "timeouts.first_byte_s", "timeouts.idle_s",
                "gpu.interval_s", "engine.interval_s", "recording.flush_s",
                "recording.queue_max", "recording.queue_max_chunks", "warnings.window_s"):
        if (v := _get(cfg, key)) <= 0:
            raise ConfigError(f"{key} must be positive, got {v}")
    if not 0 < cfg.tui.refresh_hz <= MAX_REFRESH_HZ:
        raise ConfigError(f"tui.refresh_hz must be in (0, {MAX_REFRESH_HZ:g}], "
                          f"got {cfg.tui.refresh_hz:g}")
    for key in ("kv_cache_usage", "gpu_memory", "error_rate"):
        v = getattr(cfg.warnings, key)
        if not 0 < v <= 1:
            raise ConfigError(f"warnings.{key} must be a fraction more than 0 and at most 1 "
                              f"(e.g. 0.95, not a percent), got {v:g}")
    if not 1 <= cfg.warnings.bandwidth_pct <= 100:
        raise ConfigError("warnings.bandwidth_pct must be a percent from 1 to 100 (e.g. 80, "
                          f"not a fraction), got {cfg.warnings.bandwidth_pct:g}")
    if cfg.tui.window_s not in TUI_WINDOWS:
        raise ConfigError(f"tui.window_s must be 10, 60, 300 or 0 (the whole session), "
                          f"got {cfg.tui.window_s}")
    for key in ("timeouts.shutdown_grace_s", "warnings.raise_after_s",
                "warnings.clear_after_s"):
        if (v := _get(cfg, key)) < 0:
            raise ConfigError(f"{key} must be 0 or more (seconds), got {v}")
    for key, least, why in (
            ("gpu.interval_s", 0.01, "NVML reads block a thread"),
            ("engine.interval_s", 0.1, "each scrape is a request to the engine"),
            ("recording.flush_s", 0.01, "each flush is a write to the disk")):
        if (v := _get(cfg, key)) < least:
            # QA: gpu.interval_s = 1e-6 was accepted — a busy loop
            raise ConfigError(f"{key} must be at least {least:g} (seconds; {why}), got {v:g}")
    _validate_rotation(cfg.recording, name)
    if cfg.recording.path and (unnamed := nameless(cfg.recording.path)):
        raise ConfigError(f"{name('recording.path')} {printable(unnamed)}")
    if not cfg.warnings.stall_s > 0:
        raise ConfigError(f"warnings.stall_s must be more than 0 (seconds), "
                          f"got {cfg.warnings.stall_s}")
    for key in DURATION_KEYS:
        if (v := _get(cfg, key)) is not None and v > MAX_DURATION_S:
            raise ConfigError(f"{name(key)} must be at most {MAX_DURATION_S:,.0f} (seconds: "
                              f"a day), got {v:g}")


def validate_slo(cfg: Config, names: KeyNames | None = None) -> None:
    """ConfigError for an SLO that cannot be meant (the part of :func:`validate` a command
    that reads only the SLOs, ``bench``, asks for)."""
    name = names or KeyNames()
    if not 0 < cfg.slo.target <= 1:
        raise ConfigError(f"slo.target must be in (0, 1], got {cfg.slo.target}")
    for key in ("ttft_s", "itl_p95_s", "tpot_s", "e2e_s"):
        v = getattr(cfg.slo, key)
        if v is not None and v <= 0:
            raise ConfigError(f"slo.{key} must be positive, got {v}")
        if v is not None and v > MAX_DURATION_S:
            raise ConfigError(f"{name(f'slo.{key}')} must be at most {MAX_DURATION_S:,.0f} "
                              f"(seconds: a day), got {v:g}")


def _validate_rotation(rec: RecordingConfig, name: KeyNames) -> None:
    """ConfigError for rotation settings that cannot be meant: negative, a part smaller
    than a few of its own lines or shorter than a second, ``keep`` without rotation (it
    would bound nothing)."""
    mb, s, keep = "recording.rotate_mb", "recording.rotate_s", "recording.keep"
    for key in (mb, s, keep):
        if (v := getattr(rec, key.partition(".")[2])) < 0:
            raise ConfigError(f"{name(key)} must be 0 (off) or more, got {v:g}")
    if 0 < rec.rotate_mb < MIN_ROTATE_MB:
        raise ConfigError(f"{name(mb)} must be 0 (off) or at least {MIN_ROTATE_MB:g} (MB, "
                          f"10 kB: each part is a file of its own), got {rec.rotate_mb:g}")
    if rec.rotate_mb > MAX_ROTATE_MB:
        raise ConfigError(f"{name(mb)} must be at most {MAX_ROTATE_MB:,.0f} (MB, a terabyte "
                          f"a part), got {rec.rotate_mb:g}")
    if 0 < rec.rotate_s < MIN_ROTATE_S:
        raise ConfigError(f"{name(s)} must be 0 (off) or at least {MIN_ROTATE_S:g} "
                          f"(seconds), got {rec.rotate_s:g}")
    if rec.keep and not (rec.rotate_mb or rec.rotate_s):
        raise ConfigError(f"{name(keep)} needs rotation ({name.beside(keep, mb)} or "
                          f"{name.beside(keep, s)}): without it a recording is one file")


def _get(cfg: Config, key: str) -> Any:
    obj: Any = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def slo_dict(cfg: Config) -> dict[str, float]:
    """The configured SLOs as the recording header and snapshots carry them."""
    out = {k: v for k, v in dataclasses.asdict(cfg.slo).items() if v is not None}
    return out
