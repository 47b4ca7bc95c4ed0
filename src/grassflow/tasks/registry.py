"""Kinds of run directory, and what ``grassflow eval``, ``sample`` and ``plot`` do with each.

Every run directory's ``experiment.json`` names its kind (`run_dir.KIND_KEY`). A kind
is a module that defines ``RUN_KIND``, a `RunKind`. The library's kinds are below;
other packages add theirs through the entry-point group `ENTRY_POINTS` (name: the
kind, value: the module), so that the library never imports them. The paper's reproduction
package (``grassflow_paper``) adds ``vs-enf``, ``efm`` and ``qm9`` this way.

Runs made before kinds existed have none; `legacy_kind` tells them by their preset's
fields, as the CLI always did.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from .run_dir import KIND_KEY

__all__ = [
    "ENTRY_POINTS",
    "RunKind",
    "evaluate_on_data",
    "get",
    "kind_of",
    "kinds",
    "legacy_kind",
]

ENTRY_POINTS = "grassflow.run_kinds"

_BUILTIN = {
    "textures": "grassflow.tasks.texture_runs",
    "particles": "grassflow.tasks.particle_runs",
    "shapes": "grassflow.tasks.shape_runs",
}


@dataclass(frozen=True)
class RunKind:
    """What the CLI does with runs of one kind.

    Attributes:
        evaluate: ``(run_dir, n_samples, seed) -> line``: evaluates the run (writing its
            ``eval.json``) and returns the one-line summary to print.
        sample: ``(run_dir, n, seed, out) -> line``: draws ``n`` samples to files named by
            ``out`` and says what it wrote; None where the kind has no sampler.
        plot: ``run_dir -> paths`` of the pictures it wrote; None where it has none.
        evaluate_data: ``(run_dir, data, key, n_samples, seed) -> lines``: evaluates the run
            on the clouds of a user's file ``data`` (``key``: its array in an ``.npz``, or
            None) instead of its own test data, writing beside ``eval.json`` rather than over
            it, and returns what to print (`grassflow eval RUN --data FILE`); None where the
            kind's test data are fixed (`evaluate_on_data` then says so).
    """

    evaluate: Callable[[Path, int, int], str]
    sample: Callable[[Path, int, int, Path], str] | None = None
    plot: Callable[[Path], list[Path]] | None = None
    evaluate_data: Callable[[Path, Path, str | None, int, int], str] | None = None


def evaluate_on_data(
    run_dir: str | Path,
    data: str | Path,
    key: str | None = None,
    n_samples: int = 1000,
    seed: int = 0,
) -> str:
    """`RunKind.evaluate_data` of the run in ``run_dir``; a ``ValueError`` for a kind that
    cannot evaluate on a user's file."""
    kind = kind_of(run_dir)
    run_kind = get(kind)
    if run_kind.evaluate_data is None:
        raise ValueError(
            f"{run_dir} is a run of kind {kind!r}, which `grassflow eval --data` cannot "
            "evaluate on another file (its test data are fixed by the run); --data scores "
            "runs of `grassflow train --data` (kind 'shapes'); leave it out for this run's "
            "own test NLL"
        )
    return run_kind.evaluate_data(Path(run_dir), Path(data), key, n_samples, seed)


def kinds() -> dict[str, str]:
    """``{kind: module}``: the library's kinds and those that installed packages add."""
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINTS)}
    return {**found, **_BUILTIN}


def legacy_kind(preset: dict) -> str:
    """The kind of a run made before ``experiment.json`` named it, from its fields."""
    if "system" in preset:
        return "efm" if "coupling" in preset else "vs-enf" if "tol" in preset else "particles"
    if "scale_minutes" in preset:
        return "qm9"
    return "shapes" if "n_points" in preset else "textures"


def kind_of(run_dir: str | Path) -> str:
    """The kind of the run in ``run_dir``."""
    path = Path(run_dir) / "experiment.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a grassflow run directory?")
    preset = json.loads(path.read_text())
    return preset.get(KIND_KEY) or legacy_kind(preset)


def get(kind: str) -> RunKind:
    """The `RunKind` of ``kind``; a ``ValueError`` names the known kinds."""
    known = kinds()
    if kind not in known:
        raise ValueError(
            f"runs of kind {kind!r} belong to a package that is not installed (known kinds: "
            f"{', '.join(sorted(known))}); the paper's runs need `pip install -e .` of the "
            "grassflow repository, which installs grassflow_paper"
        )
    return importlib.import_module(known[kind]).RUN_KIND
