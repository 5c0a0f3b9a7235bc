"""The one-way street of shared/docs/architecture.md, checked on the source itself.

proxy → events → metrics → snapshots → TUI / recording / Prometheus; nothing points back.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "llmtop"

# package → module prefixes it must never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "events": ("llmtop.",),
    "bus": ("llmtop.proxy", "llmtop.metrics", "llmtop.tui", "llmtop.recording"),
    "config": ("llmtop.proxy", "llmtop.metrics", "llmtop.tui", "llmtop.recording"),
    "proxy": ("llmtop.tui", "llmtop.metrics", "llmtop.recording", "llmtop.admin", "pynvml",
              "hdrh", "textual"),
    "metrics": ("llmtop.proxy", "llmtop.tui", "textual"),
    "admin": ("llmtop.tui", "llmtop.proxy", "textual"),
    "gpu": ("llmtop.proxy", "llmtop.tui", "llmtop.metrics", "textual"),
    "engines": ("llmtop.proxy", "llmtop.tui", "llmtop.metrics", "textual", "pynvml"),
    "recording": ("llmtop.proxy", "llmtop.tui", "textual"),
    "tui": ("llmtop.proxy", "llmtop.gpu.nvml", "llmtop.metrics.hdr", "pynvml", "hdrh"),
    "bench": ("llmtop.tui", "textual"),
    "sim": ("llmtop.proxy", "llmtop.metrics", "llmtop.tui", "llmtop.recording", "llmtop.gpu",
            "llmtop.engines", "llmtop.admin", "llmtop.bench", "pynvml", "hdrh", "textual"),
}
# only these modules may import these libraries
ONLY_IMPORTER = {"pynvml": "gpu/nvml.py", "hdrh": "metrics/hdr.py"}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def area(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0].removesuffix(".py")


def test_packages_import_only_downstream() -> None:
    bad: list[str] = []
    for path in PKG.rglob("*.py"):
        banned = FORBIDDEN.get(area(path), ())
        for mod in imports_of(path):
            for prefix in banned:
                if mod == prefix.rstrip(".") or mod.startswith(prefix if prefix.endswith(".")
                                                               else prefix + ".") or mod == prefix:
                    bad.append(f"{path.relative_to(PKG)} imports {mod}")
    assert not bad, "layering violations:\n" + "\n".join(sorted(set(bad)))


def test_single_importers_of_pynvml_and_hdrh() -> None:
    bad: list[str] = []
    for path in PKG.rglob("*.py"):
        rel = str(path.relative_to(PKG))
        for mod in imports_of(path):
            top = mod.split(".")[0]
            if top in ONLY_IMPORTER and rel != ONLY_IMPORTER[top]:
                bad.append(f"{rel} imports {top}")
    assert not bad, "\n".join(sorted(set(bad)))


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    """The checker itself can fail: a TUI module importing the proxy is caught."""
    p = tmp_path / "x.py"
    p.write_text("from llmtop.proxy.relay import relay\nimport hdrh\n")
    mods = imports_of(p)
    assert "llmtop.proxy.relay" in mods and "hdrh" in mods
    assert any(m.startswith("llmtop.proxy") for m in mods)
