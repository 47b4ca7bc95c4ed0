"""Layers of the GrCNF potential network (paper §4.4)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from . import jet

__all__ = ["ConcatSquash", "HorP", "check_representative", "fc_trunk", "scale_init_"]


class HorP(nn.Module):
    """Horizontal-projection input layer ``HorP(Y) = W - Y Y^T W``.

    Depends on Y only through the projector ``Y Y^T``, so it is invariant under ``Y -> Y Q``
    for every Q in O(k) (paper eq. 12).

    Args:
        D: ambient dimension.
        width: number of columns of W (the paper uses k).
    """

    def __init__(self, D: int, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D, width))

    def forward(self, Y: Tensor) -> Tensor:
        """``Y: (..., D, k)`` (a tensor or a `Jet`) ->
        ``(..., D, width)``."""
        W = self.weight
        return W - Y @ (Y.mT @ W)


class ConcatSquash(nn.Module):
    """FFJORD's ConcatSquash layer ``Linear(x) * sigmoid(gate(t)) + bias(t)``.

    References:
        Grathwohl et al. FFJORD: Free-form Continuous Dynamics for Scalable Reversible
        Generative Models (ICLR 2019), arXiv:1810.01367.
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.gate = nn.Linear(1, out_features)
        self.bias = nn.Linear(1, out_features, bias=False)

    def forward(self, t: Tensor, x: Tensor) -> Tensor:
        """``t``: scalar or per-sample ``(...)`` times; ``x: (..., in)`` (a tensor or a
        `Jet`) -> ``(..., out)``."""
        tt = t.to(dtype=x.dtype, device=x.device).unsqueeze(-1)
        x = jet.linear(x, self.linear.weight, self.linear.bias)  # x may be a Jet
        return x * torch.sigmoid(self.gate(tt)) + self.bias(tt)


def scale_init_(module: nn.Module, gain: float) -> nn.Module:
    """Multiply all weights by ``gain`` (used in tests to make an untrained flow move mass)."""
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(gain)
    return module




def fc_trunk(width: int, hidden: tuple[int, ...], norm: str | None) -> nn.Sequential:
    """[Linear -> norm -> SiLU] per hidden width (the paper's QM9 scale-estimator trunk).

    ``norm``: ``"batch"`` (BatchNorm1d, the paper's), ``"layer"`` (LayerNorm) or ``None``.
    """
    if norm not in ("batch", "layer", None):
        raise ValueError(f"norm must be 'batch', 'layer' or None, got {norm!r}")
    if any(not isinstance(h, int) or h < 1 for h in hidden):
        raise ValueError(f"hidden must be positive integers, got {hidden}")
    layers: list[nn.Module] = []
    for h in hidden:
        layers.append(nn.Linear(width, h))
        if norm == "batch":
            layers.append(nn.BatchNorm1d(h))
        elif norm == "layer":
            layers.append(nn.LayerNorm(h))
        layers.append(nn.SiLU())
        width = h
    return nn.Sequential(*layers)


def check_representative(Y: Tensor, n: int, k: int) -> None:
    """Raise ``ValueError`` unless ``Y`` is a finite floating-point ``(..., n, k)`` tensor."""
    if not isinstance(Y, Tensor) or not Y.is_floating_point():
        raise ValueError("Y must be a floating-point torch.Tensor")
    if Y.dim() < 2 or Y.shape[-2:] != (n, k):
        raise ValueError(f"Y must have shape (..., {n}, {k}), got {tuple(Y.shape)}")
    if not torch.isfinite(Y).all():
        raise ValueError("Y contains NaN or inf")
