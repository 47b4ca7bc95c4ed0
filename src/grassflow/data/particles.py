"""Energies of the DW4, LJ13 and LJ55 particle systems (Köhler et al. 2020; Klein et al.
2023).

A configuration is ``x: (..., n_particles, dim)``; an energy maps it to ``(...)``. The target
density is ``exp(-U(x))`` (temperature 1). Both energies are invariant under rotations,
reflections and translations of the whole configuration and under permutations of the
particles.

- **DW4**: 4 particles in 2-D with a double-well pair potential,
  ``U = 1/(2 tau) sum_{i != j} [b (d_ij - d0)^2 + c (d_ij - d0)^4]``.
- **LJ13**: 13 particles in 3-D with a Lennard-Jones pair potential plus a harmonic
  term that keeps the cluster together,
  ``U = sum_{i != j} eps [(rm / r_ij)^12 - 2 (rm / r_ij)^6] + k sum_i |x_i - xbar|^2``.
- **LJ55**: the same potential with 55 particles (`lennard_jones_energy`).

Conventions. DW4's ``1/(2 tau) sum_{i != j}`` counts every unordered pair once, as does
bgflow's ``MultiDoubleWellPotential`` (``tau = 1``), so it is unambiguous. For LJ13 two
conventions are in use: bgflow's ``LennardJonesPotential`` sums the ordered pairs and
divides by 2 (each pair once, ``pairs="unique"``), while DEM's copy of it (used with the
Klein et al. 2023 data) drops the ``/ 2`` by default (``energy_factor=1``) and notes that
0.5 matches the E-ACF energy. The default here is the ordered, double-counted sum
(``pairs="ordered"``): the reference samples of Klein et al. (2023) follow it, with
``<x . grad U> ~ 36 = (n - 1) d`` at equilibrium (``experiments/datasets/lj_convention.py``).

References:
    Köhler, Klein, Noé. Equivariant Flows: Exact Likelihood Generative Learning for
    Symmetric Densities (ICML 2020).
    Klein, Krämer, Noé. Equivariant Flow Matching (NeurIPS 2023).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "PAIR_CONVENTIONS",
    "SYSTEMS",
    "ParticleSystem",
    "dw4_energy",
    "get_system",
    "lennard_jones_energy",
    "lj13_energy",
    "lj55_energy",
    "pair_distances",
]


def _check_shape(x: Tensor, n_particles: int, dim: int, name: str) -> None:
    if x.dim() < 2 or tuple(x.shape[-2:]) != (n_particles, dim):
        raise ValueError(
            f"{name} expects x of shape (..., {n_particles}, {dim}), got {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise ValueError(f"{name} expects a floating point tensor, got {x.dtype}")


@functools.lru_cache(maxsize=32)
def _pair_index(n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    i, j = torch.triu_indices(n, n, offset=1, device=device)
    return i, j


def pair_distances(x: Tensor, *, ordered: bool = False, squared: bool = False) -> Tensor:
    """Distances between the particles of each configuration.

    Only off-diagonal pairs are formed, so there is no ``sqrt(0)`` on the diagonal and the
    gradient stays finite (unless two distinct particles coincide exactly).

    Args:
        x: ``(..., n, d)`` particle positions.
        ordered: if False, the ``n (n - 1) / 2`` pairs ``i < j`` (row-major order); if True,
            the ``n (n - 1)`` ordered pairs ``i != j`` (the ``i < j`` block, then ``i > j``).
        squared: return squared distances (no square root at all).

    Returns:
        ``(..., n (n - 1) / 2)`` or ``(..., n (n - 1))`` distances.
    """
    if x.dim() < 2:
        raise ValueError(f"pair_distances expects x of shape (..., n, d), got {tuple(x.shape)}")
    i, j = _pair_index(x.shape[-2], x.device)
    # (..., d, n) layout: index_select on the last axis and a sum over the short coordinate
    # axis as plain vector adds; forward + backward ~2x faster than x[..., i, :] on CPU
    xt = x.transpose(-1, -2)
    diff = xt.index_select(-1, i) - xt.index_select(-1, j)
    r = (diff * diff).sum(-2)
    if not squared:
        r = r.sqrt()
    # d_ij = d_ji: the ordered set is the unordered one twice, no need to recompute it
    return torch.cat([r, r], dim=-1) if ordered else r


def dw4_energy(
    x: Tensor, *, b: float = -4.0, c: float = 0.9, d0: float = 4.0, tau: float = 1.0
) -> Tensor:
    """DW4 double-well energy (Köhler et al. 2020).

    ``U = 1/(2 tau) sum_{i != j} [b (d_ij - d0)^2 + c (d_ij - d0)^4]``; with the defaults each
    pair has minima at ``d = d0 +- sqrt(-b / 2c) ~ 4 +- 1.49``, separated by a barrier of
    ``b^2 / 4c ~ 4.4`` (per unordered pair, ``tau = 1``).

    Args:
        x: ``(..., 4, 2)`` positions.
        b: quadratic coefficient.
        c: quartic coefficient.
        d0: the centre distance.
        tau: temperature.

    Returns:
        ``(...)`` energies, same dtype as ``x``.
    """
    _check_shape(x, 4, 2, "dw4_energy")
    s2 = (pair_distances(x) - d0).square()
    # sum over i < j counts each pair once; 1/(2 tau) * sum_{i != j} = 1/tau * sum_{i < j}
    return (s2 * (b + c * s2)).sum(-1) / tau


PAIR_CONVENTIONS: tuple[str, ...] = ("ordered", "unique")


def lennard_jones_energy(
    x: Tensor,
    *,
    eps: float = 1.0,
    rm: float = 1.0,
    harmonic: float = 0.5,
    pairs: str = "ordered",
) -> Tensor:
    """Lennard-Jones energy plus a harmonic term on the centred positions, of any number of
    particles (LJ13's and LJ55's).

    ``U = c sum_{i < j} eps [(rm / r_ij)^12 - 2 (rm / r_ij)^6] + harmonic * sum_i |x_i - xbar|^2``
    with ``xbar`` the mean position, so ``U`` is translation invariant; ``c = 2`` for
    ``pairs="ordered"`` (the sum over ``i != j``, every pair twice) and ``c = 1`` for
    ``pairs="unique"`` (bgflow's ``LennardJonesPotential``). The harmonic term is the same in
    both. Coinciding particles give ``U = +inf`` (a sampler rejects such a proposal) but
    never NaN from the diagonal, which is left out of the pair sum.

    Args:
        x: ``(..., n, d)`` positions.
        eps: depth of the pair well (per ordered pair, or per pair with ``"unique"``).
        rm: distance of the pair minimum.
        harmonic: coefficient of the harmonic term.
        pairs: ``"ordered"`` (default; the convention of the Klein et al. 2023 samples) or
            ``"unique"``.

    Returns:
        ``(...)`` energies, same dtype as ``x``.
    """
    if pairs not in PAIR_CONVENTIONS:
        raise ValueError(f"unknown pairs={pairs!r}; choose one of {list(PAIR_CONVENTIONS)}")
    inv2 = rm**2 / pair_distances(x, squared=True)
    inv6 = inv2 * inv2 * inv2  # products, not pow: a cheaper backward in the MCMC loop
    # the i < j sum, doubled for the ordered pairs i != j (see the module docstring)
    factor = 2.0 if pairs == "ordered" else 1.0
    lj = factor * eps * (inv6 * (inv6 - 2.0)).sum(-1)
    centred = x - x.mean(dim=-2, keepdim=True)
    return lj + harmonic * (centred * centred).flatten(-2).sum(-1)


def lj13_energy(x: Tensor, **kwargs) -> Tensor:
    """`lennard_jones_energy` of ``x: (..., 13, 3)`` (the keyword arguments are its)."""
    _check_shape(x, 13, 3, "lj13_energy")
    return lennard_jones_energy(x, **kwargs)


def lj55_energy(x: Tensor, **kwargs) -> Tensor:
    """`lennard_jones_energy` of ``x: (..., 55, 3)``: LJ13's potential with 55 particles, as
    Klein et al. (2023) define LJ55 (their files are not available here; `make_dataset`
    draws it by MCMC)."""
    _check_shape(x, 55, 3, "lj55_energy")
    return lennard_jones_energy(x, **kwargs)


@dataclass(frozen=True)
class ParticleSystem:
    """A system of ``n_particles`` identical particles in ``dim`` dimensions.

    Attributes:
        name: short name (a key of `SYSTEMS`).
        n_particles: number of particles.
        dim: spatial dimension.
        energy: ``(..., n_particles, dim) -> (...)`` potential energy.
    """

    name: str
    n_particles: int
    dim: int
    energy: Callable[[Tensor], Tensor]

    @property
    def flat_dim(self) -> int:
        """Length of a flattened configuration, ``n_particles * dim``."""
        return self.n_particles * self.dim


SYSTEMS: dict[str, ParticleSystem] = {
    "dw4": ParticleSystem("dw4", 4, 2, dw4_energy),
    "lj13": ParticleSystem("lj13", 13, 3, lj13_energy),
    "lj55": ParticleSystem("lj55", 55, 3, lj55_energy),
}


def get_system(name: str) -> ParticleSystem:
    """The `ParticleSystem` called ``name`` (case-insensitive)."""
    key = name.lower() if isinstance(name, str) else name
    if key not in SYSTEMS:
        raise ValueError(f"unknown particle system {name!r}; choose one of {sorted(SYSTEMS)}")
    return SYSTEMS[key]
