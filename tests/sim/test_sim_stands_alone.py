"""``llmtop.sim`` stands alone (its package docstring): of the rest of llmtop it imports
only two helpers, which import nothing of llmtop's themselves. Its docstring said it
imported nothing of llmtop's at all, while it imported those two."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "llmtop"
HELPERS = {"llmtop.listen", "llmtop.stop_signals"}


def _llmtop_imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                 and node.level == 0 else [])
        out.update(n for n in names if n == "llmtop" or n.startswith("llmtop."))
    return out


def test_sim_imports_only_itself_and_two_leaf_helpers() -> None:
    outside = {f"{p.name}: {m}" for p in (PKG / "sim").rglob("*.py")
               for m in _llmtop_imports(p)
               if not (m.startswith("llmtop.sim") or m in HELPERS)}
    assert outside == set()
    for helper in HELPERS:
        path = PKG / (helper.removeprefix("llmtop.").replace(".", "/") + ".py")
        assert _llmtop_imports(path) == set(), helper
    doc = (PKG / "sim" / "__init__.py").read_text()
    assert all(f":mod:`{h}`" in doc for h in HELPERS)
