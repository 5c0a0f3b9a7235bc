"""The engine's id of an answer as the client read it (what a record's ``upstream_id`` must
equal when the response named no ``X-Request-Id``)."""

from __future__ import annotations

import json


def seen_id(body: bytes) -> str:
    """The id the client read: a JSON body's ``id``; a stream's first event's ``id``, or
    Anthropic's ``message_start`` ``message.id``; SGLang's ``meta_info.id`` (its
    ``/generate``, a body or the first event)."""
    if not body.lstrip().startswith(b"{"):
        for line in body.split(b"\n"):
            if line.startswith(b"data:"):
                return _id_of(json.loads(line[5:]))
        raise AssertionError(f"no event in {body[:200]!r}")
    return _id_of(json.loads(body))


def _id_of(obj: dict[str, object]) -> str:
    if obj.get("type") == "message_start":
        obj = obj["message"]  # type: ignore[assignment]
    elif "meta_info" in obj:
        obj = obj["meta_info"]  # type: ignore[assignment]
    rid = obj["id"]
    assert isinstance(rid, str)
    return rid
