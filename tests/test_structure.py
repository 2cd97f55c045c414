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
    assert "pleharness.stress" in g["pleharness.cli.stress"]
    assert "pleharness.run.judge" in g["pleharness.explain.replay"]


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


# -- private names stay in their module (issue 50): a name with one leading underscore is private
# to the module that defines it; no other module of the package imports it
def private_imports(src: str, name: str) -> list[str]:
    """'name:line: module.name' for each import in ``src`` that takes a private name (one leading
    underscore; dunder names are public) from a pleharness module (a relative import, or one of
    ``pleharness.``); ``from __future__`` and the package's outside imports are left alone."""
    out = []
    for node in ast.walk(ast.parse(src, name)):
        if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
            continue
        mod = node.module or ""
        if not node.level and mod != "pleharness" and not mod.startswith("pleharness."):
            continue
        for a in node.names:
            if a.name.startswith("_") and not a.name.startswith("__"):
                where = "." * node.level + (f"{mod}." if mod else "")
                out.append(f"{name}:{node.lineno}: {where}{a.name}")
    return out


def package_problems(rule) -> list[str]:
    """``rule(source, name)`` over every module of the package, its problems in file order."""
    return [p for path in sorted(PKG.rglob("*.py"))
            for p in rule(path.read_text(), str(path.relative_to(PKG.parent)))]


def test_no_module_imports_a_private_name_of_another():
    problems = package_problems(private_imports)
    assert not problems, "private names imported from another module (make them public):\n" + \
        "\n".join(problems)


def test_the_private_import_rule_names_the_module_and_name():
    src = ("from __future__ import annotations\n"
           "from .x import _y, z, __version__\n"
           "from ..engine.client import EngineClient as _EngineClient\n"
           "from pleharness.run import _judge as judge\n"
           "from os import _exit\n"
           "def f():\n    from . import _inner  # lazy: a test\n")
    assert private_imports(src, "m.py") == [
        "m.py:2: .x._y", "m.py:4: pleharness.run._judge", "m.py:7: ._inner"]


# -- the floors (issue 34): a module imports only its own floor and those below it ------------
# Each entry: a module or package of pleharness (the longest matching prefix decides), its floor.
# docs/extending.md draws the same table. The job floor is special: a job never imports another
# job (each calls the run layer and what lies below it).
FLOORS: dict[str, int] = {
    # 1 foundation: no engine, no scenario
    "errors": 1, "files": 1, "redact": 1, "parity": 1, "twosample": 1, "faults": 1,
    "tomlfile": 1, "manifest": 1, "model": 1, "prompts": 1, "probe": 1, "profile": 1,
    "environment": 1, "summary": 1, "plot": 1, "defaults": 1, "timeline": 1, "jobrecord": 1,
    "option": 1, "option_rules": 1,
    # 2 the engine: launch or attach, the HTTP client, facts, metrics
    "engine": 2,
    # 3 judging one output, with no run around it
    "evidence": 3, "golden": 3, "explain_plan": 3, "checks": 3, "compare_spec": 3,
    "request": 4, "divergence": 4, "intermittent": 4, "engine_probe": 4,
    # 5 the run layer: context, references, judgement, sides
    "run": 5,
    # 6 what a run is made of: scenario kinds, and how a divergence is attributed
    "scenarios": 6, "causes": 6, "attribution": 6, "envelope": 6, "differential": 6,
    # 7 reading and writing runs: comparison, renderers, suites, configuration, confirmation, the
    # second engines and the passes of a stress run, its verdict; the pipeline: the steps of a
    # stress run and the replays that confirm its reproducers, each a stress run of its own
    "compare": 7, "suites": 7, "render": 7, "config": 7, "reproduce": 7, "verdict": 7,
    "second_engine": 7, "passes": 7, "jobrun": 7, "planning": 7, "pipeline": 7,
    # 8 the jobs
    "stress": 8, "fuzzjob": 8, "confirmjob": 8, "explain": 8, "selftest": 8, "factsjob": 8,
    # 9 the command line
    "cli": 9, "__main__": 9, "probe.__main__": 9,  # python -m pleharness.probe: an entry point
}
JOB_FLOOR = 8


