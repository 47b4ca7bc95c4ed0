"""Optimizer construction and the resumable state of a run (``last.pt``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .batches import BatchStream
from .checkpoint import FORMAT_VERSION, CheckpointError, atomic_save, load_checkpoint
from .clock import Stopwatch
from .config import TrainConfig
from .ema import ParameterEMA
from .rng import capture_rng_state, derive_seed, restore_rng_state, seed_all

__all__ = ["TrainState", "load_last", "make_optimizer", "save_last"]

logger = logging.getLogger(__name__)

_REQUIRED = ("iteration", "model", "optimizer", "scheduler", "rng", "data", "config")


@dataclass
class TrainState:
    """Counters of a run that survive a resume.

    Attributes:
        iteration: optimizer steps done.
        last_loss: loss of the latest step.
        best_val: best validation NLL.
        best_iteration: iteration at which ``best_val`` was reached.
        train: CPU and wall seconds of training (validation excluded), summed over
            invocations; it runs while the loop trains.
        val: CPU and wall seconds of validation, summed over invocations.
        setup: CPU and wall seconds the callers spent before training (loading the data,
            building the model), summed over invocations; charged with validation.
        saved_iteration: iteration stored in ``last.pt`` (None if not written yet).
        spent_total_budget: the ``total_budget_minutes`` that stopped the run, if it did; a
            rerun with a total no larger than this trains no further.
        val_points: validation scores the first this many points (None: all of them), when
            a budget could not afford all (``TrainConfig.val_share``); fixed for the run,
            so its validation NLLs stay comparable.
        stopped: how the invocation that wrote ``last.pt`` ended: ``"done"``, ``"budget"``,
            ``"interrupted"`` (Ctrl-C), or None while it ran (or when it crashed).
    """

    iteration: int = 0
    last_loss: float | None = None
    best_val: float | None = None
    best_iteration: int | None = None
    train: Stopwatch = field(default_factory=Stopwatch)
    val: Stopwatch = field(default_factory=Stopwatch)
    setup: Stopwatch = field(default_factory=Stopwatch)
    saved_iteration: int | None = None
    spent_total_budget: float | None = None
    val_points: int | None = None
    stopped: str | None = None


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
    config: TrainConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    stream: BatchStream,
    rng_ranks: list[dict] | None = None,
    ema: ParameterEMA | None = None,
) -> None:
    """Write everything needed to resume atomically to ``path`` and note it in ``state``.

    ``rng_ranks``: every rank's ``capture_rng_state()`` in a multi-process run; ``ema``: the
    run's `ParameterEMA`, if any.
    """
    extra = {} if rng_ranks is None else {"rng_ranks": rng_ranks}
    if ema is not None:
        extra["ema"] = ema.state_dict()
    atomic_save(
        {
            "format": FORMAT_VERSION,
            "iteration": state.iteration,
            "last_loss": state.last_loss,
            "best_val": state.best_val,
            "best_iteration": state.best_iteration,
            # training seconds on the budget clock, then both clocks and validation's
            "elapsed": state.train.seconds(config.clock),
            "clock": config.clock,
            **_times(state),
            "threads": torch.get_num_threads(),
            "spent_total_budget": state.spent_total_budget,
            "val_points": state.val_points,
            "stopped": state.stopped,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": None if scheduler is None else scheduler.state_dict(),
            "rng": capture_rng_state(),
            "data": stream.state_dict(),
            "config": config.to_dict(),
            **extra,
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
    rank: int = 0,
    world: int = 1,
    ema: ParameterEMA | None = None,
) -> TrainState:
    """Restore model, optimizer, schedule, data stream, RNGs and ``ema`` (the run's
    `ParameterEMA`, if any) from ``path``.

    In a run of ``world`` processes, rank ``rank`` restores its own RNG state; if the
    checkpoint was written by a different number of processes, ranks above 0 start fresh
    streams seeded by ``(seed, rank, iteration)``.

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
        if ema is not None:
            ema.load_state_dict(ckpt["ema"])
    except (RuntimeError, ValueError, KeyError) as err:
        raise CheckpointError(f"checkpoint {path} does not fit this model/data: {err}") from err
    ranks = ckpt.get("rng_ranks") or [ckpt["rng"]]
    if len(ranks) == world:
        restore_rng_state(ranks[rank])
    else:
        restore_rng_state(ckpt["rng"])  # rank 0's
        if rank == 0:
            logger.warning(
                "%s was written by %d process(es), resumed by %d: the noise streams of "
                "ranks > 0 start afresh",
                path,
                len(ranks),
                world,
            )
        if rank > 0:
            seed_all(derive_seed(config.seed, "global", rank, int(ckpt["iteration"])))
    return TrainState(
        iteration=int(ckpt["iteration"]),
        last_loss=ckpt.get("last_loss"),
        best_val=ckpt.get("best_val"),
        best_iteration=ckpt.get("best_iteration"),
        # checkpoints before CPU budgets hold wall seconds, validation included, as elapsed
        train=Stopwatch(float(ckpt.get("cpu_s", ckpt.get("elapsed", 0.0))),
                        float(ckpt.get("wall_s", ckpt.get("elapsed", 0.0)))),  # fmt: skip
        val=Stopwatch(float(ckpt.get("val_cpu_s", 0.0)), float(ckpt.get("val_wall_s", 0.0))),
        setup=Stopwatch(float(ckpt.get("setup_cpu_s", 0.0)),
                        float(ckpt.get("setup_wall_s", 0.0))),  # fmt: skip
        saved_iteration=int(ckpt["iteration"]),
        spent_total_budget=ckpt.get("spent_total_budget"),
        val_points=ckpt.get("val_points"),
        stopped=ckpt.get("stopped", "unknown"),  # checkpoints from before it: unknown
    )


def _times(state: TrainState) -> dict[str, float]:
    return {"cpu_s": state.train.seconds("cpu"), "wall_s": state.train.seconds("wall"),
            "val_cpu_s": state.val.seconds("cpu"), "val_wall_s": state.val.seconds("wall"),
            "setup_cpu_s": state.setup.seconds("cpu"),
            "setup_wall_s": state.setup.seconds("wall")}  # fmt: skip
