"""The budget clock of one ``train`` call: what the run has spent, what this invocation may
spend, and whether one more step still fits.

The charged seconds are training's on ``config.clock``, plus validation's and the setup's
(what the caller did before training) when ``config.charge_validation`` is set (a command
whose ``--minutes`` bounds all its work). The
limit of an invocation is its own ``budget_minutes`` or what is left of the run's
``total_budget_minutes``, whichever is smaller. The validations of the run, all invocations
together, take at most ``val_total_share`` of its budget (`BudgetClock.affords_validation`).
"""

from __future__ import annotations

from collections.abc import Callable

from .config import TrainConfig
from .state import TrainState

__all__ = ["BudgetClock", "invocation_limit"]


def charged_seconds(config: TrainConfig, state: TrainState) -> float:
    """Seconds of the run (all invocations) charged to its budgets."""
    spent = state.train.seconds(config.clock)
    if config.charge_validation:
        spent += state.val.seconds(config.clock) + state.setup.seconds(config.clock)
    return spent


def invocation_limit(config: TrainConfig, state: TrainState) -> tuple[float | None, bool]:
    """Seconds this invocation may spend (None: unlimited) and whether the run's total
    budget, rather than the per-invocation one, sets that limit."""
    budget_s = None if config.budget_minutes is None else 60.0 * config.budget_minutes
    total = config.total_budget_minutes
    if total is None:
        return budget_s, False
    spent = state.spent_total_budget is not None and total <= state.spent_total_budget
    left_s = 0.0 if spent else 60.0 * total - charged_seconds(config, state)
    if budget_s is not None and budget_s < left_s:
        return budget_s, False
    return left_s, True


class BudgetClock:
    """Training (and charged validation) seconds since this invocation started, against its
    limit.

    Args:
        config: the run's configuration (``clock``, budgets, ``charge_validation``,
            ``reserve_points``, ``val_share``, ``val_total_share``).
        state: the run's counters; its ``train`` stopwatch runs while the loop trains.
        sync: with several ranks, the maximum of a value over them; time-based decisions
            must agree on every rank, or the ranks part ways. None: one process.
    """

    def __init__(self, config: TrainConfig, state: TrainState,
                 sync: Callable[[float], float] | None = None):  # fmt: skip
        self.kind, self.state, self.sync = config.clock, state, sync
        self.charge_validation = config.charge_validation
        self.reserve_points, self.val_share = config.reserve_points, config.val_share
        self.limit_s, self.by_total = invocation_limit(config, state)
        self.start_iteration = state.iteration
        self.start_s = state.train.seconds(self.kind)
        self.validation_s = 0.0  # validation seconds of this invocation (the slowest rank's)
        # earlier invocations' validation, as last.pt has it (the same on every rank)
        self.val_before_s = state.val.seconds(self.kind)
        self.val_cap_s = None  # what the run's validations may take, all invocations
        if self.limit_s is not None:
            # a share of the run's whole budget: on resume, of what is left it would let
            # the earlier validations crowd out all of this invocation's
            run_s = 60.0 * config.total_budget_minutes if self.by_total \
                else self.limit_s + self.start_s + self.val_before_s  # fmt: skip
            self.val_cap_s = config.val_total_share * run_s
        self._synced: float | None = None

    def tick(self) -> None:
        """Agree on the training seconds across ranks (once per step; no-op alone)."""
        if self.sync is not None:
            self._synced = self.sync(self.state.train.seconds(self.kind) - self.start_s)

    def trained(self) -> float:
        """Training seconds of this invocation."""
        if self._synced is not None:
            return self._synced
        return self.state.train.seconds(self.kind) - self.start_s

    def elapsed(self) -> float:
        """Training seconds of the run on the budget clock (what metrics lines record)."""
        return self.start_s + self.trained()

    def spent(self) -> float:
        """Seconds of this invocation charged to its limit."""
        return self.trained() + (self.validation_s if self.charge_validation else 0.0)

    def add_validation(self, seconds: float) -> None:
        self.validation_s += seconds

    def validated(self) -> float:
        """Validation seconds of the run (all invocations, pricing included)."""
        return self.val_before_s + self.validation_s

    def reserve(self, cost: float | None, points: int = 1) -> float:
        """Seconds kept free for the final validation (``cost``, of ``points`` points) and
        the work after training (``reserve_points`` more), when validation is charged. Work
        after training that would take more than half the limit gets nothing: training
        comes first, and the caller skips that work (or announces it)."""
        if not self.charge_validation or cost is None:
            return 0.0
        after = cost * self.reserve_points / points
        return cost + (after if after <= 0.5 * self.limit_s else 0.0)

    def exhausted(self) -> bool:
        """No time left before the first step (a total budget spent by earlier runs)."""
        return self.limit_s is not None and self.limit_s <= 0

    def out_of_budget(self, cost: float | None = None, points: int = 1) -> bool:
        """Whether one more step, at the mean pace so far, would overrun the limit (less
        the `reserve` for a validation of ``cost`` seconds and ``points`` points)."""
        if self.limit_s is None:
            return False
        steps = self.state.iteration - self.start_iteration
        other = self.spent() - self.trained() + self.reserve(cost, points)
        return self.trained() * (1 + 1 / steps) + other > self.limit_s

    def affords_validation(self, cost: float | None, points: int = 1) -> bool:
        """Whether a validation that is not the final one, of ``cost`` seconds, leaves at
        least as much time for training as it takes, and keeps the run's validation within
        ``val_cap_s`` with room for the final one (of the same cost); always, unless
        validation is charged to a limit (or its cost is not known yet)."""
        if cost is None or not self.charge_validation or self.limit_s is None:
            return True
        if self.validated() + 2 * cost > self.val_cap_s:
            return False
        return self.limit_s - self.spent() - self.reserve(cost, points) >= 2 * cost

    def affords_final(self, cost: float | None) -> bool:
        """Whether the final validation fits in what is left (always, unless validation is
        charged); when it does not, the best model of the earlier ones stands."""
        if cost is None or not self.charge_validation or self.limit_s is None:
            return True
        return self.spent() + cost <= self.limit_s

    def prices_validation(self, points: int, probe: int) -> bool:
        """Whether a validation of ``points`` should first be priced on ``probe`` of them:
        only when validation is charged to a limit, and the probe is a small part."""
        return self.charge_validation and self.limit_s is not None and points >= 4 * probe

    def validation_points(self, per_point_s: float, points: int, least: int) -> int:
        """How many validation points one validation may score: all ``points`` if that
        takes at most ``val_share`` of the limit at ``per_point_s`` seconds each, else as
        many as do (at least ``least``)."""
        fit = int(self.val_share * self.limit_s / max(per_point_s, 1e-12))
        return min(points, max(least, fit))

    def share(self) -> float:
        """The share of the limit spent (0 without a limit)."""
        return 0.0 if self.limit_s is None else self.spent() / max(self.limit_s, 1e-9)

    def left(self) -> float | None:
        """Seconds of the limit left (None without a limit)."""
        return None if self.limit_s is None else max(0.0, self.limit_s - self.spent())
