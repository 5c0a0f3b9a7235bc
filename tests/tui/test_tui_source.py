"""AdminSource over real sockets: windows, tokens, failures, several proxies, recording."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from tui_support import AdminServer

from llmtop.tui.source import (
    AdminSource,
    MergeUnavailable,
    ReplayControl,
    SnapshotSource,
    SourceUnavailable,
    load_merge,
    normalize_admin_url,
    per_proxy_path,
)


def sum_merge(snaps: list[dict[str, Any]]) -> dict[str, Any]:
    """A stand-in merge for these tests: sums rps and concatenates users (the exact
    histogram merge is llmtop.metrics.merge's and is tested there)."""
    out = dict(snaps[0])
    out["system"] = {"rps": sum(s["system"]["rps"] for s in snaps)}
    out["users"] = [u for s in snaps for u in s["users"]]
    return out


@pytest.mark.parametrize(
    ("given", "normal"),
    [("127.0.0.1:8081", "http://127.0.0.1:8081"),
     ("http://h:1/", "http://h:1"),
     ("https://admin.example/prefix/", "https://admin.example/prefix"),
     ("http://h:1/llmtop/v1/snapshot", "http://h:1"),
     (" [::1]:8081 ", "http://[::1]:8081")],
)
def test_normalize_admin_url(given: str, normal: str) -> None:
    """Admin URLs are accepted as HOST:PORT or full URLs and reduced to their base."""
    assert normalize_admin_url(given) == normal


@pytest.mark.parametrize("bad", ["ftp://h:1", "localhost", "h:99999", "http://", ":8081",
                                 "http://:s3cret@h:1", "u:s3cret@h:1", "http://[::1"])
def test_bad_admin_urls_raise_one_line(bad: str) -> None:
    """A bad admin URL is a ValueError with a one-line message naming it."""
    with pytest.raises(ValueError, match="admin URL") as info:
        normalize_admin_url(bad)
    assert "\n" not in str(info.value)
    assert "s3cret" not in str(info.value)  # credentials are refused without being shown
    if "s3cret" not in bad:
        assert bad.strip() in str(info.value)  # ("Invalid IPv6 URL" alone named none)


def test_protocols_are_runtime_checkable() -> None:
    """AdminSource is a SnapshotSource and not a ReplayControl."""
    src = AdminSource(["127.0.0.1:1"])
    assert isinstance(src, SnapshotSource)
    assert not isinstance(src, ReplayControl)


async def test_fetch_passes_the_window_and_returns_the_snapshot() -> None:
    """fetch(w) asks for ?window=w (all for None) and returns the JSON object."""
    srv = AdminServer("low_load")
    await srv.start()
    src = AdminSource([srv.url])
    try:
        snap = await src.fetch(300)
        assert snap["users"][0]["user"] == "alice"
        await src.fetch(None)
        assert srv.windows == ["300", "all"]
        assert srv.auth == [None, None]  # no token, no header
        rows = await src.active_requests()
        assert [r["id"] for r in rows] == ["r-1071", "r-1072", "r-1073"]
        assert src.describe() == srv.url
    finally:
        await src.close()
        await srv.stop()


async def test_unreachable_proxy_raises_source_unavailable() -> None:
    """Nothing listening: SourceUnavailable naming the URL; describe() says it is down.
    Its active requests are unavailable too, not an empty list ("nothing open"), and
    are not asked for again (a second timeout to wait out)."""
    srv = AdminServer("low_load")
    await srv.start()
    url = srv.url
    await srv.stop()
    src = AdminSource([url])
    with pytest.raises(SourceUnavailable, match="connection refused"):
        await src.fetch(60)
    assert "down: connection refused" in src.describe()
    with pytest.raises(SourceUnavailable, match="connection refused"):
        await src.active_requests()
    assert src.gets == 1
    await src.close()


async def test_an_unknown_host_is_named_not_called_refused() -> None:
    """A mistyped admin host says the name was not found (RFC 6761's ``.invalid`` never
    resolves), not "connection refused", which would send the user looking at the port."""
    src = AdminSource(["http://llmtop-admin.invalid:9001"])
    with pytest.raises(SourceUnavailable, match=r"host not found: llmtop-admin\.invalid"):
        await src.fetch(60)
    assert "connection refused" not in src.describe()
    await src.close()


async def test_refused_on_every_address_of_a_name_reads_as_refused() -> None:
    """``localhost`` may resolve to ::1 and 127.0.0.1; asyncio then joins both failures
    into one OSError without an errno, which still reads as "connection refused"."""
    srv = AdminServer("low_load")
    await srv.start()
    port = srv.url.rsplit(":", 1)[1]
    await srv.stop()
    src = AdminSource([f"http://localhost:{port}"])
    with pytest.raises(SourceUnavailable, match="connection refused"):
        await src.fetch(60)
    await src.close()


async def test_non_json_and_non_object_replies_are_failures() -> None:
    """A reply that is not a JSON object reads as unavailable, not as a crash."""
    srv = AdminServer("low_load")
    srv.raw_reply = '["not", "an", "object"]'
    await srv.start()
    src = AdminSource([srv.url])
    try:
        with pytest.raises(SourceUnavailable, match="not a snapshot"):
            await src.fetch(60)
        srv.raw_reply = "<html>oops"
        with pytest.raises(SourceUnavailable, match="not JSON"):
            await src.fetch(60)
    finally:
        await src.close()
        await srv.stop()


async def test_active_requests_accepts_an_object_with_requests() -> None:
    """/requests may answer {"requests": [...]}; non-dict rows are dropped."""
    srv = AdminServer("low_load")
    srv.requests = {"requests": [{"id": "x"}, 5]}
    await srv.start()
    src = AdminSource([srv.url])
    try:
        assert await src.active_requests() == [{"id": "x"}]
    finally:
        await src.close()
        await srv.stop()


async def test_several_proxies_are_merged_and_a_down_one_is_named() -> None:
    """Two proxies are fetched and merged; when one stops, the other still shows and
    describe() names the one that is down; none up raises."""
    a, b = AdminServer("low_load"), AdminServer("saturated")
    await a.start()
    await b.start()
    src = AdminSource([a.url, b.url], merge=sum_merge)
    try:
        snap = await src.fetch(60)
        assert snap["system"]["rps"] == pytest.approx(1.2 + 6.6)
        assert len(snap["users"]) == 5
        assert src.describe() == "2 proxies"
        rows = await src.active_requests()
        assert len(rows) == 13 and {r["proxy"] for r in rows} == {a.url, b.url}
        await b.stop()
        snap = await src.fetch(60)
        assert snap["system"]["rps"] == pytest.approx(1.2)
        assert src.describe() == f"1/2 proxies up · down: {b.url}"
        await a.stop()
        with pytest.raises(SourceUnavailable, match="none of 2 proxies answers: "
                           f"{a.url}: connection refused; {b.url}: connection refused"):
            await src.fetch(60)
    finally:
        await src.close()
        await a.stop()
        await b.stop()


def test_several_urls_without_a_merge_module_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without llmtop.metrics.merge, several URLs raise MergeUnavailable (a ValueError)."""
    monkeypatch.setitem(sys.modules, "llmtop.metrics.merge", None)
    with pytest.raises(MergeUnavailable, match=r"needs llmtop\.metrics\.merge"):
        load_merge()
    with pytest.raises(ValueError, match="several proxies"):
        AdminSource(["h:1", "h:2"])


async def test_recording_posts_action_and_path_and_reports_refusal() -> None:
    """recording() POSTs {action, path}; a 4xx becomes SourceUnavailable with the reason."""
    srv = AdminServer("low_load")
    await srv.start()
    src = AdminSource([srv.url])
    try:
        reply = await src.recording("start", "recordings/x.jsonl")
        assert reply == {"status": "recording", "path": "recordings/x.jsonl"}
        await src.recording("stop", None)
        assert srv.recording_bodies == [
            {"action": "start", "path": "recordings/x.jsonl"}, {"action": "stop"}]
        with pytest.raises(SourceUnavailable, match="HTTP 400 path must end"):
            await src.recording("start", "x.txt")
    finally:
        await src.close()
        await srv.stop()


async def test_recording_on_several_proxies_uses_one_file_each() -> None:
    """With several proxies each records to its own file: x-1.jsonl, x-2.jsonl."""
    a, b = AdminServer("low_load"), AdminServer("low_load")
    await a.start()
    await b.start()
    src = AdminSource([a.url, b.url], merge=sum_merge)
    try:
        reply = await src.recording("start", "x.jsonl.gz")
        assert [p["path"] for p in reply["proxies"]] == ["x-1.jsonl.gz", "x-2.jsonl.gz"]
        assert per_proxy_path("x", 3) == "x-3"
    finally:
        await src.close()
        await a.stop()
        await b.stop()


async def test_one_proxy_down_does_not_keep_the_others_from_starting_or_stopping() -> None:
    """The proxies were asked one after another and the first refusal ended it: a stop
    refused by the first proxy (down, or not recording) left the others recording, and a
    start refused by the second never reached the third. Each is asked; the error names
    the refusal and the proxies where the action went through."""
    a, down, c = AdminServer("low_load"), AdminServer("low_load"), AdminServer("low_load")
    for s in (a, down, c):
        await s.start()
    await down.stop()  # its port now refuses connections
    src = AdminSource([a.url, down.url, c.url], merge=sum_merge)
    try:
        with pytest.raises(SourceUnavailable) as got:
            await src.recording("start", "x.jsonl")
        assert str(got.value) == (
            f"recording start at {down.url}: connection refused; "
            f"recording started at {a.url}, {c.url}")
        assert a.recording_bodies == [{"action": "start", "path": "x-1.jsonl"}]
        assert c.recording_bodies == [{"action": "start", "path": "x-3.jsonl"}]
        src2 = AdminSource([down.url, a.url, c.url], merge=sum_merge)
        try:
            with pytest.raises(SourceUnavailable, match=(
                    f"^recording stop at {down.url}: .*; recording stopped at "
                    f"{a.url}, {c.url}$")):
                await src2.recording("stop", None)
        finally:
            await src2.close()
        assert a.recording_bodies[-1] == c.recording_bodies[-1] == {"action": "stop"}
        assert a.snapshot["recording"] is None and c.snapshot["recording"] is None
        await down.start()  # all answer: one reply each, as before
        reply = await src.recording("start", "y.jsonl")
        assert [p["path"] for p in reply["proxies"]] == ["y-1.jsonl", "y-2.jsonl", "y-3.jsonl"]
    finally:
        await src.close()
        for s in (a, down, c):
            await s.stop()


async def test_a_target_that_is_not_llmtop_or_cannot_be_merged_leaves_the_others() -> None:
    """QA: `attach GOOD http://server-answering-{json}` blanked the merged view of both
    ("cannot merge … different windows"). A reply without the snapshot's fields is a
    down proxy named "not an llmtop admin API"; one whose snapshot cannot merge with the
    others is left out and named; the rest are shown merged."""
    from llmtop.metrics.merge import merge_snapshots

    a, b, odd = AdminServer("low_load"), AdminServer("saturated"), AdminServer("low_load")
    odd.raw_reply = '{"status": "ok", "window_s": 60}'
    for s in (a, b, odd):
        await s.start()
    src = AdminSource([a.url, b.url, odd.url], merge=sum_merge)
    try:
        snap = await src.fetch(60)
        assert snap["system"]["rps"] == pytest.approx(1.2 + 6.6)
        assert src.describe() == f"2/3 proxies up · down: {odd.url}"
        assert "not an llmtop admin API" in (src.errors[odd.url] or "")
    finally:
        await src.close()
        for s in (a, b, odd):
            await s.stop()

    def fussy_merge(snaps: list[dict[str, Any]]) -> dict[str, Any]:
        if any(s["system"]["rps"] > 5 for s in snaps) and len(snaps) > 1:
            raise ValueError("snapshots cover different windows: ['10', '60']")
        return merge_snapshots(snaps) if len(snaps) > 1 else snaps[0]

    a, b, c = AdminServer("low_load"), AdminServer("saturated"), AdminServer("low_load")
    for s in (a, b, c):
        await s.start()
    src = AdminSource([a.url, b.url, c.url], merge=fussy_merge)
    try:
        snap = await src.fetch(60)  # b cannot merge: a and c are shown
        assert snap["system"]["rps"] == pytest.approx(2 * 1.2)
        assert "cannot be merged with the others (snapshots cover different windows" in (
            src.errors[b.url] or "")
        assert src.describe() == f"2/3 proxies up · down: {b.url}"
    finally:
        await src.close()
        for s in (a, b, c):
            await s.stop()


async def test_each_attached_proxy_gets_its_own_token() -> None:
    """Proxies run by different teams have different admin tokens: one token per URL, in
    order (an empty one for a proxy without); a single token still goes to every URL."""
    a, b, c = (AdminServer("low_load", token="tok-a"), AdminServer("saturated", token="tok-b"),
               AdminServer("low_load"))
    for srv in (a, b, c):
        await srv.start()
    src = AdminSource([a.url, b.url, c.url], token=["tok-a", "tok-b", ""], merge=sum_merge)
    one = AdminSource([a.url, b.url], token="tok-a", merge=sum_merge)
    try:
        snap = await src.fetch(60)
        assert snap["system"]["rps"] == pytest.approx(1.2 + 6.6 + 1.2)
        assert src.describe() == "3 proxies"
        assert a.auth[-1] == "Bearer tok-a" and b.auth[-1] == "Bearer tok-b"
        assert c.auth[-1] is None  # no token is sent where none was given
        await one.fetch(60)  # the one token, to both: b refuses it, a answers
        assert b.auth[-1] == "Bearer tok-a"
        assert one.describe() == f"1/2 proxies up · down: {b.url}"
        assert "admin token was refused" in (one.errors[b.url] or "")
    finally:
        await src.close()
        await one.close()
        for srv in (a, b, c):
            await srv.stop()
    with pytest.raises(ValueError, match="2 admin tokens for 3 admin URLs"):
        AdminSource(["h:1", "h:2", "h:3"], token=["x", "y"], merge=sum_merge)
