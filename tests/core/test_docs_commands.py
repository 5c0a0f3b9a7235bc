"""The commands the documentation shows are ones the real command line takes.

Every ``llmtop <command> …`` line in a code block of README.md or docs/fleet.md, and every
example in a command's ``--help``, must parse with llmtop's own argparse parser; every
``--flag`` named next to ``llmtop <command>`` in an inline code span (the README's table of
commands, the prose) must be one of that command's options.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmtop.cli import _command_modules, build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", ROOT / "docs" / "fleet.md")
PUBLIC = tuple(m.NAME for m in _command_modules() if m.HELP)
COMMAND = re.compile(rf"\bllmtop ({'|'.join(PUBLIC)})(?= |$)")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _argv(line: str) -> list[str]:
    """The words of one shell command line from ``llmtop`` on: leading ``VAR=value``
    assignments dropped, cut at the first ``|``, ``&``, ``;`` or ``#`` comment."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    words: list[str] = []
    for word in lex:
        if word and set(word) <= set("|&;<>()"):
            break
        words.append(word)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words.pop(0)
    return words


def fenced_commands(text: str) -> Iterator[str]:
    """Each ``llmtop <command> …`` line of the fenced code blocks (``\\`` continuations
    joined)."""
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            m = COMMAND.search(line)
            if m and _argv(line)[:1] == ["llmtop"]:
                yield line.strip()


def help_examples() -> Iterator[tuple[str, str]]:
    """(command, line) for each ``llmtop <command> …`` line in a command's ``--help``."""
    for name, sub in _subparsers().items():
        for line in (sub.description or "").splitlines():
            if COMMAND.search(line) and _argv(line)[:1] == ["llmtop"]:
                yield name, line.strip()


def parse_problem(line: str) -> str | None:
    """Why ``line`` does not parse with llmtop's parser, or None when it does."""
    argv = _argv(line)
    assert argv[:1] == ["llmtop"], line
    try:
        _, unknown = build_parser().parse_known_args(argv[1:])
    except SystemExit:
        return f"{line!r}: argparse refused it (see stderr)"
    if unknown:
        return f"{line!r}: unrecognized arguments {unknown}"
    return None


def flag_problems(text: str) -> list[str]:
    """``--flags`` named after ``llmtop <command>`` in inline code spans and code blocks
    that the command does not have."""
    subs = _subparsers()
    options = {n: {s for a in p._actions for s in a.option_strings} for n, p in subs.items()}
    spans = re.findall(r"`([^`]+)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
    spans += list(fenced_commands(text))
    out = []
    for span in spans:
        for m in COMMAND.finditer(span):
            rest = span[m.end():]
            if (nxt := COMMAND.search(rest)) is not None:
                rest = rest[:nxt.start()]
            for flag in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", rest):
                if flag not in options[m.group(1)]:
                    out.append(f"llmtop {m.group(1)} has no {flag} (in `{span.strip()}`)")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_line_in_the_docs_parses(doc: Path) -> None:
    lines = list(fenced_commands(doc.read_text(encoding="utf-8")))
    assert lines, f"no llmtop command found in {doc.name}'s code blocks"
    problems = [p for line in lines if (p := parse_problem(line))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_flag_the_docs_name_exists(doc: Path) -> None:
    problems = flag_problems(doc.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


def test_every_example_in_help_parses() -> None:
    examples = list(help_examples())
    assert {name for name, _ in examples} >= {"run", "attach", "replay", "report", "export",
                                              "bench"}
    problems = [p for _, line in examples if (p := parse_problem(line))]
    assert not problems, "\n".join(problems)


def test_a_made_up_flag_or_argument_is_reported() -> None:
    """The checks above can fail: a flag no command has, an extra argument, a bad value."""
    doc = ("`llmtop run --upstream URL [--bogus N]` and `llmtop sim --firehose`\n"
           "```sh\nLLMTOP_X=1 llmtop report a.jsonl b.jsonl c.jsonl  # three files\n"
           "llmtop export today.jsonl.gz --hlog - | sort\n"
           "llmtop report a.jsonl --format xml\n```\n")
    assert flag_problems(doc) == ["llmtop run has no --bogus (in `llmtop run --upstream URL "
                                  "[--bogus N]`)"]
    lines = list(fenced_commands(doc))
    assert len(lines) == 3
    assert "unrecognized arguments ['c.jsonl']" in (parse_problem(lines[0]) or "")
    assert parse_problem(lines[1]) is None
    assert "argparse refused it" in (parse_problem(lines[2]) or "")


def _admin_routes() -> set[tuple[str, str]]:
    from llmtop.admin.routes import AdminContext, make_admin_app
    from llmtop.config import Config
    from llmtop.metrics.aggregator import Aggregator

    app = make_admin_app(AdminContext(aggregator=Aggregator(Config(), {}), active={}))
    return {(r.method, r.resource.canonical) for r in app.router.routes()
            if r.method != "HEAD" and r.resource is not None}


def test_the_readme_names_every_admin_route() -> None:
    """Each route the admin API serves appears in the README's Admin API section as
    ``METHOD /path`` (GET /recording and /health were served and not named)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Admin API"):]
    section = section[:section.index("\n## ", 1)]
    routes = _admin_routes()
    assert ("GET", "/llmtop/v1/health") in routes and len(routes) >= 6  # the lookup works
    missing = sorted(f"{m} {p}" for m, p in routes if f"`{m} {p}" not in section)
    assert not missing, f"served but not in the README's Admin API section: {missing}"
