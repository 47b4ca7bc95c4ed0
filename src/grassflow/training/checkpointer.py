"""Writing a run's checkpoints: ``last.pt`` (everything needed to resume bit-exactly) and
``best.pt`` (the best validation model), never with non-finite parameters."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from .batches import BatchStream
from .checkpoint import atomic_save
from .config import TrainConfig
from .ema import ParameterEMA
from .state import TrainState, save_last

__all__ = ["Checkpointer"]


class Checkpointer:
    """The checkpoints of one run directory.

    Args:
        run_dir: the run directory.
        config: the run's configuration (saved with every checkpoint).
        model: the model trained.
        optimizer: its optimizer.
        scheduler: its lr schedule, or None.
        stream: the batch stream (its position is saved).
        write: whether this process writes files (rank 0 of a torchrun job).
        gather_rng: with several ranks, every rank's RNG state (a collective call);
            None: one process, whose own state is saved.
        ema: the run's `ParameterEMA` (saved in ``last.pt``), or None.
    """

    def __init__(self, run_dir: Path, config: TrainConfig, model: nn.Module,
                 optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None, stream: BatchStream, *,
                 write: bool = True,
                 gather_rng: Callable[[], list[dict]] | None = None,
                 ema: ParameterEMA | None = None):  # fmt: skip
        self.last_path, self.best_path = run_dir / "last.pt", run_dir / "best.pt"
        self.config, self.model, self.optimizer = config, model, optimizer
        self.scheduler, self.stream = scheduler, stream
        self.write, self.gather_rng, self.ema = write, gather_rng, ema
        self.params = [p for group in optimizer.param_groups for p in group["params"]]

    def finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.params)

    def save_last(self, state: TrainState, rng: dict | None = None) -> bool:
        """Write ``last.pt`` for ``state.iteration`` unless already written; False (and
        nothing written) if a parameter is not finite. ``rng``: the RNG state to save in
        place of the current one (that of the step's start, when a step was cut short)."""
        if state.saved_iteration == state.iteration:
            return True
        if not self.finite():
            return False
        rng_ranks = self.gather_rng() if self.gather_rng is not None else None
        if rng is not None and rng_ranks is None:
            rng_ranks = [rng]
        if self.write:
            save_last(self.last_path, state, self.config, self.model, self.optimizer,
                      self.scheduler, self.stream, rng_ranks, self.ema)  # fmt: skip
        state.saved_iteration = state.iteration
        return True

    def save_best(self, iteration: int, val_nll: float) -> None:
        """Write the model as ``best.pt`` (validation NLL ``val_nll`` at ``iteration``)."""
        if self.write:
            best = {"model": self.model.state_dict(), "iteration": iteration,
                    "val_nll": val_nll, "config": self.config.to_dict()}  # fmt: skip
            atomic_save(best, self.best_path)
