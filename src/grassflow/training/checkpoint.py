"""Atomic checkpoint files and their loading.

A checkpoint is written to a temporary file in the same directory, flushed to disk and
then renamed over the old one, so a crash mid-write never leaves a truncated ``last.pt``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from ..io import atomic_write, atomic_write_bytes, write_json  # the last two re-exported

__all__ = [
    "CheckpointError", "atomic_save", "atomic_write_bytes", "checkpoint_path", "load_checkpoint",
    "write_json",
]  # fmt: skip

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint file is missing keys, corrupt or unreadable. The message names the file."""


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj)`` to ``path`` atomically (temp file, fsync, ``os.replace``)."""
    atomic_write(path, lambda f: torch.save(obj, f))


def load_checkpoint(path: str | os.PathLike, required: tuple[str, ...] = ()) -> dict:
    """Load a checkpoint written by ``atomic_save`` onto the CPU.

    Loads with ``weights_only=True``: checkpoints hold only tensors and plain Python data.

    Args:
        path: the ``.pt`` file.
        required: keys that must be present.

    Raises:
        CheckpointError: the file is unreadable, corrupt, or lacks a required key.
    """
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a corrupt file
        raise CheckpointError(
            f"could not load checkpoint {path}: {type(err).__name__}: {err}. The file is "
            "corrupt or not a grassflow checkpoint; delete it to start over or restore a copy."
        ) from err
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, not a dict")
    missing = [key for key in required if key not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks keys {missing}")
    if state.get("format", FORMAT_VERSION) != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format {state['format']}, this code reads {FORMAT_VERSION}"
        )
    return state


def checkpoint_path(run_dir: str | Path, which: str = "best") -> Path:
    """``run_dir/<which>.pt``. ``"best"`` falls back to ``last.pt`` when the run has no
    validation checkpoint yet, and says so."""
    path = Path(run_dir) / f"{which}.pt"
    if not path.exists() and which == "best":
        path = Path(run_dir) / "last.pt"
        logger.warning("%s has no best.pt (no validation yet): using last.pt", run_dir)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: has {run_dir} been trained?")
    return path
