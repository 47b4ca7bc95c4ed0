"""Deterministic quadrature for the uniform law on small Grassmannians (test helper).

``grassmann_rule(k, D, order)`` returns nodes ``Y: (N, D, k)`` (orthonormal) and weights
``w: (N,)`` summing to one with ``sum_i w_i f(Y_i) ~ E_{[Y] uniform}[f([Y])]``, so that
``V_Gr sum_i w_i p(Y_i) ~ int p dvol`` for a density p. Built from Lebedev rules on S^2
(``scipy.integrate.lebedev_rule``, exact for polynomials up to degree ``order``):

* Gr(1, 3) = S^2 / {+-1}: lines through one node of each antipodal pair (weight doubled).
* Gr(1, 4) = S^3 / {+-1}: x = (cos t, sin t u), u on S^2 (Lebedev) and cos t at the nodes of
  Gauss-Chebyshev of the second kind (the weight sin^2 t dt = sqrt(1 - c^2) dc).
* Gr(D - 1, D): orthogonal complements of the lines of Gr(1, D).
* Gr(2, 4): oriented planes are the unit decomposable 2-forms, whose self-dual and
  anti-self-dual parts are two independent points a, b of S^2 (Gr~(2, 4) = S^2 x S^2, SO(4)
  acting as SO(3) x SO(3)); the plane is the range of the 2-form, (a, b) and (-a, -b) give the
  same one.

Each map is equivariant under O(D) and the invariant probability measure is unique, so these
are rules for the uniform law; the nodes are rotated by a fixed generic rotation so that none
sits on a symmetry of a test density (e.g. a Gaussian prior's mean ``eye(D, k)``).
"""

from __future__ import annotations

import math

import torch
from scipy.integrate import lebedev_rule
from scipy.special import multigammaln

__all__ = ["grassmann_rule", "log_volume_grassmann"]


def log_volume_grassmann(k: int, D: int) -> float:
    """log V_Gr(k, D) = (k (D - k) / 2) log pi + log Gamma_k(k / 2) - log Gamma_k(D / 2)."""
    return 0.5 * k * (D - k) * math.log(math.pi) + multigammaln(k / 2, k) - multigammaln(D / 2, k)


def _half(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One point of each antipodal pair of a centrally symmetric rule (first nonzero
    coordinate positive), with its weight doubled."""
    lead = torch.where(x.abs() > 1e-12, x, torch.zeros_like(x))
    first = lead.gather(1, (lead != 0).double().argmax(1, keepdim=True)).squeeze(1)
    keep = first > 0
    assert 2 * int(keep.sum()) == len(x), "rule is not centrally symmetric"
    return x[keep], 2 * w[keep]


def sphere_rule(order: int, half: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Lebedev nodes ``(N, 3)`` and weights summing to one (uniform law on S^2)."""
    x, w = lebedev_rule(order)
    x, w = torch.tensor(x.T), torch.tensor(w / w.sum())
    return _half(x, w) if half else (x, w)


def s3_rule(order: int, half: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes ``(N, 4)`` and weights summing to one (uniform law on S^3), exact up to degree
    ``order`` (Lebedev on S^2 times (order + 1) // 2 Gauss-Chebyshev-U nodes)."""
    m = (order + 1) // 2
    theta = torch.arange(1, m + 1, dtype=torch.float64) * math.pi / (m + 1)
    c, wc = torch.cos(theta), torch.sin(theta).square()
    u, wu = sphere_rule(order)
    x = torch.cat(
        [
            c.repeat_interleave(len(u))[:, None],
            torch.sin(theta).repeat_interleave(len(u))[:, None] * u.repeat(m, 1),
        ],
        1,
    )
    w = (wc[:, None] * wu[None, :]).reshape(-1)
    w = w / w.sum()
    return _half(x, w) if half else (x, w)


def _planes_24(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The planes ``(N, 4, 2)`` of the 2-forms with self-dual part a and anti-self-dual part b
    (orientation e1234: *(e12) = e34, *(e13) = -e24, *(e14) = e23)."""
    E = {}
    for r, c in [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]:
        E[r, c] = torch.zeros(4, 4, dtype=torch.float64)
        E[r, c][r, c], E[r, c][c, r] = 1.0, -1.0
    plus = torch.stack([E[0, 1] + E[2, 3], E[0, 2] - E[1, 3], E[0, 3] + E[1, 2]])
    minus = torch.stack([E[0, 1] - E[2, 3], E[0, 2] + E[1, 3], E[0, 3] - E[1, 2]])
    W = torch.einsum("ni,ijk->njk", a, plus) + torch.einsum("ni,ijk->njk", b, minus)
    return torch.linalg.eigh(W @ W.mT)[1][..., 2:]  # its range: eigenvalues 0, 0, r, r


def grassmann_rule(k: int, D: int, order: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes ``(N, D, k)`` and weights ``(N,)`` summing to one for the uniform law on
    Gr(k, D), for (k, D) in (1, 3), (2, 3), (1, 4), (3, 4), (2, 4); see the module docstring.
    ``order``: of the Lebedev rule(s) (3, 5, 7, ..., 131)."""
    if (k, D) == (2, 4):
        a, wa = sphere_rule(order, half=True)
        b, wb = sphere_rule(order)
        Y = _planes_24(a.repeat_interleave(len(b), 0), b.repeat(len(a), 1))
        w = (wa[:, None] * wb[None, :]).reshape(-1)
    elif D in (3, 4) and k in (1, D - 1):
        x, w = (sphere_rule if D == 3 else s3_rule)(order, half=True)
        Y = x.unsqueeze(-1)
        if k == D - 1:  # the orthogonal complement of each line
            Y = torch.linalg.qr(Y, mode="complete")[0][..., 1:]
    else:
        raise ValueError(f"no rule for Gr({k}, {D})")
    G = torch.linalg.qr(torch.randn(D, D, generator=torch.Generator().manual_seed(0),
                                    dtype=torch.float64))[0]  # fmt: skip
    return G @ Y, w
