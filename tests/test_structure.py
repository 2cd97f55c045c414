"""The floors stay acyclic (issue 34): no import cycle among pleharness's modules, lazy imports
inside functions included (they hid the reproduce <-> stress loop). Reads the source with ast;
imports nothing of the package."""
from __future__ import annotations

import ast
import graphlib
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "pleharness"


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """{module: the pleharness modules it imports, anywhere in its body}. ``from .a import b``
    counts ``pkg.a.b`` when that is a module, else ``pkg.a``."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                         for a in node.names]
            else:
                continue
            graph[mod] |= {n for n in names if n in mods and n != mod}
    return graph


def test_the_import_graph_is_read():
    g = import_graph()
    assert "pleharness.stress" in g["pleharness.cli.stress"]  # a lazy import inside a function
    assert "pleharness.run.judge" in g["pleharness.explain"]


def test_no_import_cycle():
    g = import_graph()
    # a package's __init__ that gathers its own submodules is no floor crossing: leave out the
    # edges from a submodule up to its own package
    for mod in g:
        g[mod] = {n for n in g[mod] if not mod.startswith(n + ".")}
    try:
        list(graphlib.TopologicalSorter(g).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None
