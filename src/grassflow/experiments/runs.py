"""Run directories shared by the experiments: the saved preset, checkpoints, time trained."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..training import load_checkpoint, read_metrics

__all__ = ["checkpoint_path", "load_trained", "read_preset", "trained_minutes"]


def read_preset(run_dir: str | Path, from_dict: Callable[[dict], Any], kind: str) -> Any:
    """The preset saved in ``run_dir/experiment.json``; ``kind`` names the run in errors."""
    path = Path(run_dir) / "experiment.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a {kind} run directory?")
    return from_dict(json.loads(path.read_text()))


def checkpoint_path(run_dir: str | Path, which: str = "best") -> Path:
    """``run_dir/<which>.pt``; ``"best"`` falls back to ``last.pt`` before any validation."""
    path = Path(run_dir) / f"{which}.pt"
    if not path.exists() and which == "best":
        path = Path(run_dir) / "last.pt"
    return path


def load_trained(
    run_dir: str | Path, from_dict: Callable[[dict], Any], build_model: Callable[[Any], nn.Module],
    kind: str, which: str = "best",
) -> tuple[Any, nn.Module]:  # fmt: skip
    """The preset and its model with the ``which`` checkpoint, in the run's dtype, eval mode."""
    exp = read_preset(run_dir, from_dict, kind)
    model = build_model(exp).to(getattr(torch, exp.train.dtype))
    ckpt = load_checkpoint(checkpoint_path(run_dir, which), required=("model",))
    model.load_state_dict(ckpt["model"])
    return exp, model.eval()


def trained_minutes(run_dir: str | Path) -> float:
    """Wall-clock training time so far, summed over invocations (0 for a new run)."""
    path = Path(run_dir) / "metrics.jsonl"
    records = read_metrics(path) if path.exists() else []
    return records[-1]["elapsed"] / 60 if records else 0.0
