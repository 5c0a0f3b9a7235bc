"""The engine's id of an answer as the client read it (what a record's ``upstream_id`` must
equal when the response named no ``X-Request-Id``)."""

from __future__ import annotations

import json


def seen_id(body: bytes) -> str:
    """The id the client read: a JSON body's ``id``; a stream's first event's ``id``, or
    Anthropic's ``message_start`` ``message.id``."""
    if not body.lstrip().startswith(b"{"):
        for line in body.split(b"\n"):
            if line.startswith(b"data:"):
                obj = json.loads(line[5:])
                rid = obj["message"]["id"] if obj.get("type") == "message_start" else obj["id"]
                assert isinstance(rid, str)
                return rid
        raise AssertionError(f"no event in {body[:200]!r}")
    rid = json.loads(body)["id"]
    assert isinstance(rid, str)
    return rid
