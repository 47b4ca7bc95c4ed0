"""Run directories: identity, the saved preset and its kind, progress.

A run directory is one training run. `claim_run_dir` makes sure it stays one: it keeps
the resolved preset with the run's kind (``experiment.json``, see `registry`) and the
identity of the data it trained on
(``data.json``: a content hash), and a later invocation may reuse or continue the run only
if both match. The run's length (total budget, iterations) may differ only upwards, which
continues the run; the per-invocation budget and the device may change freely.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..training import distributed as dd
from ..training import load_checkpoint
from ..training.checkpoint import checkpoint_path, write_json

__all__ = [
    "KIND_KEY",
    "RunMismatch",
    "claim_run_dir",
    "data_identity",
    "unfinished_warning",
    "load_trained",
    "read_preset",
    "test_subset",
    "training_status",
    "TIMING_KEYS",
]

logger = logging.getLogger(__name__)

# Preset fields that change neither what a run is nor its trajectory: how long one
# invocation may train, where, and where the data lie (data.json hashes their content).
# per-invocation settings: the budget, the device, and what a budget covers
_FREE = tuple(f"{part}.{key}" for part in ("train", "flow", "gram") for key in
              ("budget_minutes", "device", "charge_validation", "reserve_points", "val_share",
               "val_total_share")) \
    + ("data_dir", "cache_dir", "data")  # fmt: skip
KIND_KEY = "kind"
"""The key of ``experiment.json`` that names the run's kind (absent in runs made before it)."""


class RunMismatch(ValueError):
    """A run directory holds a different run than the one asked for."""


def data_identity(**arrays: Any) -> dict[str, str]:
    """``{name: "sha256:<hex>"}`` of each array's shape, dtype and bytes (tensor or ndarray)."""
    out = {}
    for name, x in arrays.items():
        a = np.ascontiguousarray(x.detach().cpu().numpy() if torch.is_tensor(x) else x)
        h = hashlib.sha256(f"{a.shape}|{a.dtype}|".encode())
        h.update(a.tobytes())
        out[name] = f"sha256:{h.hexdigest()[:24]}"
    return out


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in d.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return flat


def claim_run_dir(
    run_dir: str | Path,
    preset: dict,
    data: dict[str, Any],
    *,
    kind: str,
    added: dict[str, Any] | None = None,
    removed: tuple[str, ...] = (),
    budget_keys: tuple[str, ...] = ("train.total_budget_minutes", "train.iterations"),
    force: bool = False,
    resume: bool = True,
) -> None:
    """Make ``run_dir`` the directory of this run, or check that it already is.

    A new directory gets ``experiment.json`` (``preset`` with ``kind``) and ``data.json``
    (``data``). An existing one must hold the same kind, preset and data. The
    ``budget_keys`` (dotted paths into ``preset``) may grow, which continues the run; the
    per-invocation budget, the device and the data's location (``data_dir``, ``cache_dir``,
    ``data.*path``) may change freely, as the content hashes identify the data wherever they
    lie. A directory written before run
    identities existed (no ``data.json``, preset fields missing whose new value is None) is
    adopted with a warning.

    Under torchrun, rank 0 decides and the other ranks follow its decision.

    Args:
        run_dir: the run directory.
        preset: the resolved preset, JSON-able (e.g. ``exp.to_dict()``).
        data: the data's identity: source, path and `data_identity` hashes.
        kind: the run's kind (`registry`); a directory from before kinds takes it.
        added: preset fields added after runs were made, with the value those runs had
            without saying so (a saved preset that lacks them matches that value).
        removed: preset fields removed since runs were made (of a model that is gone): a saved
            preset's values of them, and of their sub-fields, are ignored.
        budget_keys: fields that may only grow (None, unlimited, is the largest).
        force: start the run afresh (deleting ``run_dir``) instead of raising on a mismatch.
        resume: False refuses a directory that already holds ``last.pt`` (``FileExistsError``)
            before anything is written.

    Raises:
        RunMismatch: the directory holds another run (the message names every differing
            field), a smaller budget than it has trained for, or trainer files without a
            preset.
    """
    run_dir = Path(run_dir)
    if not resume and (run_dir / "last.pt").exists():
        raise FileExistsError(f"{run_dir / 'last.pt'} exists: resume it or use a new run_dir")
    dd.init()
    preset = {KIND_KEY: kind, **preset}
    added = {KIND_KEY: kind, **(added or {})}
    problem = _mismatch(run_dir, preset, data, added, removed, budget_keys) \
        if dd.is_main() else None  # fmt: skip
    problem = dd.all_gather_objects(problem)[0]  # rank 0's verdict, for every rank
    if problem is not None:
        if not force:
            raise RunMismatch(
                f"{problem}. Use another run directory, or retrain it: --force for "
                "`grassflow reproduce`, force=True in Python."
            )
        logger.warning("%s; --force: deleting it and starting afresh", problem)
        if dd.is_main():
            shutil.rmtree(run_dir)
        dd.barrier()
    if dd.is_main():
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(preset, run_dir / "experiment.json")
        write_json(data, run_dir / "data.json")
    dd.barrier()


