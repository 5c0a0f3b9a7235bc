"""Config: file < environment < flags, clear errors naming the key and the source."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from llmtop.config import ConfigError, env_name, flat_keys, load_config, parse_hostport

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "llmtop.toml"
    p.write_text(text)
    return p


def test_defaults_without_file_or_env() -> None:
    """No file, no environment: the documented defaults."""
    cfg = load_config(None, env={})
    assert cfg.listen == "127.0.0.1:8080"
    assert cfg.admin == "127.0.0.1:8081"
    assert cfg.slo.ttft_s == 0.5
    assert cfg.slo.target == 0.95
    assert cfg.max_body_bytes == 64 * 1024 * 1024


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    """Flags override the environment, which overrides the file."""
    p = write(tmp_path, 'upstream = "http://file:1"\nworkers = 3\n[slo]\nttft_s = 1.0\n')
    cfg = load_config(p, env={})
    assert (cfg.upstream, cfg.workers, cfg.slo.ttft_s) == ("http://file:1", 3, 1.0)
    env = {"LLMTOP_UPSTREAM": "http://env:2", "LLMTOP_SLO_TTFT_S": "2.5"}
    cfg = load_config(p, env=env)
    assert (cfg.upstream, cfg.workers, cfg.slo.ttft_s) == ("http://env:2", 3, 2.5)
    cfg = load_config(p, env=env, overrides={"upstream": "http://flag:3", "slo.ttft_s": None})
    assert (cfg.upstream, cfg.slo.ttft_s) == ("http://flag:3", 2.5)


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    p = write(tmp_path, "[slo]\nttft = 1\n")
    with pytest.raises(ConfigError, match=r"llmtop\.toml.*unknown key 'slo\.ttft'"):
        load_config(p, env={})


def test_wrong_type_names_key_and_file(tmp_path: Path) -> None:
    p = write(tmp_path, 'workers = "two"\n')
    with pytest.raises(ConfigError, match=r"llmtop\.toml: 'workers' must be an integer"):
        load_config(p, env={})
    p = write(tmp_path, "inject_usage = 1\n")
    with pytest.raises(ConfigError, match="'inject_usage' must be true or false"):
        load_config(p, env={})


def test_bad_env_value_names_variable() -> None:
    with pytest.raises(ConfigError, match="LLMTOP_WORKERS"):
        load_config(None, env={"LLMTOP_WORKERS": "many"})


def test_env_none_unsets_optional() -> None:
    cfg = load_config(None, env={"LLMTOP_SLO_ITL_P95_S": "none"})
    assert cfg.slo.itl_p95_s is None


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "this is = = not toml"), env={})
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml", env={})


def test_validation_errors() -> None:
    with pytest.raises(ConfigError, match="upstream"):
        load_config(None, env={}, overrides={"upstream": "ftp://x"})
    with pytest.raises(ConfigError, match="admin_token"):
        load_config(None, env={}, overrides={"admin": "0.0.0.0:9000"})
    cfg = load_config(None, env={}, overrides={"admin": "0.0.0.0:9000", "admin_token": "s"})
    assert cfg.admin_token == "s"
    with pytest.raises(ConfigError, match=r"slo\.target"):
        load_config(None, env={}, overrides={"slo.target": 1.5})


@pytest.mark.parametrize(("url", "message"), [
    ("http://host:99999", "not a valid URL: Port out of range"),
    ("http://h:abc", "not a valid URL: Port could not be cast"),
    ("http://[::1", "not a valid URL: Invalid IPv6 URL"),
    ("http://h:0/v1", "port 0 is not a port to connect to"),
    ("http://user:s3cret@127.0.0.1:8000/pre", "must not contain user:password@"),
    ("http://h:8000/v1?api-version=2024", "'http://h:8000/v1' must not have a query"),
    ("http://h:8000/#frag", "must not have a query or fragment"),
])
def test_bad_upstream_urls_are_one_clear_error(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("?", r"\?")) as err:
        load_config(None, env={}, overrides={"upstream": url})
    assert "s3cret" not in str(err.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "https://h/openai/v1/",
                                 "http://[::1]:8000/pre", "HTTP://Host:80"])
def test_good_upstream_urls_pass(url: str) -> None:
    assert load_config(None, env={}, overrides={"upstream": url}).upstream == url


def test_parse_hostport() -> None:
    assert parse_hostport("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_hostport("[::1]:8080") == ("::1", 8080)
    for bad in ("8080", "host:port", "h:70000"):
        with pytest.raises(ConfigError):
            parse_hostport(bad)


def test_example_file_documents_every_key_with_its_default() -> None:
    """config.example.toml loads cleanly, equals the defaults, and names every key."""
    example = ROOT / "config.example.toml"
    cfg = load_config(example, env={})
    assert cfg == load_config(None, env={})
    text = example.read_text()
    data = tomllib.loads(text)
    for key in flat_keys():
        section, _, name = key.rpartition(".")
        table = data.get(section, {}) if section else data
        mentioned = name in table or re.search(rf"^#\s*{re.escape(name)}\s*=", text, re.M)
        assert mentioned, f"config.example.toml does not document {key}"
    # ...and a key shown commented out (``# tpot_s = 0.05``: uncomment to use) is one too,
    # in the section it stands in: loading the file does not see it
    section, shown = "", []
    for line in text.splitlines():
        if m := re.match(r"^\[([\w.]+)\]", line):
            section = m.group(1) + "."
        elif m := re.match(r"^#\s*([a-z][a-z0-9_]*)\s*=\s*\S", line):
            shown.append(section + m.group(1))
    assert shown, "config.example.toml shows no commented-out key"
    assert [k for k in shown if k not in flat_keys()] == []


def test_env_names_are_unique() -> None:
    names = [env_name(k) for k in flat_keys()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_non_finite_numbers_are_refused_from_every_source(tmp_path: Path, bad: str) -> None:
    """NaN passes every ``<= 0`` check: a nan first_byte_s made every proxied request a
    500 and a nan TTFT objective an attainment of 0%."""
    with pytest.raises(ConfigError, match=r"'timeouts\.first_byte_s' must be a finite number"):
        load_config(write(tmp_path, f"[timeouts]\nfirst_byte_s = {bad}\n"), env={})
    with pytest.raises(ConfigError, match=r"LLMTOP_SLO_TTFT_S: 'slo\.ttft_s' must be a finite"):
        load_config(None, env={"LLMTOP_SLO_TTFT_S": bad})
    with pytest.raises(ConfigError, match=r"command line: 'slo\.e2e_s' must be a finite"):
        load_config(None, env={}, overrides={"slo.e2e_s": float(bad)})


def test_a_config_that_is_not_text_or_uses_a_section_as_a_value(tmp_path: Path) -> None:
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00junk\x80")
    with pytest.raises(ConfigError, match="not valid TOML: not UTF-8 text"):
        load_config(binary, env={})
    with pytest.raises(ConfigError, match=r"'slo' is a section: write \[slo\]"):
        load_config(write(tmp_path, "slo = 5\n"), env={})


@pytest.mark.parametrize("key", ["recording.queue_max", "recording.queue_max_chunks"])
def test_recorder_queue_bounds_must_be_positive(key: str) -> None:
    """A zero bound was a ValueError traceback from the recorder at start-up."""
    with pytest.raises(ConfigError, match=rf"{key} must be positive, got 0"):
        load_config(None, env={}, overrides={key: 0})


def test_the_recorder_gets_its_chunk_bound_from_the_config() -> None:
    from llmtop.bus import EventBus
    from llmtop.server import Observers

    cfg = load_config(None, env={}, overrides={"upstream": "http://127.0.0.1:9",
                                               "recording.queue_max_chunks": 1234})
    obs = Observers(cfg, EventBus(), {})
    assert obs.recording.queue_max_chunks == 1234
    assert obs.recording.queue_max == cfg.recording.queue_max


def test_workers_past_two_per_cpu_are_refused_with_the_machines_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """QA: ``llmtop run --workers 1000`` started processes one by one for minutes, then
    ended with an empty "error: " and a worker's BrokenPipeError traceback."""
    from llmtop.cli import main
    from llmtop.config import max_workers, usable_cpus

    most = max_workers()
    assert most == max(4, 2 * usable_cpus())
    load_config(env={}, overrides={"upstream": "http://127.0.0.1:9", "workers": most})
    with pytest.raises(ConfigError, match=rf"workers {most + 1} is more than this machine "
                                          rf"can use: at most {most} \(2 per CPU"):
        load_config(env={}, overrides={"upstream": "http://127.0.0.1:9", "workers": most + 1})
    assert main(["run", "--headless", "--upstream", "http://127.0.0.1:9",
                 "--workers", "1000"]) == 2
    err = capsys.readouterr().err
    assert f"at most {most}" in err and "Traceback" not in err
