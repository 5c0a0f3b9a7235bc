"""What each benchmark request asks for: prompt length and output length.

Lengths are fixed (``128``), uniform ranges (``64-512``) or drawn from a JSONL file of
``{"prompt_tokens": N, "max_tokens": M}`` or ``{"prompt": "...", "max_tokens": M}`` lines.
Prompts are synthesised from three-letter English words with a leading space (`` the``,
`` and`` …): one token each in the BPE tokenizers of common models, and four characters
each — one token by the simulator's rule — so a target of N prompt tokens gives about N
tokens of user content (the chat template adds a few). All draws come from one seeded RNG:
the same seed gives the same workload.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORDS = (
    " the", " and", " for", " you", " was", " are", " not", " but", " all", " can", " had",
    " her", " one", " our", " out", " day", " get", " has", " him", " his", " how", " man",
    " new", " now", " old", " see", " two", " way", " who", " did", " its", " let", " put",
    " say", " she", " too", " use",
)


MAX_LENGTH = 1_000_000
"""The longest prompt or output a length spec may ask for, in tokens."""


class WorkloadError(ValueError):
    """A bad length spec or workload file (shown as one line, exit 2)."""


@dataclass(frozen=True, slots=True)
class Length:
    lo: int
    hi: int

    def draw(self, rng: random.Random) -> int:
        return self.lo if self.lo == self.hi else rng.randint(self.lo, self.hi)

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}-{self.hi}"


def parse_length(spec: str, what: str) -> Length:
    """``"128"`` or ``"64-512"``."""
    try:
        if "-" in spec:
            a, b = (int(x) for x in spec.split("-", 1))
        else:
            a = b = int(spec)
    except ValueError:
        raise WorkloadError(f"{what} '{spec}' must be N or LO-HI, e.g. 128 or 64-512") from None
    if a < 1 or b < a:
        raise WorkloadError(f"{what} '{spec}': need 1 <= LO <= HI")
    if b > MAX_LENGTH:
        raise WorkloadError(f"{what} '{spec}': at most {MAX_LENGTH:,} tokens")
    return Length(a, b)


@dataclass(frozen=True, slots=True)
class BenchRequest:
    prompt: str
    prompt_tokens_target: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class FileEntry:
    prompt: str | None
    prompt_tokens: int | None
    max_tokens: int


def synth_prompt(rng: random.Random, tokens: int) -> str:
    return "".join(rng.choice(WORDS) for _ in range(max(1, tokens))).lstrip()


def _whole(value: Any, key: str) -> int:
    """A token count from a workload line: a whole number (``4``, ``4.0``, ``"4"``); a
    fraction was cut (5.7 → 5) and ``true`` read as 1, so neither is one."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"{key} must be a whole number, got {json.dumps(value)}")
    return int(value)  # (a string or a list: ValueError or TypeError, as before)


def load_entries(path: str | Path) -> list[FileEntry]:
    if not str(path).strip():  # (Path("") is the current directory)
        raise WorkloadError("workload file path is empty")
    p = Path(path)
    if p.is_dir():
        raise WorkloadError(f"workload file {p} is a directory")
    if not p.exists():
        raise WorkloadError(f"workload file {p} not found")
    if not p.is_file():  # /dev/null, a FIFO, a device: it exists, so not "not found"
        raise WorkloadError(f"workload file {p} is not a regular file")
    try:
        # (utf-8-sig: a byte order mark, as Windows editors write, is not the first line's)
        lines = p.read_text(encoding="utf-8-sig").split("\n")
    except UnicodeDecodeError:
        raise WorkloadError(f"workload file {p} is not UTF-8 text (JSON Lines)") from None
    except OSError as exc:
        raise WorkloadError(f"workload file {p}: cannot read: {exc.strerror}") from None
    out: list[FileEntry] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError(f"a JSON object, {{...}}, not {type(obj).__name__}")
            max_tokens = _whole(obj["max_tokens"], "max_tokens")
            prompt = obj.get("prompt")
            pt = obj.get("prompt_tokens")
            if prompt is None and pt is None:
                raise KeyError("prompt or prompt_tokens")
            if prompt is not None and not isinstance(prompt, str):
                raise ValueError(f"prompt must be text, not {type(prompt).__name__}")
            if pt is not None:
                pt = _whole(pt, "prompt_tokens")
            for n_tokens in (max_tokens, pt):
                if n_tokens is not None and not 1 <= n_tokens <= MAX_LENGTH:
                    raise ValueError(f"token counts must be 1 to {MAX_LENGTH:,}")
            out.append(FileEntry(prompt=prompt, prompt_tokens=pt, max_tokens=max_tokens))
        except KeyError as exc:
            raise WorkloadError(f"{p}:{n}: not a workload line (missing {exc.args[0]})"
                                ) from None
        except (ValueError, TypeError, OverflowError) as exc:
            raise WorkloadError(f"{p}:{n}: not a workload line ({exc})") from None
    if not out:
        raise WorkloadError(f"workload file {p} has no entries")
    return out


@dataclass
class Workload:
    prompt_tokens: Length = Length(128, 128)
    max_tokens: Length = Length(128, 128)
    entries: list[FileEntry] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def next(self) -> BenchRequest:
        rng = self._rng
        if self.entries:
            e = self.entries[rng.randrange(len(self.entries))]
            if e.prompt is not None:
                return BenchRequest(e.prompt, e.prompt_tokens or 0, e.max_tokens)
            n = e.prompt_tokens or 1
            return BenchRequest(synth_prompt(rng, n), n, e.max_tokens)
        n = self.prompt_tokens.draw(rng)
        return BenchRequest(synth_prompt(rng, n), n, self.max_tokens.draw(rng))

    def describe(self) -> dict[str, object]:
        if self.entries:
            return {"source": "file", "entries": len(self.entries), "seed": self.seed}
        return {"prompt_tokens": str(self.prompt_tokens), "max_tokens": str(self.max_tokens),
                "seed": self.seed}
