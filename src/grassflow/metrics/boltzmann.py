"""Boltzmann-generator metrics: energy W1, importance weights and the effective sample size.

A model ``q`` that samples configurations ``x_1..x_N`` with exact ``log q(x_n)`` is judged
against the unnormalized target ``exp(-beta U(x))`` by

- the Wasserstein-1 distance between the energies of its samples and of reference data
  (`energy_w1`), and
- the self-normalized importance weights ``w_n ~ exp(-beta U(x_n)) / q(x_n)``
  (`log_importance_weights`) and their Kish effective sample size
  (`effective_sample_size`); `boltzmann_weights` makes them from energies ``E`` and ``kT``
  (a failed energy, ``+inf`` or NaN, gets weight 0) and `ess_fraction` reads the ESS off
  normalized weights.

Energies may be ``+inf`` (overlapping particles); `finite_energies` drops those and
says how many it dropped, since the W1 of two sets with infinite values is undefined.

References:
    Noé, Olsson, Köhler, Wu. Boltzmann generators (Science 2019).
    Kish. Survey Sampling (1965), the effective sample size.
    Klein, Krämer, Noé. Equivariant Flow Matching (NeurIPS 2023), energy W1 and ESS.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "boltzmann_weights",
    "effective_sample_size",
    "energy_w1",
    "ess_fraction",
    "finite_energies",
    "log_importance_weights",
]


def _as_numpy(values, name: str) -> np.ndarray:
    if isinstance(values, Tensor):
        values = values.detach().cpu().double().numpy()
    a = np.asarray(values, dtype=np.float64).ravel()
    if a.size == 0:
        raise ValueError(f"{name} is empty")
    if np.isnan(a).any():
        raise ValueError(f"{name} contains {int(np.isnan(a).sum())} NaN value(s)")
    return a


def finite_energies(u) -> tuple[np.ndarray, int]:
    """Drop the ``+inf`` energies of ``u`` (e.g. overlapping particles).

    Args:
        u (ArrayLike): ``(N,)`` (or any shape, flattened) energies, numpy array or tensor.

    Returns:
        ``(M,)`` float64 finite energies and the number ``N - M`` of ``+inf`` values dropped.

    Raises:
        ValueError: for empty input, NaN or ``-inf`` (no energy is ``-inf``: a sign of a bug).
    """
    a = _as_numpy(u, "u")
    if (a == -np.inf).any():
        raise ValueError(f"u contains {int((a == -np.inf).sum())} -inf value(s)")
    keep = np.isfinite(a)
    return a[keep], int(a.size - keep.sum())


def energy_w1(u, v) -> float:
    """Exact Wasserstein-1 distance between the empirical distributions of ``u`` and ``v``.

    In 1-D, ``W1 = int |F_u(t) - F_v(t)| dt`` with ``F`` the empirical CDFs (equivalently the
    integral of the difference of the quantile functions). Both CDFs are step functions that
    only change at the pooled sorted values, so the integral is an exact finite sum; the
    sizes may differ.

    Args:
        u (ArrayLike): ``(N,)`` values (any shape is flattened), numpy array or tensor.
        v (ArrayLike): ``(M,)`` values (as u).

    Returns:
        ``W1 >= 0`` in the units of the values.

    Raises:
        ValueError: for empty input, NaN or infinite values (filter ``+inf`` energies with
            `finite_energies` first).
    """
    a, b = _as_numpy(u, "u"), _as_numpy(v, "v")
    for name, x in (("u", a), ("v", b)):
        if not np.isfinite(x).all():
            raise ValueError(
                f"{name} contains {int((~np.isfinite(x)).sum())} infinite value(s); "
                "drop them with finite_energies first"
            )
    a.sort()
    b.sort()
    t = np.concatenate([a, b])
    t.sort()
    # CDFs on each interval [t_k, t_{k+1}): right-continuous steps at the pooled points
    fa = np.searchsorted(a, t[:-1], side="right") / a.size
    fb = np.searchsorted(b, t[:-1], side="right") / b.size
    return float(np.sum(np.abs(fa - fb) * np.diff(t)))


def log_importance_weights(log_target: Tensor, log_q: Tensor) -> Tensor:
    """Self-normalized log importance weights ``log w_n - logsumexp(log w)``.

    ``log w_n = log_target_n - log_q_n`` with ``log_target = -beta U(x_n)`` the
    unnormalized log Boltzmann density and ``log_q`` the model's exact log density of its own
    samples ``x_n``. The result satisfies ``logsumexp = 0``; the unknown partition function
    cancels. A sample with ``log_target = -inf`` (infinite energy) gets weight zero.

    Args:
        log_target: ``(N,)`` unnormalized target log densities.
        log_q: ``(N,)`` model log densities, same measure as the target.

    Returns:
        ``(N,)`` normalized log weights, dtype and device of the inputs (float64 inside).

    Raises:
        ValueError: for mismatched shapes, empty input, NaN, ``log_target = +inf`` or
            ``log_q = +-inf`` (an infinite or undefined weight), or all weights zero.
    """
    log_target, log_q = torch.as_tensor(log_target), torch.as_tensor(log_q)
    if log_target.shape != log_q.shape or log_target.dim() != 1:
        raise ValueError(
            "log_target and log_q must be (N,) of equal shape, got "
            f"{tuple(log_target.shape)} and {tuple(log_q.shape)}"
        )
    if log_target.numel() == 0:
        raise ValueError("log_target and log_q are empty")
    for name, x in (("log_target", log_target), ("log_q", log_q)):
        if torch.isnan(x).any():
            raise ValueError(f"{name} contains {int(torch.isnan(x).sum())} NaN value(s)")
    if (log_target == math.inf).any():
        raise ValueError("log_target contains +inf (an infinite weight)")
    if not torch.isfinite(log_q).all():
        raise ValueError("log_q contains infinite values; q must be finite and positive")
    log_w = log_target.double() - log_q.double()
    total = torch.logsumexp(log_w, 0)
    if total == -math.inf:
        raise ValueError("all importance weights are zero (log_target is -inf everywhere)")
    return (log_w - total).to(log_target.dtype)


def effective_sample_size(log_w: Tensor) -> float:
    """Kish effective sample size as a fraction of ``N``: ``(sum w)^2 / (N sum w^2)``.

    Computed in log space as ``exp(2 logsumexp(log w) - logsumexp(2 log w) - log N)``, so
    the weights need not be normalized and never overflow. 1 for equal weights, ``1/N``
    when a single weight carries everything.

    Args:
        log_w: ``(N,)`` log weights (normalized or not); ``-inf`` is a zero weight and
            still counts in ``N``.

    Returns:
        ESS / N in ``[1/N, 1]``.

    Raises:
        ValueError: for empty input, NaN, ``+inf``, or all weights zero.
    """
    log_w = torch.as_tensor(log_w).double()
    if log_w.dim() != 1 or log_w.numel() == 0:
        raise ValueError(f"log_w must be a non-empty (N,) tensor, got {tuple(log_w.shape)}")
    if torch.isnan(log_w).any():
        raise ValueError(f"log_w contains {int(torch.isnan(log_w).sum())} NaN value(s)")
    if (log_w == math.inf).any():
        raise ValueError("log_w contains +inf (an infinite weight)")
    if (log_w == -math.inf).all():
        raise ValueError("all weights are zero (log_w is -inf everywhere)")
    log_ess = 2 * torch.logsumexp(log_w, 0) - torch.logsumexp(2 * log_w, 0)
    return float((log_ess - math.log(log_w.numel())).exp())


def boltzmann_weights(E, log_q, kT: float) -> tuple[np.ndarray, int]:
    """Normalized importance weights of samples of ``q`` for the target ``exp(-E / kT)``.

    ``w_n = exp(-E_n / kT - log_q_n) / sum_m exp(-E_m / kT - log_q_m)``
    (`log_importance_weights`; the partition functions cancel). A non-finite energy
    (``+inf`` or NaN: a failed force-field evaluation; ``-inf`` too, which no force field
    returns) gets weight exactly 0 and is counted; its ``log_q`` is not read, so a sample
    that failed altogether does not stop the rest.

    Args:
        E (ArrayLike): energies, shape=[N], in the units of ``kT`` (kcal/mol for MMFF94:
            ``kT = KB_KCAL * T``, `grassflow.data.conformers.KB_KCAL`).
        log_q (ArrayLike): the proposal's exact log-density of each sample (nats), shape=[N],
            on the same coordinates as the target density.
        kT: the thermal energy, > 0, in the units of ``E``.

    Returns:
        ``(w, n_zero)``: float64 weights, shape=[N], ``w >= 0`` summing to 1; and the number
        of non-finite energies (whose weight is 0).

    Raises:
        ValueError: mismatched shapes, empty input, ``kT`` not finite and > 0, every energy
            non-finite, or a non-finite ``log_q`` where the energy is finite.
    """
    E = np.asarray(E.detach().cpu() if isinstance(E, Tensor) else E, dtype=np.float64)
    log_q = np.asarray(log_q.detach().cpu() if isinstance(log_q, Tensor) else log_q,
                       dtype=np.float64)  # fmt: skip
    if E.ndim != 1 or E.shape != log_q.shape:
        raise ValueError(f"E and log_q must be (N,) of equal shape, got {E.shape} and "
                         f"{log_q.shape}")  # fmt: skip
    if E.size == 0:
        raise ValueError("E and log_q are empty")
    if not (math.isfinite(kT) and kT > 0):
        raise ValueError(f"kT must be finite and > 0, got {kT!r}")
    ok = np.isfinite(E)
    if not ok.any():
        raise ValueError(f"all {E.size} energies are non-finite: every weight would be zero")
    # a failed sample's weight is 0 whatever q says of it: its log_q is not used
    log_target = np.where(ok, -np.where(ok, E, 0.0) / kT, -np.inf)
    log_w = log_importance_weights(torch.from_numpy(log_target),
                                   torch.from_numpy(np.where(ok, log_q, 0.0)))  # fmt: skip
    w = log_w.exp().numpy()
    return w / w.sum(), int(E.size - ok.sum())  # exp rounds: normalize again to sum 1


def ess_fraction(w) -> float:
    """Kish effective sample size as a fraction of ``N``: ``(sum w)^2 / (N sum w^2)``.

    `effective_sample_size` of ``log w``: zero weights (failed samples) count in ``N``.

    Args:
        w (ArrayLike): non-negative weights, shape=[N], normalized or not.

    Returns:
        ESS / N in ``[1/N, 1]``.

    Raises:
        ValueError: empty input, a negative or non-finite weight, or all weights zero.
    """
    w = np.asarray(w.detach().cpu() if isinstance(w, Tensor) else w, dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"w must be a non-empty (N,) array, got shape {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("w must be finite and >= 0")
    with np.errstate(divide="ignore"):  # log 0 = -inf: a zero weight
        return effective_sample_size(torch.from_numpy(np.log(w)))
