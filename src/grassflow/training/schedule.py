"""When ``train`` validates: every ``val_every`` iterations, at ``val_doubling_from * 2^j``,
after ``val_every_minutes`` of training, and always at the final iteration."""

from __future__ import annotations

from .config import TrainConfig

__all__ = ["ValidationSchedule", "is_doubling"]


def is_doubling(iteration: int, start: int | None) -> bool:
    """Whether ``iteration`` is ``start * 2^j`` for some j >= 0."""
    if start is None or iteration % start:
        return False
    q = iteration // start
    return q & (q - 1) == 0


class ValidationSchedule:
    """The validation times of a run, and what the last validation cost.

    Time-based validation waits ``val_every_minutes`` of training after the last one, or as
    long as that one took if longer, so it never takes more than half the time.

    Args:
        config: ``val_every``, ``val_doubling_from`` and ``val_every_minutes``.
        elapsed: training seconds of the run when this invocation starts.
    """

    def __init__(self, config: TrainConfig, elapsed: float):
        self.every, self.doubling_from = config.val_every, config.val_doubling_from
        self.period_s = None if config.val_every_minutes is None \
            else 60.0 * config.val_every_minutes  # fmt: skip
        self.last_s, self.wait_s = elapsed, self.period_s
        self.last_cost: float | None = None  # seconds of the latest validation

    def due(self, iteration: int, final: bool, elapsed: float) -> bool:
        """Whether to validate after ``iteration`` (``elapsed`` training seconds of the run)."""
        return (
            final
            or (self.every is not None and iteration % self.every == 0)
            or (self.wait_s is not None and elapsed - self.last_s >= self.wait_s)
            or is_doubling(iteration, self.doubling_from)
        )

    def done(self, cost: float, elapsed: float) -> None:
        """Note a validation of ``cost`` seconds, finished at ``elapsed`` training seconds."""
        self.last_s, self.last_cost = elapsed, cost
        if self.period_s is not None:
            self.wait_s = max(self.period_s, cost)