def _mismatch(
    run_dir: Path, preset: dict, data: dict, added: dict, removed: tuple[str, ...],
    budget_keys: tuple[str, ...],
) -> str | None:  # fmt: skip
    """Why ``run_dir`` is not this run, or None if it is (or is new)."""
    exp_path, data_path = run_dir / "experiment.json", run_dir / "data.json"
    if not exp_path.exists():
        if (run_dir / "last.pt").exists():
            return f"{run_dir} holds a training checkpoint but no experiment.json"
        return None
    old = _flatten(json.loads(exp_path.read_text()))
    new = _flatten(json.loads(json.dumps(preset)))  # as saved: nested tuples become lists
    if data_path.exists():
        old.update(_flatten({"data": json.loads(data_path.read_text())}))
        new.update(_flatten({"data": json.loads(json.dumps(data))}))
    else:
        logger.warning("%s predates data.json: adopting it for the data given now", run_dir)
    diffs = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "<missing>"), new.get(key, "<missing>")
        if a == "<missing>" and key in added:
            a = added[key]
        if b == "<missing>" and key.split(".")[0] in removed:
            continue
        if a == b or key in _FREE or key.endswith("path") or (a == "<missing>" and b is None):
            continue
        if key in budget_keys and _number(a) and (b is None or _number(b) and b >= a):
            continue
        diffs.append(f"{key}: {a!r} -> {b!r}")
    return f"{run_dir} holds a different run ({'; '.join(diffs)})" if diffs else None


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def read_preset(run_dir: str | Path, from_dict: Callable[[dict], Any], what: str) -> Any:
    """The preset saved in ``run_dir/experiment.json`` (without its kind); ``what`` names the
    run in errors."""
    path = Path(run_dir) / "experiment.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a {what} run directory?")
    preset = json.loads(path.read_text())
    preset.pop(KIND_KEY, None)
    return from_dict(preset)


def load_trained(
    run_dir: str | Path, from_dict: Callable[[dict], Any], build_model: Callable[[Any], nn.Module],
    what: str, which: str = "best",
) -> tuple[Any, nn.Module]:  # fmt: skip
    """The preset and its model with the ``which`` checkpoint, in the run's dtype, eval mode."""
    exp = read_preset(run_dir, from_dict, what)
    model = build_model(exp).to(getattr(torch, exp.train.dtype))
    ckpt = load_checkpoint(checkpoint_path(run_dir, which), required=("model",))
    model.load_state_dict(ckpt["model"])
    return exp, model.eval()


TIMING_KEYS = ("cpu_minutes", "wall_minutes", "val_cpu_minutes", "val_wall_minutes", "clock",
               "threads")  # fmt: skip
"""The keys of `training_status` that results rows copy: how long, on what."""


def training_status(run_dir: str | Path) -> dict[str, Any]:
    """What the run has trained, summed over invocations: ``iterations``,
    ``trained_minutes`` (training on the budget's clock), ``cpu_minutes`` and ``wall_minutes``
    (training), ``val_cpu_minutes`` and ``val_wall_minutes`` (validation), ``clock``,
    ``threads`` (of the last invocation) and ``spent_total_budget`` (see
    ``TrainConfig.total_budget_minutes``); zeros and None for a run without ``last.pt`` yet.
    Checkpoints from before CPU budgets give their wall minutes (validation included) as
    every training figure, and None for the rest."""
    path = Path(run_dir) / "last.pt"
    if not path.exists():
        return {"iterations": 0, "trained_minutes": 0.0, "cpu_minutes": 0.0,
                "wall_minutes": 0.0, "val_cpu_minutes": 0.0, "val_wall_minutes": 0.0,
                "clock": None, "threads": None, "spent_total_budget": None}  # fmt: skip
    ckpt = load_checkpoint(path, required=("iteration",))
    elapsed = float(ckpt.get("elapsed", 0.0))
    minutes = lambda key, old: None if ckpt.get(key, old) is None else ckpt.get(key, old) / 60
    return {
        "iterations": int(ckpt["iteration"]),
        "trained_minutes": elapsed / 60,
        "cpu_minutes": minutes("cpu_s", elapsed),
        "wall_minutes": minutes("wall_s", elapsed),
        "val_cpu_minutes": minutes("val_cpu_s", None),
        "val_wall_minutes": minutes("val_wall_s", None),
        "clock": ckpt.get("clock", "wall"),
        "threads": ckpt.get("threads"),
        "spent_total_budget": ckpt.get("spent_total_budget"),
    }


def test_subset(test: torch.Tensor, n: int | None, seed: int = 0) -> torch.Tensor:
    """``n`` rows of ``test`` drawn without replacement by a seeded permutation, in file
    order (all of them if ``n`` is None or too large). QM9's split is ordered by molecule
    index, hence by composition, so a prefix would be a biased sample."""
    if n is None or n >= len(test):
        return test
    keep = torch.randperm(len(test), generator=torch.Generator().manual_seed(seed))[:n]
    return test[keep.sort().values]


def unfinished_warning(run_dir: str | Path) -> str | None:
    """A line that warns that the training in ``run_dir`` (or its parts ``flow/`` and
    ``gram/``) stopped before its budget or iterations (Ctrl-C, a crash), or None."""
    run_dir = Path(run_dir)
    for part in (run_dir, run_dir / "flow", run_dir / "gram"):
        if (part / "last.pt").exists():
            # checkpoints from before `TrainState.stopped` say nothing: no warning
            ckpt = load_checkpoint(part / "last.pt", required=("iteration",))
            stopped = ckpt.get("stopped", "unknown")
            if stopped in (None, "interrupted"):
                how = "was interrupted" if stopped else "did not finish (a crash?)"
                return (f"warning: the training in {part} {how} at iteration "
                        f"{ckpt['iteration']}, before its budget or iterations; these "
                        "results are of an unfinished run (`grassflow train ... --resume` "
                        "continues it)")  # fmt: skip
    return None
