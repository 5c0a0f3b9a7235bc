"""``--listen`` / ``--admin`` (and listen/admin in the config): each mistake is one line
that says how to write the address. Before: ``--listen ::1`` got as far as bind and said
'listen address ::1: Unknown error -2'; ``[::1]`` said "port '1]' is not a number";
``http://127.0.0.1:80`` and ``host name:80`` reached bind too; ``127.0.0.1:+80``,
``127.0.0.1: 80`` and Arabic-Indic digits were taken as port 80."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmtop.config import ConfigError, parse_hostport


@pytest.mark.parametrize(("value", "message"), [
    ("::1", "an IPv6 address goes in brackets before the port, e.g. [::1]:8080"),
    ("[::1]", "must be HOST:PORT, e.g. 127.0.0.1:8080 or [::1]:8080"),
    ("[::1]8080", "must be HOST:PORT"),
    ("[fe80::1", "must be HOST:PORT"),
    ("[]:80", "must be HOST:PORT"),
    (":", "port '' is not a number"),
    ("host name:80", "must be HOST:PORT"),
    ("http://127.0.0.1:80", "is an address, not a URL"),
    ("127.0.0.1:+80", "port '+80' is not a number"),
    ("127.0.0.1: 80", "port ' 80' is not a number"),
    ("127.0.0.1:\u0668\u0660", "is not a number"),
    ("127.0.0.1:", "port '' is not a number"),
    ("127.0.0.1:65536", "port must be 0..65535"),
])
def test_bad_addresses_say_how_to_write_one(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_hostport(value, "listen")
    assert message in str(exc.value)
    assert str(exc.value).startswith(f"listen '{value}'")


@pytest.mark.parametrize(("value", "parsed"), [
    ("[::1]:8080", ("::1", 8080)),
    ("::1:8080", ("::1", 8080)),  # unbracketed, but what precedes the port is IPv6
    ("[::]:0", ("::", 0)),
    ("0.0.0.0:8080", ("0.0.0.0", 8080)),
    ("localhost:65535", ("localhost", 65535)),
    (" 127.0.0.1:8080 ", ("127.0.0.1", 8080)),
    (":0", ("127.0.0.1", 0)),  # README: `--listen :0` picks a free port
    (":8080", ("127.0.0.1", 8080)),
])
def test_good_addresses(value: str, parsed: tuple[str, int]) -> None:
    assert parse_hostport(value) == parsed


def test_run_says_it_before_binding() -> None:
    p = subprocess.run([sys.executable, "-m", "llmtop", "run", "--headless", "--upstream",
                        "http://127.0.0.1:9", "--admin", "127.0.0.1:0", "--listen", "::1"],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [
        "llmtop run: error: listen '::1': an IPv6 address goes in brackets before the port, "
        "e.g. [::1]:8080"]


def test_listen_colon_zero_as_the_readme_has_it() -> None:
    """README: "`--listen :0` picks a free port" — it was refused ("must be HOST:PORT")."""
    import signal

    p = subprocess.Popen([sys.executable, "-m", "llmtop", "run", "--headless", "--upstream",
                          "http://127.0.0.1:9", "--listen", ":0", "--admin", ":0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL)
    try:
        assert p.stdout is not None
        first, second = p.stdout.readline(), p.stdout.readline()
        assert first.startswith("llmtop: proxy listening on http://127.0.0.1:"), first
        assert second.startswith("llmtop: admin listening on http://127.0.0.1:"), second
        assert not first.rstrip().endswith(":0")
    finally:
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "Traceback" not in err
