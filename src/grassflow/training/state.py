"""Optimizer construction and the resumable state of a run (``last.pt``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .batches import BatchStream
from .checkpoint import FORMAT_VERSION, CheckpointError, atomic_save, load_checkpoint
from .config import TrainConfig
from .rng import capture_rng_state, restore_rng_state

__all__ = ["TrainState", "load_last", "make_optimizer", "save_last"]

_REQUIRED = ("iteration", "model", "optimizer", "scheduler", "rng", "data", "config")


@dataclass
class TrainState:
    """Counters of a run that survive a resume.

    Attributes:
        iteration: optimizer steps done.
        last_loss: loss of the latest step.
        best_val, best_iteration: best validation NLL and when it was reached.
        elapsed: training seconds of earlier invocations.
        saved_iteration: iteration stored in ``last.pt`` (None if not written yet).
    """

    iteration: int = 0
    last_loss: float | None = None
    best_val: float | None = None
    best_iteration: int | None = None
    elapsed: float = 0.0
    saved_iteration: int | None = None


def make_optimizer(
    model: nn.Module, config: TrainConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.StepLR | None]:
    """Adam (with L2 weight decay, as in the paper) and the optional step-decay schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no trainable parameters")
    optimizer = torch.optim.Adam(
        params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
    )
    scheduler = None
    if config.lr_step is not None:
        scheduler = torch.optim.lr_scheduler.StepLR(
            optimizer, step_size=config.lr_step, gamma=config.lr_gamma
        )
    return optimizer, scheduler


def save_last(
    path: Path,
    state: TrainState,
    elapsed: float,
    config: TrainConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    stream: BatchStream,
) -> None:
    """Write everything needed to resume atomically to ``path`` and note it in ``state``."""
    atomic_save(
        {
            "format": FORMAT_VERSION,
            "iteration": state.iteration,
            "last_loss": state.last_loss,
            "best_val": state.best_val,
            "best_iteration": state.best_iteration,
            "elapsed": elapsed,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": None if scheduler is None else scheduler.state_dict(),
            "rng": capture_rng_state(),
            "data": stream.state_dict(),
            "config": config.to_dict(),
        },
        path,
    )
    state.saved_iteration = state.iteration


def load_last(
    path: Path,
    config: TrainConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    stream: BatchStream,
) -> TrainState:
    """Restore model, optimizer, schedule, data stream and RNGs from ``path``.

    Raises:
        ValueError: ``config`` changes a trajectory field relative to the checkpoint.
        CheckpointError: the file is corrupt or does not fit the model / data.
    """
    ckpt = load_checkpoint(path, required=_REQUIRED)
    try:
        saved = TrainConfig.from_dict(ckpt["config"])
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path} holds an invalid config: {err}") from err
    diff = saved.trajectory_diff(config)
    if diff:
        changes = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
        raise ValueError(
            f"cannot resume {path} with a config that changes the trajectory ({changes}); "
            "start a new run_dir instead"
        )
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if (scheduler is None) != (ckpt["scheduler"] is None):
            raise ValueError("lr schedule present in only one of checkpoint and config")
        if scheduler is not None:
            scheduler.load_state_dict(ckpt["scheduler"])
        stream.load_state_dict(ckpt["data"])
    except (RuntimeError, ValueError, KeyError) as err:
        raise CheckpointError(f"checkpoint {path} does not fit this model/data: {err}") from err
    restore_rng_state(ckpt["rng"])
    return TrainState(
        iteration=int(ckpt["iteration"]),
        last_loss=ckpt.get("last_loss"),
        best_val=ckpt.get("best_val"),
        best_iteration=ckpt.get("best_iteration"),
        elapsed=float(ckpt.get("elapsed", 0.0)),
        saved_iteration=int(ckpt["iteration"]),
    )
