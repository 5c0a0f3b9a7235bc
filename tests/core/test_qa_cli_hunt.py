"""User mistakes at the command line and in the config file found by trying them as a user
would (the hunt of Dec 7): each is one line on stderr with the exit status the codebase gives
a usage error (2), never a traceback, a silent misreading or a wrong message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_qa_config_bounds import RUN, one_error_line, run_cli


@pytest.mark.parametrize("value", ["1e308", "1e7"])
def test_a_huge_rotate_mb_is_refused_naming_the_flag(tmp_path: Path, value: str) -> None:
    """``--rotate-mb 1e308`` (and the same in the file or LLMTOP_RECORDING_ROTATE_MB) was
    taken, then the proxy died with an OverflowError traceback turning it into bytes."""
    rec = str(tmp_path / "rec.jsonl")
    line = one_error_line(run_cli(*RUN, "--record", rec, "--rotate-mb", value))
    assert line == ("llmtop run: error: --rotate-mb must be at most 1,000,000 (MB, a terabyte "
                    f"a part), got {float(value):g}")


def test_a_huge_rotate_mb_in_the_file_is_refused_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "llmtop.toml"
    cfg.write_text(f'[recording]\npath = "{tmp_path / "rec.jsonl"}"\nrotate_mb = 1e308\n')
    line = one_error_line(run_cli(*RUN, "--config", str(cfg)))
    assert line == ("llmtop run: error: recording.rotate_mb must be at most 1,000,000 (MB, a "
                    "terabyte a part), got 1e+308")


def test_bench_record_where_no_file_can_be_made_is_one_line() -> None:
    """/proc is a directory root may write to (the pre-check passes) where no file can be
    created: ``bench --record /proc/x.jsonl`` ended in a RecordingError traceback, exit 1."""
    line = one_error_line(run_cli("bench", "http://127.0.0.1:9", "--requests", "1",
                                  "--record", "/proc/llmtop-bench.jsonl"))
    assert line == ("llmtop bench: error: --record: /proc/llmtop-bench.jsonl: cannot create a "
                    "file there")


BENCH = ("bench", "http://127.0.0.1:9")


@pytest.mark.parametrize("rates", ["1e-300", "2,0.0001"])
def test_bench_refuses_a_rate_too_low_to_mean_anything(rates: str) -> None:
    """``--rate 1e-300`` passed the check (more than 0) and the load generator died with an
    OverflowError traceback scheduling its first arrival (a gap of 1e300 s)."""
    line = one_error_line(run_cli(*BENCH, "--rate", rates, "--duration", "1"))
    assert line == (f"llmtop bench: error: --rate '{rates}': every value must be at least "
                    "0.001 (a request every 1,000 s) and at most 10,000")


@pytest.mark.parametrize(("args", "seconds"), [
    (("--rate", "0.01", "--requests", "100"), 10_000),
    (("--rate", "1,2", "--requests", "3000"), 4_500),
    (("--rate", "2", "--requests", "7000", "--warmup", "100"), 3_600),
])
def test_bench_refuses_an_open_loop_of_requests_longer_than_max_duration(
        args: tuple[str, ...], seconds: int) -> None:
    """--max-duration refused a long plan by --duration only: ``--rate 0.01 --requests 100``
    (its arrivals alone take 10,000 s, near three hours) started without a word."""
    line = one_error_line(run_cli(*BENCH, *args, "--max-duration", "3599"))
    assert line == (f"llmtop bench: error: this plan could run {seconds} s, over "
                    "--max-duration 3599 s; lower --requests, raise --rate or raise "
                    "--max-duration")


SHORT = str(Path(__file__).resolve().parents[1] / "fixtures" / "recordings"
            / "sim_tiny_short.jsonl")


@pytest.mark.parametrize(("args", "name"), [
    (("report", ""), "FILE"),
    (("report", "", SHORT), "FILE"),
    (("report", SHORT, ""), "FILE2"),
    (("replay", ""), "FILE"),
    (("export", "", "--hlog", "-"), "FILE"),
])
def test_an_empty_recording_argument_is_named_as_such(args: tuple[str, ...], name: str) -> None:
    """An empty FILE (an unset shell variable) read as '.': ".: is a directory, not a
    recording"; an empty FILE2 was dropped, and the one report printed, exit 0, as if no
    comparison had been asked for."""
    line = one_error_line(run_cli(*args))
    assert line == (f"llmtop {args[0]}: error: {name} '' is empty: give a recording "
                    "(.jsonl or .jsonl.gz)" + (", or - for standard input"
                                                if args[0] != "replay" else ""))


def test_report_refuses_standard_input_twice() -> None:
    """``report - -``: the first read took all of standard input and the second found it
    'empty file, not an llmtop recording', which it was not."""
    with Path(SHORT).open("rb") as recording:
        p = subprocess.run([sys.executable, "-m", "llmtop", "report", "-", "-"],
                           capture_output=True, text=True, timeout=30, stdin=recording)
    line = one_error_line(p)
    assert line == ("llmtop report: error: FILE and FILE2 are both - (standard input): it can "
                    "be read once; give one of them as a file")


@pytest.mark.parametrize("command", [RUN, (*BENCH, "--requests", "1")])
def test_an_empty_config_path_is_named_as_such(command: tuple[str, ...]) -> None:
    """``--config ''`` (an unset variable) said ": config file not found", a message
    with no file in it."""
    line = one_error_line(run_cli(*command, "--config", ""))
    assert line == (f"llmtop {command[0]}: error: --config '' is empty: give a TOML file, or "
                    "leave --config out")


def test_a_config_file_that_never_ends_is_refused() -> None:
    """``--config /dev/zero`` (or a recording given for the config) was read whole before
    parsing: /dev/zero grew the process until memory ran out (here, under a 2 GiB address
    space limit, a MemoryError traceback, exit 1)."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    p = subprocess.run([sys.executable, "-m", "llmtop", *RUN, "--config", "/dev/zero"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       preexec_fn=limit)
    assert one_error_line(p) == ("llmtop run: error: /dev/zero: larger than 1 MB: not a "
                                 "config file (see config.example.toml)")


