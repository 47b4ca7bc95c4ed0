"""``TrainConfig``: optimizer, schedule and bookkeeping settings of one training run."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from .clock import CLOCKS

__all__ = ["TRAJECTORY_FIELDS", "TrainConfig", "resolve_device", "resolve_dtype"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}

# Fields that change the sequence of parameters; a resumed run must keep them fixed,
# while the others (length, logging, budget, device) may change between invocations.
TRAJECTORY_FIELDS = (
    "lr",
    "betas",
    "weight_decay",
    "batch_size",
    "lr_step",
    "lr_gamma",
    "grad_clip",
    "seed",
    "dtype",
    "ema_decay",  # not the parameters' path, but that of the validated (best) weights
)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class TrainConfig:
    """Settings of a maximum-likelihood (or other objective) training run.

    Attributes:
        lr: Adam learning rate, > 0.
        betas: Adam ``(beta1, beta2)``, each in [0, 1).
        weight_decay: Adam (L2) weight decay, >= 0.
        batch_size: samples per optimizer step, >= 1.
        iterations: total optimizer steps of the run (across resumes), >= 1; None = as many
            as a budget allows (``budget_minutes`` or ``total_budget_minutes`` must be set).
        lr_step: multiply the lr by ``lr_gamma`` every ``lr_step`` iterations; None = constant.
        lr_gamma: decay factor of the step schedule, in (0, 1]. The paper uses 0.1.
        grad_clip: max global L2 norm of the gradient; None = no clipping.
        seed: seeds the data order/stream, the model's noise (e.g. Hutchinson) and validation.
        log_every: write a metrics line every this many iterations.
        val_every: evaluate the validation NLL every this many iterations; None = only at the end.
        val_doubling_from: also evaluate it at iterations n, 2n, 4n, 8n, ... for this n; catches
            an early optimum (e.g. before a small dataset is overfitted) at little cost. None =
            off.
        val_every_minutes: also evaluate it whenever this many minutes of training (on
            ``clock``) have passed since the last evaluation, or as many as that evaluation
            took if more, so these evaluations never take more than half the time (suits
            budgeted runs whose pace is unknown); None = off. Which iterations get validated
            then depends on the processor's speed (with ``clock="wall"``, on the load too), so
            ``best.pt`` can too.
        checkpoint_every: write ``last.pt`` every this many iterations.
        budget_minutes: training budget of one invocation, in minutes of ``clock``; None =
            unlimited. Each rerun with ``resume=True`` trains for up to this long again (e.g.
            one SLURM allocation). Validation is not charged to it (it is timed apart).
        total_budget_minutes: training budget of the whole run, summed over invocations, in
            minutes of ``clock``; None = unlimited. A run stopped by it records so in
            ``last.pt``, and a rerun with the same or a smaller total trains no further,
            whatever the machine's speed; a larger total continues it. Sweeps use this one.
        charge_validation: validation counts against both budgets, and training stops
            early enough that the final validation fits too (at the cost of the last one),
            so a budget bounds training and validation together; a validation that would
            leave less training time than it takes, or take the run's validation past
            ``val_total_share``, is then skipped (the final one never is).
        reserve_points: with ``charge_validation``, also keep the time of scoring this many
            validation points free for the caller's work after training (a test
            evaluation), >= 0; if that would take more than half the budget, nothing is
            kept (training comes first; the caller then skips or announces that work).
        val_share: with ``charge_validation`` and a budget, one validation takes at most
            this share of the invocation's limit: the first is priced on a few points, and
            if all of ``val_data`` would cost more, the run validates on its first points
            only (as many as fit, at least 8; fixed for the run, kept in ``last.pt``).
        val_total_share: with ``charge_validation`` and a budget, all validations of the
            run (every invocation's, the pricing included) take at most this share of its
            budget (the total one, or the earlier invocations' charged seconds plus this
            one's limit), in (0, 1]: a validation other than the final one is skipped when
            the validation seconds so far, its own estimated cost and the final one's would
            exceed it. The final one is kept to the rest of the budget only, so it may end
            above the share when it alone costs more. 1 leaves validation to the other rules.
        clock: what the budgets count: ``"cpu"``, this process's CPU time (all its threads;
            per rank under torchrun), which other jobs on the machine do not change, or
            ``"wall"``, wall-clock time (see `clock`).
        device: ``"auto"`` (cuda if available), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        dtype: ``"float32"`` or ``"float64"``; model and data are cast to it.
        ema_decay: validate (and save as ``best.pt``) the exponential moving average of the
            parameters with this decay (`grassflow.training.ema.ParameterEMA`), in (0, 1);
            None: the parameters themselves. ``last.pt`` keeps both.
    """

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    batch_size: int = 128
    iterations: int | None = 1000
    lr_step: int | None = None
    lr_gamma: float = 0.1
    grad_clip: float | None = None
    seed: int = 0
    log_every: int = 10
    val_every: int | None = 500
    val_doubling_from: int | None = None
    val_every_minutes: float | None = None
    checkpoint_every: int = 500
    budget_minutes: float | None = None
    total_budget_minutes: float | None = None
    charge_validation: bool = False
    reserve_points: float = 0.0
    val_share: float = 0.1
    val_total_share: float = 0.1
    clock: str = "cpu"
    device: str = "auto"
    dtype: str = "float32"
    ema_decay: float | None = None

    def __post_init__(self):
        betas = self.betas
        if isinstance(betas, list):  # JSON gives lists
            betas = tuple(betas)
            object.__setattr__(self, "betas", betas)
        if not (_is_real(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr!r}")
        if not (
            isinstance(betas, tuple)
            and len(betas) == 2
            and all(_is_real(b) and 0.0 <= b < 1.0 for b in betas)
        ):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        if not (_is_real(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        for name in ("batch_size", "log_every", "checkpoint_every"):
            value = getattr(self, name)
            if not (_is_int(value) and value >= 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("iterations", "lr_step", "val_every", "val_doubling_from"):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and value >= 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if not (_is_real(self.lr_gamma) and 0 < self.lr_gamma <= 1):
            raise ValueError(f"lr_gamma must be in (0, 1], got {self.lr_gamma!r}")
        if self.ema_decay is not None and not (_is_real(self.ema_decay)
                                               and 0 < self.ema_decay < 1):  # fmt: skip
            raise ValueError(f"ema_decay must lie in (0, 1) or be None, got {self.ema_decay!r}")
        if self.grad_clip is not None and not (_is_real(self.grad_clip) and self.grad_clip > 0):
            raise ValueError(f"grad_clip must be a positive number or None, got {self.grad_clip!r}")
        if not (_is_int(self.seed) and self.seed >= 0):
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        for name in ("budget_minutes", "total_budget_minutes", "val_every_minutes"):
            value = getattr(self, name)
            if value is not None and not (_is_real(value) and value > 0):
                raise ValueError(f"{name} must be > 0 or None, got {value!r}")
        if not isinstance(self.charge_validation, bool):
            raise ValueError(f"charge_validation must be a bool, got {self.charge_validation!r}")
        if not (_is_real(self.reserve_points) and self.reserve_points >= 0):
            raise ValueError(f"reserve_points must be >= 0, got {self.reserve_points!r}")
        if not (_is_real(self.val_share) and 0 < self.val_share <= 1):
            raise ValueError(f"val_share must be in (0, 1], got {self.val_share!r}")
        if not (_is_real(self.val_total_share) and 0 < self.val_total_share <= 1):
            raise ValueError(f"val_total_share must be in (0, 1], got {self.val_total_share!r}")
        if self.clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}, got {self.clock!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.device, str):
            raise ValueError(f"device must be a string, got {self.device!r}")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, ValueError) as err:
                raise ValueError(f"device {self.device!r} is not a valid torch device") from err

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (``betas`` becomes a list)."""
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Inverse of ``to_dict``; unknown keys raise ``ValueError`` (they are usually typos)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields: {unknown}")
        return cls(**d)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some fields changed (validated again), e.g. from CLI flags."""
        return dataclasses.replace(self, **changes)

    def trajectory_diff(self, other: TrainConfig) -> dict[str, tuple[Any, Any]]:
        """Fields of ``TRAJECTORY_FIELDS`` that differ: ``{name: (self_value, other_value)}``."""
        return {
            name: (getattr(self, name), getattr(other, name))
            for name in TRAJECTORY_FIELDS
            if getattr(self, name) != getattr(other, name)
        }


def resolve_device(device: str) -> torch.device:
    """``"auto"`` -> cuda if available else cpu; anything else -> ``torch.device(device)``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str) -> torch.dtype:
    """``"float32"`` / ``"float64"`` -> the torch dtype."""
    return _DTYPES[dtype]
