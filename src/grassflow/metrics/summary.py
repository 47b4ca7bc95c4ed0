"""Summaries of per-example values: the mean and its standard error."""

from __future__ import annotations

from torch import Tensor

__all__ = ["mean_sem"]


def mean_sem(name: str, x: Tensor) -> dict[str, float | None]:
    """``{name: mean of x, name_sem: its standard error}`` for ``x: (N,)``; the mean is None
    for N = 0 and the standard error for N < 2."""
    n = len(x)
    return {name: x.mean().item() if n else None,
            f"{name}_sem": (x.std() / n**0.5).item() if n > 1 else None}  # fmt: skip
