"""The package's layout rules: the library never imports the paper's reproduction, no module
imports another's private names, no two modules share a name, and every run kind resolves."""

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
