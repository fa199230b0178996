"""The module map's rules (docs/ARCHITECTURE.md), checked on the source: no import circle, no
import that runs up a layer, no function longer than a reader can hold (80 lines, in src and
benchmarks).

Read with ``ast`` rather than by importing, so the check sees imports inside functions too
(a lazy import is still a dependency) and costs nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
BENCHMARKS = SRC.parent / "benchmarks"
MAX_FUNCTION_LINES = 80

# Lowest layer first; a module takes the first layer one of whose prefixes it matches. A module
# may import from its own layer and the layers below it only. A package's ``__init__`` is the
# package's own name, so a package sits in one layer as a whole.
LAYERS: list[tuple[str, ...]] = [
    ("rapt.config", "rapt.guarantee", "rapt.noise", "rapt.stats", "rapt.data", "rapt.models",
     "rapt.model_packages", "rapt.dp", "rapt.padding", "rapt.http", "rapt.predictions",
     "rapt.progress", "rapt.precision", "rapt.numfmt"),
    ("rapt.privacy", "rapt.artifacts", "rapt.pate", "rapt.training", "rapt.local"),
    ("rapt.tuning",),
    ("rapt.channel", "rapt.attacks", "rapt.split"),
    ("rapt.pipeline", "rapt.demo", "rapt.demo_choice", "rapt.client"),
    ("rapt.service",),
    ("rapt.cli",),
]


def _modules(package: Path = SRC / "rapt") -> dict[str, Path]:
    """Dotted name -> file of every module under ``package`` (a folder of the import path)."""
    out = {}
    for p in package.rglob("*.py"):
        parts = p.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """rapt modules that ``path`` imports anywhere in its body (absolute imports only), with the
    packages around them: importing ``rapt.a.b`` runs ``rapt/a/__init__.py`` first, and with it
    whatever that ``__init__`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in modules:
                    found.add(sub)
                elif node.module in modules:
                    found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
    return found | {p for m in found for p in _packages(m) if p in modules}


def _packages(module: str) -> list[str]:
    """The packages around ``module``, outermost first: rapt.a.b.c -> [rapt, rapt.a, rapt.a.b]."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _layer(module: str) -> int | None:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def _graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the modules (of ``modules``, rapt's by default) it imports. A module's own
    packages are left out: they are loaded before it anyway, and their ``__init__`` importing it
    is no circle."""
    modules = _modules() if modules is None else modules
    return {m: _imports(p, modules) - {m} - set(_packages(m)) for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer():
    missing = [m for m in _modules() if m != "rapt" and _layer(m) is None]
    assert not missing, f"add these modules to LAYERS (and docs/ARCHITECTURE.md): {missing}"


def test_no_import_circle():
    assert _cycles(_graph()) == []


def test_no_import_circle_among_the_benchmarks():
    """Benchmarks import one another's helpers; a circle there (a report module importing the
    runner that imports it back) makes either one unreadable alone."""
    assert _cycles(_graph({**_modules(), **_modules(BENCHMARKS)})) == []


def test_no_test_module_imports_another():
    """Shared rows and fixtures live in ``tests/_*.py`` helpers: a test module imported by
    another runs its module-level code twice and ties the two files' names together."""
    tests = Path(__file__).resolve().parent
    wrong = []
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            wrong += [f"{path.name} imports {n}" for n in names if n.split(".")[0]
                      .startswith("test_")]
    assert wrong == []


def test_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_package_init_counts_as_imported(tmp_path: Path):
    """``from rapt.privacy.inversion import x`` also runs ``rapt/privacy/__init__.py``; an upward
    import through a package's ``__init__`` is an upward import."""
    src = tmp_path / "m.py"
    src.write_text("from rapt.privacy.inversion import invert_ids\n"
                   "def f():\n    import rapt.split.wire\n")
    assert _imports(src, _modules()) >= {"rapt.privacy", "rapt.privacy.inversion",
                                         "rapt.split", "rapt.split.wire"}
    assert "rapt" not in _graph()["rapt.privacy.inversion"]


def test_no_upward_import():
    upward = sorted(
        f"{m} -> {t}" for m, targets in _graph().items() for t in targets
        if _layer(m) is not None and _layer(t) is not None and _layer(t) > _layer(m))
    assert upward == []


def test_attacks_do_not_depend_on_the_split_package():
    """An attack takes the model it attacks through a small protocol (``WhiteBoxBottom``), so a
    method's package can change without its attack, and the attack can be aimed elsewhere."""
    wrong = sorted(f"{m} -> {t}" for m, targets in _graph().items() if m.startswith("rapt.attacks")
                   for t in targets if t.startswith(("rapt.split", "rapt.service", "rapt.client")))
    assert wrong == []


@pytest.mark.parametrize("path", sorted((SRC / "rapt").rglob("*.py"))
                         + sorted(BENCHMARKS.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(SRC.parent)))
def test_no_function_over_80_lines(path: Path):
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_the_drawn_map_matches_the_layers():
    """docs/ARCHITECTURE.md draws the layers by hand; this keeps the picture honest: every
    entry of LAYERS is named in its own layer's band of the drawing."""
    text = (SRC.parent / "docs" / "ARCHITECTURE.md").read_text()
    block = text.split("## The map", 1)[1].split("```", 2)[1]
    bands = {int(m.group(1)): m.start() for m in re.finditer(r"layer (\d)", block)}
    ends = sorted(bands.values()) + [len(block)]
    wrong = []
    for i, prefixes in enumerate(LAYERS):
        start = bands[i]
        band = block[start:min(e for e in ends if e > start)]
        for p in prefixes:
            name = p.removeprefix("rapt.").replace(".", "/")
            if f"{name}.py" not in band and f"{name}/" not in band:
                wrong.append(f"{p} not drawn in layer {i}")
    assert wrong == []
