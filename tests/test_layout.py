"""The package's layout rules: the library never imports the paper's reproduction, no module
imports another's private names, no two modules share a name, no two modules import each other
(directly or round a longer circle), and every run kind resolves."""

import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules(package: str) -> list[Path]:
    return sorted((SRC / package).rglob("*.py"))


def _imports(path: Path):
    """``(module, names)`` of each import in ``path``, relative imports resolved."""
    package = path.relative_to(SRC).with_suffix("").parts[:-1]
    if path.name == "__init__.py":
        package = path.relative_to(SRC).parts[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            yield module, [alias.name for alias in node.names]


def test_the_library_never_imports_the_reproduction_package():
    """Catches a `from grassflow_paper ...` (or an import of a module that does one) creeping
    into the library: both by the source text and by importing every library module."""
    offenders = [
        f"{path.relative_to(SRC)}: {module}"
        for path in _modules("grassflow")
        for module, names in _imports(path)
        if module.split(".")[0] == "grassflow_paper"
    ]
    assert offenders == []
    code = (
        "import importlib, pkgutil, sys, grassflow\n"
        "for m in pkgutil.walk_packages(grassflow.__path__, 'grassflow.'):\n"
        "    if not m.name.endswith('__main__'):  # runs the CLI\n"
        "        importlib.import_module(m.name)\n"
        "import grassflow.cli\n"
        "grassflow.cli.build_parser.__module__\n"
        "print(sorted(m for m in sys.modules if m.startswith('grassflow_paper')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_no_module_imports_another_modules_private_names():
    """Catches `from .rkmk import _A`-style coupling to another module's internals."""
    offenders = [
        f"{path.relative_to(SRC)}: {module}.{name}"
        for package in ("grassflow", "grassflow_paper")
        for path in _modules(package)
        for module, names in _imports(path)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert offenders == []


def test_no_two_modules_share_a_name():
    """Catches a second `shapes.py` or `qm9.py` in another package, which makes tracebacks,
    docs and imports ambiguous."""
    names: dict[str, list[str]] = {}
    for package in ("grassflow", "grassflow_paper"):
        for path in _modules(package):
            if path.name != "__init__.py":
                names.setdefault(path.stem, []).append(str(path.relative_to(SRC)))
    assert {n: p for n, p in names.items() if len(p) > 1} == {}


def _import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Each module's imports of modules under ``root`` (``"grassflow.data.point_clouds"``;
    a package is its ``__init__``): every ``import`` and ``from ... import`` in the file,
    those inside functions included (a lazy import closes a circle as surely as a top-level
    one, only later), except those under ``if TYPE_CHECKING:``, which never run (they are
    how an annotation names a class without importing its module). ``from p import m`` is an
    import of the submodule ``p.m`` when there is one, else of ``p``. The parent packages
    that importing ``p.m`` runs first are not counted: every module would close a circle
    with its own package's ``__init__``."""
    files = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                for stmt in node.body for n in ast.walk(stmt)}  # fmt: skip
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name in files}
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    found |= {sub} if sub in files else {module} & files.keys()
        graph[name] = found - {name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: one list of modules per strongly connected component
    of more than one module (Tarjan's algorithm), each a path ``a -> b -> ... -> a``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while not component or w != v:
                w = stack.pop()
                component.add(w)
            if len(component) > 1:
                circles.append(_path_round(graph, min(component), component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def _path_round(graph: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    """A shortest import path from ``start`` back to itself through ``within``."""
    paths, seen = [[start]], set()
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & within):
            if w == start:
                return [*path, start]
            if w not in seen:
                seen.add(w)
                paths.append([*path, w])
    raise AssertionError(f"{start} is on no circle")


def test_data_modules_import_each_other_one_way_only():
    """Catches issue 42's import circle coming back: `grassflow.data.molecule_files` imported
    `PointClouds` from `grassflow.data.point_clouds`, which imported `read_sdf` and
    `npz_chemistry` from it inside functions. Now `cloud_chemistry` defines the data and
    imports no other data module, and the file readers import it, never the other way."""
    graph = _import_graph(SRC, ("grassflow",))
    data = {m: {w for w in ws if w.startswith("grassflow.data")} for m, ws in graph.items()
            if m.startswith("grassflow.data")}  # fmt: skip
    assert _circles(data) == []
    assert data["grassflow.data.cloud_chemistry"] == set()
    assert "grassflow.data.point_clouds" not in data["grassflow.data.molecule_files"]


def test_no_import_circles_in_the_library():
    """Catches any two modules of `grassflow` or `grassflow_paper` that import each other,
    directly or round a longer circle, lazily inside a function or not (`if TYPE_CHECKING:`
    imports excepted, see `_import_graph`): which module is half-initialised when the other
    asks it for a name then depends on which one was imported first."""
    assert _circles(_import_graph(SRC, ("grassflow", "grassflow_paper"))) == []


def test_the_circle_finder_sees_lazy_imports_and_skips_type_checking(tmp_path):
    """Catches a circle finder that would pass any package: one that misses imports inside
    functions, relative or submodule imports, or counts `if TYPE_CHECKING:` ones."""
    files = {
        "__init__.py": "from .a import A\n",
        "a.py": "from . import b\nA = 1\n",
        "b.py": "def f():\n    from .c import g\n    return g\n",
        "c.py": "import pkg.a\ndef g():\n    pass\n",
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .e import E\n",
        "e.py": "from pkg.d import TYPE_CHECKING\nE = 1\n",
    }
    (tmp_path / "pkg").mkdir()
    for name, text in files.items():
        (tmp_path / "pkg" / name).write_text(text)
    graph = _import_graph(tmp_path, ("pkg",))
    assert graph["pkg.d"] == set() and graph["pkg.e"] == {"pkg.d"}
    assert _circles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_every_run_kind_resolves_and_the_cli_finds_reproduce():
    """Catches an entry point naming a moved module, or a kind module without RUN_KIND."""
    from grassflow.cli import build_parser
    from grassflow.tasks import registry

    kinds = registry.kinds()
    assert {"textures", "particles", "shapes", "vs-enf", "efm", "qm9"} <= set(kinds)
    for kind in kinds:
        assert callable(registry.get(kind).evaluate)
    with pytest.raises(ValueError, match="not installed"):
        registry.get("no-such-kind")
    assert build_parser().parse_args(["reproduce", "table1"]).experiment == "table1"


def test_runs_made_before_kinds_are_told_apart_by_their_presets(tmp_path):
    """Each experiment's own preset, saved without a kind, as every run before this version
    was: a wrong rule would send `grassflow eval` of such a run to another experiment's code."""
    from grassflow.tasks import registry
    from grassflow.tasks.particle_runs import ParticleExperiment
    from grassflow.tasks.shape_runs import ShapeExperiment
    from grassflow.tasks.texture_runs import TexturesExperiment
    from grassflow_paper.efm import EFMExperiment
    from grassflow_paper.qm9_runs import QM9Experiment
    from grassflow_paper.vs_enf import ENFExperiment

    presets = {
        "textures": TexturesExperiment().to_dict(),
        "particles": ParticleExperiment(system="dw4").to_dict(),
        "shapes": ShapeExperiment(data="clouds.npy", n_points=4, dim=2).to_dict(),
        "vs-enf": ENFExperiment(system="dw4").to_dict(),
        "efm": EFMExperiment(system="dw4").to_dict(),
        "qm9": dataclasses.asdict(QM9Experiment()),
    }
    for kind, preset in presets.items():
        preset = json.loads(json.dumps(preset, default=list))
        assert registry.legacy_kind(preset) == kind
        run_dir = tmp_path / kind
        run_dir.mkdir()
        (run_dir / "experiment.json").write_text(json.dumps(preset))
        assert registry.kind_of(run_dir) == kind
        (run_dir / "experiment.json").write_text(json.dumps({"kind": "efm", **preset}))
        assert registry.kind_of(run_dir) == "efm"  # a saved kind wins over the fields


def test_docstrings_are_markdown():
    """Catches a Sphinx role (:class:`X`) or `.. math::` block in a docstring, which the docs
    site (mkdocstrings) would show as raw text: the converter must find nothing to change."""
    tool = SRC.parent / "tools" / "md_docstrings.py"
    out = subprocess.run([sys.executable, str(tool), "--check", str(SRC)], capture_output=True,
                         text=True)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
