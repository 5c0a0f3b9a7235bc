"""A recording path's name as the recorder splits it: the base and the recording suffix
(``prod.jsonl.gz`` → ``prod`` + ``.jsonl.gz``), the parts of a rotating recording being
``<base>.<UTC start>[-N]<suffix>``. A leaf (the standard library only), outside the
recording package: the config's checks use it, and the config imports nothing of the
recording (tests/core/test_layering.py)."""

from __future__ import annotations

import os
from pathlib import PurePath
from typing import Final

RECORDING_SUFFIXES: Final = (".jsonl.gz", ".jsonl")


def split_stem(name: str) -> tuple[str, str]:
    """A stem's file name as (base, extension): ``prod.jsonl.gz`` → (``prod``,
    ``.jsonl.gz``); the parts are ``<base>.<UTC start>[-N]<extension>``."""
    ext = next((s for s in RECORDING_SUFFIXES if name.endswith(s)), PurePath(name).suffix)
    return (name[:-len(ext)] if ext else name), ext


def nameless(path: str) -> str | None:
    """Why ``path`` is no recording's name, when its file name is only a recording suffix
    (``DIR/.jsonl``, ``DIR/.jsonl.gz``; dots before it count for nothing): the recording
    would be a hidden file, and with rotation its parts hidden files
    (``DIR/.20261206T140000Z.jsonl``) that ``ls`` does not show — the likely cause is a
    name left empty in a script (``--record "$DIR/$NAME.jsonl"``). None for a name."""
    folder, name = os.path.split(path)
    base, ext = split_stem(name)
    if not ext or ext not in RECORDING_SUFFIXES or base.strip("."):
        return None
    where = os.path.join(folder, "NAME" + ext)
    return (f"{path}: a file name that is only the suffix {ext} makes hidden files; write "
            f"{where} (NAME: the host's or the service's, say)")