def test_bench_reads_the_slos_of_a_config_written_for_a_proxy(tmp_path: Path) -> None:
    """bench takes only the SLOs from --config, but refused the file for the proxy's
    settings it never uses: a run config whose admin API listens on the network (its token
    in the service's environment) said "admin '0.0.0.0:8081' is not loopback: set
    admin_token", and one with more workers than this machine's CPUs refused too."""
    import json

    cfg = tmp_path / "llmtop.toml"
    cfg.write_text('admin = "0.0.0.0:8081"\nworkers = 4096\n[slo]\nttft_s = 0.3\n')
    p = run_cli(*BENCH, "--requests", "1", "--json", "--config", str(cfg))
    assert p.returncode == 1, p.stderr  # (nothing listens at port 9: nothing succeeded)
    assert json.loads(p.stdout)["slo"]["ttft_s"] == 0.3
    assert "error: no request to http://127.0.0.1:9" in p.stderr


def test_bench_still_refuses_a_bad_slo_or_a_broken_file(tmp_path: Path) -> None:
    cfg = tmp_path / "llmtop.toml"
    cfg.write_text('admin = "0.0.0.0:8081"\n[slo]\ntarget = 2\n')
    line = one_error_line(run_cli(*BENCH, "--requests", "1", "--config", str(cfg)))
    assert line == "llmtop bench: error: slo.target must be in (0, 1], got 2.0"
    cfg.write_text('workers = "4"\n')
    line = one_error_line(run_cli(*BENCH, "--requests", "1", "--config", str(cfg)))
    assert line == f"llmtop bench: error: {cfg}: 'workers' must be an integer, got '4'"


def rotated(tmp_path: Path) -> Path:
    """A rotated recording's stem with two parts (the fixture's lines, as parts a rotating
    proxy writes: one series)."""
    import json

    lines = Path(SHORT).read_text().splitlines()
    header = json.loads(lines[0])
    names = ["prod.20261130T081220Z.jsonl", "prod.20261130T081225Z.jsonl"]
    for n, (name, body) in enumerate(zip(names, (lines[1:15], lines[15:]), strict=True), 1):
        part = {**header, "part": n, "previous": names[0] if n == 2 else None,
                "first": names[0]}
        (tmp_path / name).write_text("\n".join([json.dumps(part), *body]) + "\n")
    return tmp_path / "prod.jsonl"


@pytest.mark.parametrize("command", [("report", "{stem}", "-o", "{stem}"),
                                     ("export", "{stem}", "--hlog", "{stem}")])
