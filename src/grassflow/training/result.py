"""What ``train`` returns, and the exception it raises when training diverges."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["TrainResult", "TrainingDiverged", "TrainingInterrupted"]


@dataclass
class TrainResult:
    """What a call to ``train`` achieved.

    Attributes:
        iterations: optimizer steps done so far (across resumes).
        final_loss: loss of the last step, None if no step was ever taken.
        best_val: best validation NLL so far (None without validation data).
        best_iteration: iteration of ``best_val``.
        stopped: ``"done"``, ``"budget"`` (resume later) or ``"diverged"``.
        elapsed: training seconds on the config's budget clock (validation excluded),
            summed over invocations.
        run_dir: the run directory.
        message: one human-readable line.
        cpu_seconds: training CPU seconds, summed over invocations.
        wall_seconds: training wall seconds, summed over invocations.
        val_cpu_seconds: validation CPU seconds, summed over invocations.
        val_wall_seconds: validation wall seconds, summed over invocations.
        threads: torch intra-op threads of this invocation.
        last_val_seconds: what the latest validation of this invocation took on the budget's
            clock (None: none ran), to estimate the cost of scoring more points.
        budget_left_seconds: what this invocation left of its budget on that clock (None:
            no budget), for the caller's work after training.
        val_points: how many validation points each validation scored (None: no validation
            data).
    """

    iterations: int
    final_loss: float | None
    best_val: float | None
    best_iteration: int | None
    stopped: str
    elapsed: float
    run_dir: Path
    message: str
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    val_cpu_seconds: float = 0.0
    val_wall_seconds: float = 0.0
    threads: int = 1
    last_val_seconds: float | None = None
    budget_left_seconds: float | None = None
    val_points: int | None = None


class TrainingDiverged(RuntimeError):
    """Loss, gradient or parameters became non-finite. ``last.pt`` keeps the last good state.

    Attributes:
        result: the ``TrainResult`` with ``stopped == "diverged"``.
    """

    def __init__(self, message: str, result: TrainResult):
        super().__init__(message)
        self.result = result


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped ``train``; ``last.pt`` holds the last finished step when it could be
    saved (not mid-update, nor under torchrun), and resuming goes on from there.

    Attributes:
        last_path: the run's ``last.pt``.
        iteration: the iteration it holds (None: nothing saved yet).
    """

    def __init__(self, message: str, last_path: Path, iteration: int | None):
        super().__init__(message)
        self.last_path, self.iteration = last_path, iteration
