"""Training objectives ``objective(model, batch) -> (loss, stats)`` and the validation NLL.

The model contract: ``model.log_prob(Y: (B, D, k)) -> (B,)``, differentiable, and
optionally ``model.last_stats: dict`` refreshed by each ``log_prob`` call with at least
``{"nfe": int}`` (ODE function evaluations).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .flow_matching import flow_matching_objective

__all__ = ["OBJECTIVES", "Objective", "mean_nll", "model_stats", "nll_objective"]

Objective = Callable[[nn.Module, Tensor], tuple[Tensor, dict[str, Any]]]
"""``objective(model, batch (B, D, k)) -> (scalar loss, stats)``; stats may hold ``"nfe"``."""


def model_stats(model: nn.Module) -> dict[str, Any]:
    """A copy of ``model.last_stats`` (``{}`` if the model keeps none)."""
    stats = getattr(model, "last_stats", None)
    return dict(stats) if isinstance(stats, dict) else {}


def nll_objective(model: nn.Module, batch: Tensor) -> tuple[Tensor, dict[str, Any]]:
    """Maximum likelihood: mean negative log-likelihood ``-log_prob(batch).mean()``.

    Args:
        model: has ``log_prob(Y: (B, D, k)) -> (B,)``.
        batch: ``(B, D, k)`` points.

    Returns:
        ``(loss, stats)``: the scalar NLL and the model's ``last_stats`` (e.g. ``nfe``).
    """
    loss = -model.log_prob(batch).mean()
    return loss, model_stats(model)


def mean_nll(model: nn.Module, Y: Tensor, batch_size: int) -> float:
    """Mean ``-log_prob`` over ``Y: (N, D, k)``, evaluated in chunks of ``batch_size``.

    Runs under ``torch.no_grad()``: models that differentiate internally (a CNF's
    divergence) must re-enable autograd themselves, as `GrCNF` does.
    The model is put in eval mode for the call and restored afterwards.
    """
    was_training = model.training
    model.eval()
    total = 0.0
    try:
        with torch.no_grad():
            for start in range(0, Y.shape[0], batch_size):
                chunk = Y[start : start + batch_size]
                total += -model.log_prob(chunk).detach().sum().item()
    finally:
        model.train(was_training)
    return total / Y.shape[0]


OBJECTIVES: dict[str, Objective] = {
    "mle": nll_objective,
    "fm": flow_matching_objective,
    "fm-ot": functools.partial(flow_matching_objective, coupling="ot"),
}
"""Objectives by name: maximum likelihood, flow matching, and flow matching with OT pairs."""
