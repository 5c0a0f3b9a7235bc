"""Security: who can reach the admin API, what never leaves the process, and how
user-controlled strings are shown.

* the admin API is on loopback by default; any other address needs a token, and with a
  token every admin route demands it (compared in constant time); without one, requests
  from web pages (a foreign ``Origin``, or a ``Host`` that is not loopback) are refused;
* the proxy port never answers admin routes: they go upstream like any other path;
* planted secrets (API keys, prompt and completion text) appear in no output: the
  recording, stdout/stderr, snapshots, /metrics, the request lists, the TUI;
* hostile user and model names are escaped where rendered (TUI markup, HTML report,
  Prometheus labels) and the /metrics user label stays bounded.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import json
import random
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rel_support import CHAT, Conn, ThreadedUpstream, UpReq, llmtop_process, sse

from llmtop.config import Config, is_loopback

TOKEN = "adm-T0ken-5ecret-77"
ADMIN_ROUTES = [("GET", "/llmtop/v1/snapshot"), ("GET", "/llmtop/v1/snapshot?window=all"),
                ("GET", "/llmtop/v1/requests?state=active"),
                ("GET", "/llmtop/v1/requests?state=recent"), ("GET", "/llmtop/v1/recording"),
                ("GET", "/llmtop/v1/health"), ("GET", "/metrics"),
                ("POST", "/llmtop/v1/recording"), ("GET", "/llmtop/v1/no-such-route")]


def http(method: str, url: str, *, body: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        with e:  # (its socket, closed now: not left for a later test's garbage collection)
            return e.code, e.read()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "llmtop", *args], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "LLMTOP_GPU_SOURCE": "none", **(env or {})})


# -- the admin address ----------------------------------------------------------------------


def test_admin_and_proxy_listen_on_loopback_by_default() -> None:
    cfg = Config()
    assert cfg.admin == "127.0.0.1:8081" and cfg.listen == "127.0.0.1:8080"
    assert is_loopback(cfg.admin.rsplit(":", 1)[0])


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "localhost", "::1"])
def test_loopback_hosts_are_recognised(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "127.0.0.1.nip.io",
                                  "127.evil.example", "::ffff:10.0.0.1", "0"])
def test_non_loopback_hosts_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


@pytest.mark.parametrize(
    ("how", "admin"),
    [("flag", "0.0.0.0:0"), ("flag", "[::]:0"), ("flag", "127.0.0.1.nip.io:0"),
     ("env", "0.0.0.0:0")],
)
def test_non_loopback_admin_without_token_exits_2(how: str, admin: str) -> None:
    args = ["run", "--headless", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0"]
    env = {"LLMTOP_ADMIN_TOKEN": ""}
    if how == "flag":
        args += ["--admin", admin]
    else:
        env["LLMTOP_ADMIN"] = admin
    r = run_cli(*args, env=env)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "admin_token" in lines[0] and "Traceback" not in r.stderr, r
    assert "listening" not in r.stdout


def test_token_compare_is_constant_time() -> None:
    """Both places that check a shared secret use a constant-time compare, and neither
    compares it with ``==``."""
    from llmtop import workers
    from llmtop.admin import routes

    for mod in (routes, workers):
        src = inspect.getsource(mod)
        assert "compare_digest" in src, mod.__name__
        assert not re.search(r"(==|!=)\s*(self\.)?token\b|\btoken\s*(==|!=)", src), mod.__name__


def test_every_admin_route_requires_the_token(tmp_path: Path) -> None:
    with llmtop_process(tmp_path, "http://127.0.0.1:9", "--admin-token", TOKEN) as p:
        for method, path in ADMIN_ROUTES:
            body = b'{"action": "stop"}' if method == "POST" else None
            for headers in ({}, {"Authorization": "Bearer wrong"},
                            {"Authorization": f"Bearer {TOKEN}x"},
                            {"Authorization": f"Bearer {TOKEN[:-1]}"},
                            {"Authorization": TOKEN}, {"X-Api-Key": TOKEN},
                            {"Authorization": f"Basic {TOKEN}"}):
                status, data = http(method, p.admin_url + path, body=body, headers=headers)
                assert status == 401, (method, path, headers, status, data[:200])
                assert TOKEN.encode() not in data
            status, data = http(method, p.admin_url + path, body=body,
                                headers={"Authorization": f"Bearer {TOKEN}"})
            assert status != 401, (method, path, data[:200])
            expected = 404 if "no-such" in path else (409 if method == "POST" else 200)
            assert status == expected, (method, path, status, data[:200])
        # a non-ASCII token attempt is refused, not a crash
        status, _ = http("GET", p.admin_url + "/llmtop/v1/health",
                         headers={"Authorization": "Bearer t\u00f6ken".encode().decode("latin-1")})
        assert status == 401
        assert "Traceback" not in p.output() and TOKEN not in p.output()


def test_non_loopback_admin_with_a_token_starts_and_guards(tmp_path: Path) -> None:
    with llmtop_process(tmp_path, "http://127.0.0.1:9", "--admin", "0.0.0.0:0",
                        "--admin-token", TOKEN) as p:
        port = p.admin_url.rsplit(":", 1)[1]
        base = f"http://127.0.0.1:{port}"
        assert http("GET", base + "/llmtop/v1/snapshot")[0] == 401
        assert http("GET", base + "/llmtop/v1/snapshot",
                    headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200


def test_web_pages_cannot_drive_or_read_a_loopback_admin_api(tmp_path: Path) -> None:
    """Without a token: a cross-site POST (``text/plain`` needs no CORS preflight) cannot
    start a recording, and a DNS-rebound name (Host not loopback) cannot read the
    snapshot; clients that name the admin API as localhost or a loopback address can."""
    target = tmp_path / "planted.jsonl"
    with llmtop_process(tmp_path, "http://127.0.0.1:9") as p:
        port = p.admin_url.rsplit(":", 1)[1]
        start = json.dumps({"action": "start", "path": str(target)}).encode()
        for origin in ("http://evil.example", "null", f"http://evil.example:{port}"):
            status, data = http("POST", p.admin_url + "/llmtop/v1/recording", body=start,
                                headers={"Origin": origin, "Content-Type": "text/plain"})
            assert status == 403, (origin, status, data[:300])
            assert b"web page" in data and b"Traceback" not in data
        assert not target.exists()
        assert json.loads(http("GET", p.admin_url + "/llmtop/v1/recording")[1]) == {
            "available": True, "recording": None}
        for host in (f"evil.example:{port}", "127.0.0.1.nip.io", f"localhost.evil:{port}",
                     f"[::2]:{port}"):
            status, data = http("GET", p.admin_url + "/llmtop/v1/snapshot",
                                headers={"Host": host})
            assert status == 403 and b"DNS rebinding" in data, (host, status, data[:300])
            assert b'"system"' not in data
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}",
                     f"127.9.8.7:{port}", f"app.localhost:{port}", "localhost."):
            status, data = http("GET", p.admin_url + "/llmtop/v1/snapshot",
                                headers={"Host": host})
            assert status == 200 and b'"system"' in data, (host, status, data[:300])
        # a page the admin API served itself would be same-origin (it serves none)
        status, _ = http("GET", p.admin_url + "/llmtop/v1/health",
                         headers={"Origin": f"http://127.0.0.1:{port}"})
        assert status == 200
        assert "Traceback" not in p.output()


def test_with_a_token_any_host_name_is_answered(tmp_path: Path) -> None:
    """The token is what a web page lacks: with one, a reverse proxy that passes its own
    Host through still reaches a loopback admin API."""
    with llmtop_process(tmp_path, "http://127.0.0.1:9", "--admin-token", TOKEN) as p:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert http("GET", p.admin_url + "/llmtop/v1/snapshot",
                    headers={"Host": "llmtop.example.com", **auth})[0] == 200
        assert http("GET", p.admin_url + "/llmtop/v1/snapshot",
                    headers={"Host": "llmtop.example.com"})[0] == 401


# -- the proxy port -------------------------------------------------------------------------


def test_the_proxy_port_forwards_admin_paths_upstream(tmp_path: Path) -> None:
    up = ThreadedUpstream()
    try:
        with llmtop_process(tmp_path, up.url, "--record", str(tmp_path / "r.jsonl")) as p:
            for method, path in ADMIN_ROUTES:
                body = b'{"action": "stop"}' if method == "POST" else None
                status, data = http(method, p.proxy_url + path, body=body)
                assert (status, data) == (200, b'{"ok":true}'), (path, status, data[:300])
            seen = [(r.method, r.path) for r in up.up.requests]
            assert seen == ADMIN_ROUTES  # every one reached the upstream, unchanged
            # and the POST did not stop the recording llmtop is making
            status, data = http("GET", p.admin_url + "/llmtop/v1/recording")
            assert status == 200 and json.loads(data)["recording"] is not None
    finally:
        up.close()


# -- planted secrets ------------------------------------------------------------------------

KEY_BEARER = "sk-PLANTEDbearer-9f8e7d6c5b4a"
KEY_X_API = "sk-ant-PLANTEDxapi-1a2b3c4d5e"
KEY_BASIC = "UExBTlRFRGJhc2ljOnB3ZA=="
KEY_QUERY = "PLANTEDquerykey-31337"
KEY_AZURE = "PLANTEDazurekey-7e6d5c4b"
KEY_GOOGLE = "PLANTEDgoogkey-0a9b8c7d"
PROMPT = "PLANTED-PROMPT-quokka-7731"
COMPLETION = "PLANTED-COMPLETION-narwhal-4410"
SYSTEM = "PLANTED-SYSTEM-axolotl-2208"
SECRETS = [KEY_BEARER, KEY_X_API, KEY_BASIC, KEY_QUERY, KEY_AZURE, KEY_GOOGLE, PROMPT,
           COMPLETION, SYSTEM, "9f8e7d6c5b4a", "1a2b3c4d5e", "7e6d5c4b", "0a9b8c7d",
           "quokka-7731", "narwhal-4410", "axolotl-2208"]


async def planted_completion(conn: Conn, req: UpReq) -> bool:
    """A stream whose text is the planted completion, then a mid-stream error event.
    (An error event that *quotes the prompt* is test_rel_proxy_defects.py's case.)"""
    await conn.head(200, [("Content-Type", "text/event-stream")])
    for word in (COMPLETION, " and ", COMPLETION):
        await conn.chunk(sse({"model": "m",
                              "choices": [{"index": 0, "delta": {"content": word}}]}))
    await conn.chunk(sse({"error": {"message": "engine overloaded", "type": "overloaded"}}))
    await conn.chunk(b"data: [DONE]\n\n")
    await conn.end()
    return True


async def planted_json(conn: Conn, req: UpReq) -> bool:
    body = json.dumps({"model": "m", "choices": [{"message": {"content": COMPLETION}}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 2}}).encode()
    await conn.head(200, [("Content-Type", "application/json"),
                          ("Content-Length", str(len(body)))], chunked=False)
    await conn.send(body)
    return True


async def planted_400(conn: Conn, req: UpReq) -> bool:
    body = json.dumps({"error": {"message": f"prompt too long: {PROMPT} {KEY_BEARER}",
                                 "type": "invalid_request_error"}}).encode()
    await conn.head(400, [("Content-Type", "application/json"),
                          ("Content-Length", str(len(body)))], chunked=False)
    await conn.send(body)
    return True


async def planted_stall(conn: Conn, req: UpReq) -> bool:
    await conn.head(200, [("Content-Type", "text/event-stream")])
    await conn.chunk(sse({"model": "m",
                          "choices": [{"index": 0, "delta": {"content": COMPLETION}}]}))
    await conn.hold()
    return False


def screen_text_of(snapshot: dict[str, Any], requests: list[dict[str, Any]],
                   size: tuple[int, int] = (200, 60)) -> str:
    """Render the real TUI over a snapshot (and request list); returns the screen text."""
    from rich.console import Console

    from llmtop.tui.app import LlmtopApp

    class Source:
        async def fetch(self, window_s: int | None) -> dict[str, Any]:
            return json.loads(json.dumps(snapshot))

        async def active_requests(self) -> list[dict[str, Any]]:
            return json.loads(json.dumps(requests))

        async def recording(self, action: str, path: str | None) -> dict[str, Any]:
            return {}

        def describe(self) -> str:
            return "test"

        async def close(self) -> None:
            return None

    async def run() -> str:
        app = LlmtopApp(Source(), refresh_hz=20, clock=lambda: snapshot.get("time", 0.0))
        async with app.run_test(size=size) as pilot:
            for _ in range(200):
                if app.refreshes >= 2:
                    break
                await pilot.pause(0.02)
            assert app.refreshes >= 1
            await pilot.pause(0.1)
            console = Console(width=size[0], height=size[1], file=io.StringIO(), record=True,
                              force_terminal=True, color_system="truecolor")
            console.print(app.screen._compositor.render_update(
                full=True, screen_stack=app._background_screens))
            return console.export_text()

    return asyncio.run(run())


def test_planted_secrets_never_leave_the_process(tmp_path: Path) -> None:
    up = ThreadedUpstream({"stream": planted_completion, "json": planted_json,
                           "400": planted_400, "stall": planted_stall})
    record = tmp_path / "secrets.jsonl"
    outputs: dict[str, bytes] = {}
    try:
        with llmtop_process(tmp_path, up.url, "--record", str(record)) as p:
            chat = {"model": "m", "stream": True,
                    "messages": [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": PROMPT}]}
            cases = [({"Authorization": f"Bearer {KEY_BEARER}"}, "stream", CHAT),
                     ({"x-api-key": KEY_X_API}, "stream", "/v1/messages"),
                     ({"Authorization": f"Basic {KEY_BASIC}"}, "json", CHAT),
                     ({"Authorization": f"Bearer {KEY_BEARER}"}, "400", CHAT),
                     ({"Authorization": f"Bearer {KEY_BEARER}"}, "json",
                      f"{CHAT}?key={KEY_QUERY}"),
                     ({"x-api-key": KEY_X_API}, "json", "/api/chat"),
                     ({"api-key": KEY_AZURE}, "stream", CHAT),
                     ({"x-goog-api-key": KEY_GOOGLE}, "json", CHAT)]
            for headers, fault, path in cases:
                status, data = http("POST", p.proxy_url + path, body=json.dumps(chat).encode(),
                                    headers={**headers, "X-Fault": fault,
                                             "Content-Type": "application/json"})
                assert COMPLETION.encode() in data or status == 400  # the client got it all
            # one request still open while the admin API is read
            import threading

            def stalled(*args: Any, **kw: Any) -> None:
                import contextlib
                from http.client import HTTPException

                with contextlib.suppress(OSError, HTTPException):
                    http(*args, **kw)

            t = threading.Thread(target=stalled, args=("POST", p.proxy_url + CHAT), kwargs={
                "body": json.dumps(chat).encode(), "timeout": 30,
                "headers": {"Authorization": f"Bearer {KEY_BEARER}", "X-Fault": "stall",
                            "Content-Type": "application/json"}}, daemon=True)
            t.start()
            for _ in range(100):
                status, data = http("GET", p.admin_url + "/llmtop/v1/requests?state=active")
                if json.loads(data):
                    break
                import time

                time.sleep(0.05)
            outputs["requests?state=active"] = data
            assert json.loads(data), "the stalled request should be active"
            import time

            time.sleep(1.2)  # one bus pump and tick later
            for path in ("/llmtop/v1/snapshot?window=10", "/llmtop/v1/snapshot?window=all",
                         "/llmtop/v1/snapshot?window=60&user_histograms=1",
                         "/llmtop/v1/requests?state=recent&limit=500",
                         "/llmtop/v1/recording", "/llmtop/v1/health", "/metrics"):
                status, data = http("GET", p.admin_url + path)
                assert status == 200, (path, data[:200])
                outputs[path] = data
            snapshot = json.loads(outputs["/llmtop/v1/snapshot?window=all"])
            recent = json.loads(outputs["/llmtop/v1/requests?state=recent&limit=500"])
            active = json.loads(outputs["requests?state=active"])
            users = {u["user"] for u in snapshot["users"]}
            assert any(u.startswith("key:") for u in users), users  # the pseudonym is there
            assert len(recent) == len(cases)
            outputs["tui"] = screen_text_of(snapshot, active).encode()
            assert b"key:" in outputs["tui"]
            p.proc.send_signal(signal.SIGTERM)
            assert p.proc.wait(30) == 0
            t.join(10)
            outputs["stdout+stderr"] = p.output().encode()
        outputs["recording"] = record.read_bytes()
    finally:
        up.close()
    assert b'"type":"request"' in outputs["recording"]
    leaks = [(name, s) for name, data in outputs.items() for s in SECRETS
             if s.encode() in data or json.dumps(s)[1:-1].encode() in data]
    print(f"secret grep: {len(SECRETS)} planted strings × {len(outputs)} outputs "
          f"({sum(len(d) for d in outputs.values())} bytes): {len(leaks)} found")
    assert not leaks, leaks


# -- hostile names --------------------------------------------------------------------------

HOSTILE = ["[bold red]x[/]", "<script>alert(1)</script>", 'q"uo\'te', "new\nline",
           "back\\slash", "[link=http://e.vil]click[/link]", "tab\there", "\u202eevil"]


async def echo_model(conn: Conn, req: UpReq) -> bool:
    """A normal stream that names the model the request asked for (as engines do)."""
    try:
        model = json.loads(req.body).get("model", "m")
    except ValueError:
        model = "m"
    await conn.head(200, [("Content-Type", "text/event-stream")])
    for word in ("Hello", " world"):
        await conn.chunk(sse({"model": model,
                              "choices": [{"index": 0, "delta": {"content": word}}]}))
    await conn.chunk(b"data: [DONE]\n\n")
    await conn.end()
    return True


def test_hostile_names_are_escaped_in_every_output(tmp_path: Path) -> None:
    """Users and models named like markup, HTML, label syntax and control characters,
    sent through the real proxy, come out literal in /metrics, the snapshot, the TUI
    and the HTML report."""
    up = ThreadedUpstream({"echo-model": echo_model})
    record = tmp_path / "hostile.jsonl"
    try:
        with llmtop_process(tmp_path, up.url, "--record", str(record)) as p:
            for name in HOSTILE:
                body = {"model": f"model-{name}", "stream": True, "user": name,
                        "messages": [{"role": "user", "content": "hi"}]}
                status, data = http("POST", p.proxy_url + CHAT, body=json.dumps(body).encode(),
                                    headers={"Content-Type": "application/json",
                                             "X-Fault": "echo-model"})
                assert status == 200, data
            # a non-UTF-8 user header: the proxy must still produce valid text everywhere
            import socket

            host, port = p.proxy_url.rsplit("/", 1)[1].split(":")
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/json\r\nContent-Length: 2\r\n"
                          b"X-LLMTOP-User: bad\xff\xfebytes\r\nConnection: close\r\n\r\n{}")
                reply = b""
                while chunk := s.recv(65536):
                    reply += chunk
            assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
            import time

            time.sleep(1.2)
            status, metrics = http("GET", p.admin_url + "/metrics")
            assert status == 200, metrics[:300]
            status, snap_raw = http("GET", p.admin_url + "/llmtop/v1/snapshot?window=all")
            assert status == 200
            status, recent_raw = http("GET", p.admin_url + "/llmtop/v1/requests?state=recent")
            assert status == 200
            p.proc.send_signal(signal.SIGTERM)
            assert p.proc.wait(30) == 0
    finally:
        up.close()
    snapshot = json.loads(snap_raw)
    users = {u["user"] for u in snapshot["users"]}
    assert set(HOSTILE) <= users, users
    for u in users:
        u.encode("utf-8")  # valid text (no lone surrogates from undecodable bytes)
    recent = json.loads(recent_raw)
    assert {f"model-{n}" for n in HOSTILE} <= {r["model"] for r in recent}

    # Prometheus: label values round-trip exactly; no name starts a line of its own
    text = metrics.decode("utf-8")
    labels = {s.labels.get("user") for fam in text_string_to_metric_families(text)
              for s in fam.samples} - {None}
    assert set(HOSTILE) <= labels, labels - set(HOSTILE)
    for line in text.splitlines():
        assert line.startswith(("#", "llmtop_", "python_", "process_")) or not line, line

    # TUI: markup is shown literally, never interpreted (the text itself is on screen)
    screen = screen_text_of(snapshot, recent, size=(220, 70))
    assert "[bold red]x[/]" in screen, screen
    assert "<script>alert(1)</script>" in screen

    # HTML report: escaped
    out = tmp_path / "report.html"
    r = run_cli("report", str(record), "--format", "html", "-o", str(out))
    assert r.returncode == 0, r
    page = out.read_text("utf-8")
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "q&quot;uo&#x27;te" in page


def test_metrics_user_label_is_bounded_under_500_random_users(tmp_path: Path) -> None:
    up = ThreadedUpstream()
    try:
        with llmtop_process(tmp_path, up.url) as p:
            async def fire() -> None:
                import aiohttp

                async with aiohttp.ClientSession() as s:
                    async def one(i: int) -> None:
                        user = f"rnd-{random.getrandbits(64):016x}"
                        async with s.post(p.proxy_url + CHAT, json={"model": "m"},
                                          headers={"X-LLMTOP-User": user}) as r:
                            assert r.status == 200
                            await r.read()

                    for b in range(0, 500, 50):
                        await asyncio.gather(*(one(i) for i in range(b, b + 50)))

            asyncio.run(fire())
            import time

            time.sleep(1.2)
            status, metrics = http("GET", p.admin_url + "/metrics")
            status2, snap = http("GET", p.admin_url + "/llmtop/v1/snapshot?window=all")
    finally:
        up.close()
    assert status == status2 == 200
    fams = list(text_string_to_metric_families(metrics.decode()))
    users = {s.labels["user"] for f in fams for s in f.samples if "user" in s.labels}
    total = sum(s.value for f in fams for s in f.samples
                if s.name == "llmtop_requests_total")
    print(f"/metrics: 500 random users → {len(users)} user label values, "
          f"{len(metrics)} bytes")
    top_users = Config().top_users
    assert 1 < len(users) <= top_users + 1, users
    assert "other" in users
    assert total == 500
    assert len(json.loads(snap)["users"]) <= top_users + 1


def test_workers_with_an_admin_token_still_record_every_request(tmp_path: Path) -> None:
    """``--workers N --admin-token T``: the workers' events reach the coordinator (their
    ingest route checks its own secret), so nothing is lost to the admin token guard."""
    up = ThreadedUpstream()
    record = tmp_path / "workers.jsonl"
    try:
        with llmtop_process(tmp_path, up.url, "--workers", "2", "--admin-token", TOKEN,
                            "--record", str(record)) as p:
            for i in range(20):
                status, _ = http("POST", p.proxy_url + CHAT, body=b'{"stream": true}',
                                 headers={"X-LLMTOP-User": f"w-{i}",
                                          "Content-Type": "application/json"})
                assert status == 200
            import time

            auth = {"Authorization": f"Bearer {TOKEN}"}
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                snap = json.loads(http("GET", p.admin_url + "/llmtop/v1/snapshot?window=all",
                                       headers=auth)[1])
                if snap["system"]["requests"] >= 20:
                    break
                time.sleep(0.2)
            # the ingest route itself still refuses anyone without the workers' secret
            status, _ = http("POST", p.admin_url + "/llmtop/v1/_ingest", body=b"{}",
                             headers=auth)
            assert status == 403
            p.proc.send_signal(signal.SIGTERM)
            assert p.proc.wait(30) == 0
    finally:
        up.close()
    assert snap["system"]["requests"] == 20, snap["system"]
    from soak_driver import read_request_records

    records, summary = read_request_records(record)
    assert summary["complete"] and sorted(r["user"] for r in records) == sorted(
        f"w-{i}" for i in range(20))