def floor_of(mod: str) -> tuple[str, int]:
    """(the FLOORS entry that places ``mod``, its floor); KeyError for a module of no floor."""
    parts = mod.split(".")[1:]
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in FLOORS:
            return key, FLOORS[key]
    raise KeyError(mod)


def floor_problems(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs up a floor, or from one job to another, as 'a -> b (floor x -> y)';
    every module with no floor."""
    out = []
    for mod, deps in graph.items():
        if mod == "pleharness":
            continue
        try:
            key, fl = floor_of(mod)
        except KeyError:
            out.append(f"{mod}: no floor in FLOORS")
            continue
        for dep in sorted(deps):
            if dep == "pleharness":
                continue
            dkey, dfl = floor_of(dep)
            if dfl > fl or (fl == dfl == JOB_FLOOR and dkey != key):
                out.append(f"{mod} -> {dep} (floor {fl} -> {dfl})")
    return sorted(out)


def test_every_import_stays_on_its_floor_or_goes_down():
    problems = floor_problems(import_graph())
    assert not problems, "imports that run up a floor or between jobs:\n" + "\n".join(problems)


def test_the_floor_rule_catches_an_upward_import_and_a_job_calling_a_job():
    g = {"pleharness.engine.client": {"pleharness.run.context"},
         "pleharness.explain": {"pleharness.stress", "pleharness.run.judge"},
         "pleharness.run.judge": {"pleharness.engine.client", "pleharness.checks.usage"}}
    assert floor_problems(g) == [
        "pleharness.engine.client -> pleharness.run.context (floor 2 -> 5)",
        "pleharness.explain -> pleharness.stress (floor 8 -> 8)"]
    assert floor_problems({"pleharness.nowhere": set()}) == ["pleharness.nowhere: no floor in FLOORS"]


def test_the_stress_run_is_imported_where_it_is_needed():
    """Issue 50: the jobs that run a stress run (a reproducer's replay, a selftest pass) import
    it from the pipeline, one floor down, instead of getting it handed down from the command
    line, so that the floors above see the dependency."""
    g = import_graph()
    assert "pleharness.pipeline" in g["pleharness.stress"]
    for job in ("fuzzjob", "confirmjob", "explain.job", "selftest"):
        assert "pleharness.pipeline" in g[f"pleharness.{job}"], job
    assert "pleharness.pipeline" not in g["pleharness.reproduce"]  # the pure parts stay below
    assert "pleharness.pipeline" not in g["pleharness.jobrun"]


def runner_parameters(src: str, name: str) -> list[str]:
    """'name:line: function' for each function, lambda or dataclass-style field of ``src`` that
    takes a parameter named ``runner`` (a run handed in as a callback)."""
    out = []
    for node in ast.walk(ast.parse(src, name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
            if any(p is not None and p.arg == "runner" for p in params):
                out.append((node.lineno, getattr(node, "name", "lambda")))
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:  # a dataclass's field is a parameter of its __init__
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                        and stmt.target.id == "runner":
                    out.append((stmt.lineno, f"{node.name}.runner"))
    return [f"{name}:{line}: {what}" for line, what in sorted(out)]


def test_no_function_takes_a_runner():
    """Issue 50: no run is handed down as a ``runner`` callback (the floors test cannot see
    such a dependency); a job imports the steps it runs from :mod:`pleharness.pipeline`."""
    problems = []
    for path in sorted(PKG.rglob("*.py")):
        problems += runner_parameters(path.read_text(), str(path.relative_to(PKG.parent)))
    assert not problems, "parameters named runner:\n" + "\n".join(problems)


def test_the_runner_rule_names_the_file_and_line():
    src = ("def f(cfg, runner):\n    pass\n"
           "def g(*, runner=None):\n    pass\n"
           "h = lambda runner: 0\n"
           "class T:\n    runner: int\n    config: int\n"
           "def ok(run, scenario_runner):\n    runner = 1\n")
    assert runner_parameters(src, "m.py") == ["m.py:1: f", "m.py:3: g", "m.py:5: lambda",
                                              "m.py:7: T.runner"]


def test_docs_extending_draws_the_same_floors():
    """docs/extending.md's floor table names every FLOORS entry on its floor (and no other)."""
    import re
    doc = (PKG.parent / "docs" / "extending.md").read_text()
    table = {}
    for line in doc.splitlines():
        m = re.match(r"\| *(\d+) *\| *(.*?) *\|", line)
        if m:
            rooms = re.sub(r"\(.*?\)", "", m.group(2))  # a room's parts, in brackets, are no rooms
            for name in re.findall(r"`([\w/]+)`", rooms):
                table[name.rstrip("/").replace("/", ".")] = int(m.group(1))
    assert table == FLOORS


# -- lazy imports (issue 34): an import inside a function (or any indented block) is there only for
# an optional heavy dependency (LAZY_ALLOWED), and says so: `# lazy: <why>` on its line, or on the
# comment line right above a run of such imports. A module of the harness itself is never imported
# lazily: `ple-harness --help` with every job imported takes about 0.1 s (14 %) longer than with
# the command line's lazy imports of a02680a (benchmarks/cli_startup.py), not worth hidden
# dependencies. `if TYPE_CHECKING:` imports are not
# run and need no reason.
LAZY_ALLOWED = frozenset({
    "torch", "transformers", "tokenizers",  # the golden model, the model rebuild, the GPU probe
    "hypothesis",  # fuzz: only when a fuzz run draws
    "jsonschema",  # only for json-constrained requests
    "matplotlib",  # optional: report --plot
    "orjson", "json",  # optional orjson, the standard library's json its fallback
    "pynvml",  # optional: GPU memory through NVML
})


def _imported_roots(imp: ast.stmt) -> set[str]:
    """The top-level names an import statement loads ('.' for a relative import)."""
    if isinstance(imp, ast.ImportFrom):
        return {"." if imp.level else (imp.module or "").split(".")[0]}
    return {a.name.split(".")[0] for a in imp.names}


def unexplained_lazy_imports(src: str, name: str) -> list[str]:
    """'name:line: the import' for each indented import of ``src`` without a ``# lazy:`` reason,
    or of a module outside :data:`LAZY_ALLOWED` (the harness's own modules included)."""
    lines = src.splitlines()
    out = []

    def visit(body: list[ast.stmt], top: bool) -> None:
        run: list[ast.stmt] = []
        for stmt in body + [None]:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                run.append(stmt)
                continue
            if run and not top:
                above = lines[run[0].lineno - 2].strip() if run[0].lineno > 1 else ""
                shared = above.startswith("#") and "# lazy:" in above
                for imp in run:
                    own = "\n".join(lines[imp.lineno - 1:imp.end_lineno])
                    if (not shared and "# lazy:" not in own) or \
                            not _imported_roots(imp) <= LAZY_ALLOWED:
                        out.append(f"{name}:{imp.lineno}: {lines[imp.lineno - 1].strip()}")
            run = []
            if stmt is None:
                break
            if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
                visit(stmt.orelse, False)
                continue
            for field in ("body", "orelse", "finalbody"):
                visit(getattr(stmt, field, None) or [], False)
            for handler in getattr(stmt, "handlers", None) or []:
                visit(handler.body, False)
            for case in getattr(stmt, "cases", None) or []:
                visit(case.body, False)

    visit(ast.parse(src, name).body, True)
    return out


def test_every_lazy_import_says_why():
    problems = package_problems(unexplained_lazy_imports)
    assert not problems, "indented imports without a '# lazy: <why>' comment:\n" + \
        "\n".join(problems)


def test_the_lazy_import_rule_names_the_file_and_line():
    src = ("from typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n    from .a import A\n"
           "def f():\n    from .b import B\n    import torch  # lazy: heavy\n"
           "    from .d import D  # lazy: start-up\n    import numpy  # lazy: not allowed\n"
           "def g():\n    # lazy: heavy, both\n    import torch\n    import transformers\n"
           "    x = 1\n    from .c import C\n"
           "try:\n    import orjson\nexcept ImportError:\n    orjson = None\n")
    assert unexplained_lazy_imports(src, "m.py") == [
        "m.py:5: from .b import B", "m.py:7: from .d import D  # lazy: start-up",
        "m.py:8: import numpy  # lazy: not allowed", "m.py:14: from .c import C",
        "m.py:16: import orjson"]