def test_an_output_on_a_rotated_recordings_stem_is_refused(tmp_path: Path,
                                                           command: tuple[str, ...]) -> None:
    """``report prod.jsonl -o prod.jsonl`` (the stem, which names the parts but is no file)
    wrote the report there; from then on the stem read that text file instead of the parts:
    'not an llmtop recording'."""
    stem = rotated(tmp_path)
    assert run_cli("report", str(stem), "-q", "-o", "/dev/null").returncode == 0
    line = one_error_line(run_cli(*(a.format(stem=stem) for a in command)))
    assert line == (f"llmtop {command[0]}: error: {stem}: output is the stem of the rotated "
                    "recording read: a file there would be read instead of its parts")
    assert not stem.exists()


UP = ("run", "--headless", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0")


@pytest.mark.parametrize("url", [" http://127.0.0.1:9", "http://127.0.0.1:9 ",
                                 "http://gpu box:8000", "http://127.0.0.1:9/v1\t"])
def test_an_upstream_with_whitespace_in_it_is_refused_as_such(url: str) -> None:
    """A stray space (a line end, a tab) from a file or a variable: at the end it was 'Port
    could not be cast to integer value as '9 '', at the start or in the host it was taken,
    and every request then failed 'Name or service not known' (or went to the wrong
    place)."""
    line = one_error_line(run_cli(*UP, "--upstream", url))
    shown = url.replace("\t", "\\x09")
    assert line == (f"llmtop run: error: upstream '{shown}' has whitespace or a control "
                    "character in it (a stray space or line end?): a URL has none; in a path, "
                    "write a space %20")


def test_an_upstream_from_a_variable_with_a_line_end_is_refused_as_such() -> None:
    line = one_error_line(run_cli(*UP, env={"LLMTOP_UPSTREAM": "http://127.0.0.1:9\n"}))
    assert line.startswith("llmtop run: error: upstream 'http://127.0.0.1:9\\x0a' has "
                           "whitespace or a control character in it")


def test_report_to_a_directory_that_takes_no_file_fails_before_the_analysis() -> None:
    """/proc passes the permission check (root may write to it by mode) but takes no new
    file: ``report BIG -o /proc/x.txt`` analysed the whole recording (29 s for 230 MB)
    and only then said "cannot write: No such file or directory". The output's
    temporary file is now made (and removed) before the analysis."""
    line = one_error_line(run_cli("report", SHORT, "-o", "/proc/llmtop-report.txt"))
    assert line == ("llmtop report: error: /proc/llmtop-report.txt: cannot create a file "
                    "there (No such file or directory)")


def test_run_record_where_no_file_can_be_made_is_refused_before_listening() -> None:
    """``run --record /proc/x.jsonl``: the check before binding passed (root may write to
    /proc by mode), the proxy said 'listening on' twice and then exited 2 (under the TUI:
    'the proxy exited (exit code 2)', exit 1)."""
    line = one_error_line(run_cli(*RUN, "--record", "/proc/llmtop-run.jsonl"))
    assert line == ("llmtop run: error: /proc/llmtop-run.jsonl: cannot create a file there "
                    "(No such file or directory)")


def test_demo_record_where_no_file_can_be_made_is_a_usage_error() -> None:
    """The demo's proxy started, then died of it: 'the proxy exited (exit code 2: ...);
    stopped the simulator and the traffic driver', exit 1."""
    line = one_error_line(run_cli("demo", "--headless", "--duration", "5", "--record",
                                  "/proc/llmtop-demo.jsonl.gz"))
    assert line == ("llmtop demo: error: --record: /proc/llmtop-demo.jsonl.gz: cannot create "
                    "a file there (No such file or directory)")


def test_bench_refuses_an_empty_model_name() -> None:
    """``--model "$MODEL"`` with the variable unset sent "model": "" in every request (an
    engine answers 404 'model does not exist', or serves its default and the recording
    names no model), where --workload '' and --admin '' are refused."""
    line = one_error_line(run_cli(*BENCH, "--requests", "1", "--model", ""))
    assert line == ("llmtop bench: error: --model '' is empty: give the model's name, or leave "
                    "--model out to send 'default'")


@pytest.mark.parametrize(("toml", "said"), [
    ("[slo]\nttft_s = true\n", "'slo.ttft_s' must be a number, got true"),
    ("workers = false\n", "'workers' must be an integer, got false"),
    ("upstream = 2026-12-07\n", "'upstream' must be a string, got the date 2026-12-07"),
    ("[slo]\ntarget = 2026-12-07T10:00:00Z\n",
     "'slo.target' must be a number, got the date and time 2026-12-07T10:00:00+00:00"),
    ("listen = {host = \"0.0.0.0\"}\n", "'listen' must be a string, got a table"),
    ("[gpu]\ndevices = [0, true]\n", "'gpu.devices' must be a list of integers, got [0, true]"),
])
def test_a_wrong_type_in_the_file_is_quoted_as_toml_writes_it(tmp_path: Path, toml: str,
                                                              said: str) -> None:
    """The value was quoted as Python writes it: 'got True', 'got datetime.date(2026, 12,
    7)', "got {'host': '0.0.0.0'}" — words the file does not have."""
    cfg = tmp_path / "llmtop.toml"
    cfg.write_text(toml)
    line = one_error_line(run_cli(*RUN, "--config", str(cfg)))
    assert line == f"llmtop run: error: {cfg}: {said}"


def test_bench_names_a_misspelt_slo_variable() -> None:
    """bench takes its SLO defaults from LLMTOP_SLO_*, but a misspelt one
    (``LLMTOP_SLO_TTFT`` for ``LLMTOP_SLO_TTFT_S``) was ignored without a word, and the
    run judged by the default 0.5 s; ``run`` has said so since its start-up warnings."""
    p = run_cli(*BENCH, "--requests", "1", "--json", env={"LLMTOP_SLO_TTFT": "0.3"})
    assert p.returncode == 1, p.stderr  # (nothing listens at port 9)
    warned = [ln for ln in p.stderr.splitlines() if "warning" in ln]
    assert warned == ["llmtop bench: warning: LLMTOP_SLO_TTFT is not an llmtop setting (did "
                      "you mean LLMTOP_SLO_TTFT_S?); ignored"], p.stderr


@pytest.mark.parametrize(("args", "env", "what"), [
    (("--upstream-ca", "/etc/ssl/certs/ca-certificates.crt"), {}, "--upstream-ca"),
    ((), {"LLMTOP_UPSTREAM_VERIFY": "false"}, "upstream_verify = false"),
])
def test_tls_settings_for_a_plain_http_upstream_are_named(
        args: tuple[str, ...], env: dict[str, str], what: str) -> None:
    """--upstream-ca (or upstream_verify = false) with an http:// upstream — https meant,
    the s left out — was taken without a word and never used."""
    if args and not Path(args[1]).is_file():
        pytest.skip("no system CA bundle to name")
    p = run_cli("run", "--headless", "--upstream", "http://127.0.0.1:9", "--listen",
                "no-such-host.invalid:0", "--admin", "127.0.0.1:0", "--gpu-source", "none",
                *args, env=env)
    warned = [ln for ln in p.stderr.splitlines() if "warning" in ln]
    assert warned == [f"llmtop run: warning: {what} is for an https upstream, and "
                      "'http://127.0.0.1:9' is plain http: it is not used (https:// meant?)"]


def test_tls_settings_for_an_https_upstream_are_not_warned_of() -> None:
    p = run_cli("run", "--headless", "--upstream", "https://127.0.0.1:9", "--listen",
                "no-such-host.invalid:0", "--admin", "127.0.0.1:0", "--gpu-source", "none",
                env={"LLMTOP_UPSTREAM_VERIFY": "false"})
    assert p.returncode == 2 and "warning" not in p.stderr, p.stderr


@pytest.mark.parametrize(("args", "said"), [
    (("--gpus", "0,1", "--gpu-source", "none"),
     "--gpus 0,1 picks NVIDIA GPUs to sample, and --gpu-source is 'none': it is not used"),
    (("--gpus", "1", "--gpu-source", "sim"),
     "--gpus 1 picks NVIDIA GPUs to sample, and --gpu-source is 'sim': it is not used"),
])
def test_gpu_indices_with_a_source_that_reads_none_are_named(args: tuple[str, ...],
                                                             said: str) -> None:
    """--gpus with --gpu-source none (or sim: the simulator has one GPU of its own) was
    taken without a word and never used."""
    p = run_cli("run", "--headless", "--upstream", "http://127.0.0.1:9", "--listen",
                "no-such-host.invalid:0", "--admin", "127.0.0.1:0", *args)
    warned = [ln for ln in p.stderr.splitlines() if "warning" in ln]
    assert warned == [f"llmtop run: warning: {said}"], p.stderr
