r"""Exact densities on R^{n x k} built from a density on Gr(k, n) (for Cartesian NLLs).

A full-rank ``P: (n, k)`` (for QM9: n = 18 centred atoms in an orthonormal basis of 1^perp,
k = 3 coordinates) is written as in the paper's QM9 protocol,

    P = Y diag(sqrt(lam)) R^T,

with ``Y`` the eigenvectors of P P^T (the canonical representative of [Y] = span(P) of
``Grassmann.from_point_cloud(P, "eig")``: lam descending, largest-magnitude entry of each
column positive), ``lam`` the eigenvalues of P^T P and ``R`` in O(k). ``P -> P Q`` (Q in O(k))
leaves Y and lam unchanged and sends R to Q^T R.

Conventions (all densities are w.r.t. these measures):

* R^{n x k}: Lebesgue measure dP on the nk entries.
* Gr(k, n): Riemannian volume of the metric tr(xi^T eta), as everywhere in grassflow
  (``Grassmann.log_volume``: V_Gr = pi^{k(n-k)/2} Gamma_k(k/2) / Gamma_k(n/2)).
* O(k): the metric (1/2) tr(Om^T Om) on skew Om = Q^T dQ, i.e. the fibre metric of
  St(n, k) -> Gr(k, n) for the canonical Stiefel metric (Muirhead's (Q^T dQ)). Then
  Vol(O(k)) = 2^k pi^{k^2/2} / Gamma_k(k/2) (`log_volume_orthogonal`; O(2) = 4 pi).
* lam: Lebesgue measure on the chamber lam_1 > ... > lam_k > 0.
* SPD(k): Lebesgue measure on the k(k+1)/2 entries S_ij, i <= j.

Derivation. With H = [U, U_perp] orthogonal, A = U^T dU, C = U_perp^T dU, Om = V^T dV,
``H^T dP V = [A D + dD - D Om; C D]`` for P = U D V^T (SVD). The C block gives
prod_i d_i^{n-k}; each pair i < j gives a 2x2 block of determinant d_i^2 - d_j^2; so locally
``dP = prod_i d_i^{n-k} prod_{i<j} (d_i^2 - d_j^2) dD (U^T dU)(V^T dV)`` (Edelman & Rao 2005,
Muirhead Thm 2.1.13-2.1.14 for the same computation in QR/polar form). The Stiefel form splits as
(U^T dU) = dvol_Gr([U]) x (fibre volume), d_i = sqrt(lam_i) gives dD = 2^{-k} prod lam^{-1/2}
dlam, and (U, V) -> (U S, V S), S = diag(+-1), is the 2^k-fold ambiguity of the SVD. Hence,
for any integrable f and any representative Y of each [Y],

    int f(P) dP = int_Gr dvol_Gr([Y]) int dlam exp(L(lam)) E_{Q, R ~ Haar(O(k))}
                      [ f(Y Q diag(sqrt(lam)) R^T) ],

    L(lam) = log[4^{-k} Vol(O(k))^2] + (n-k-1)/2 sum_i log lam_i + sum_{i<j} log(lam_i - lam_j)
           = k^2 log(pi) - 2 log Gamma_k(k/2) + (n-k-1)/2 sum_i log lam_i
             + sum_{i<j} log(lam_i - lam_j)                                (`log_jacobian`).

Note the two Haar variables: R (rotations of the coordinates) and Q, the orientation of the
principal axes (the columns of Y) inside the subspace [Y]. ([Y], lam, R) alone has
k(k-1)/2 dimensions too few. `cartesian_log_prob` takes Q Haar-uniform, which gives the
exactly normalized, O(k)-invariant density

    log p(P) = log p_Gr([Y]) + log p_lam(lam | Y) - L(lam),

with p_lam a normalized density on the chamber for each canonical Y. The i.i.d. Gaussian is
of this form (Y, lam and R independent, [Y] uniform, lam Wishart eigenvalues, Muirhead
Thm 3.2.18, `wishart_eigenvalue_log_prob`). Unless p_lam vanishes like
prod_{i<j}(lam_i - lam_j) at ties, p(P) is unbounded (but integrable) near configurations
with repeated principal moments.

Every O(k)-invariant density is a function of P P^T and can instead be written in the
issue's form P = Y B, B = Y^T P, ``dP = |det B|^{n-k} dvol_Gr([Y]) dB`` (exact for any
measurable choice of orthonormal representative; no 2^k). With S = B B^T,
dB = 2^{-k} det(S)^{-1/2} dS dvol_O(k) (Muirhead Thm 2.1.14, square case), so

    log p(P) = log p_Gr([Y]) + log p_S(S | Y) - (k^2/2) log(pi) + log Gamma_k(k/2)
               - (n-k-1)/2 log det S                          (`cartesian_log_prob_gram`),

where p_S(. | Y) is a density on SPD(k) that must be equivariant,
p_S(Q^T S Q | Y Q) = p_S(S | Y), so that any representative gives the same value; this
form also models the in-plane orientation Q (the first one is its special case with
p_S = 2^k p_lam / (Vol(O(k)) prod_{i<j}(lam_i - lam_j)), Muirhead Thm 3.2.17).

The paper's QM9 model (scale estimator + -ELBO) is this Gram form with a p_S that is *not*
equivariant: the orientation Q of the representative Y' = Y Q is a latent variable, Haar a
priori, and S | Y' ~ p_psi. Its exact gram density is the fibre average
E_Q[p_psi(Q^T S Q | Y Q)], which is equivariant; `cartesian_elbo` bounds its log with
Jensen (the ELBO, posterior q(Q | P) = Haar) or with K importance samples (IWAE).

References:
    Muirhead. Aspects of Multivariate Statistical Theory (1982): Thm 2.1.13-2.1.15 (QR and
    polar Jacobians, Vol St(n, k) = 2^k pi^{nk/2} / Gamma_k(n/2)), Thm 3.2.17 (Jacobian of
    A = H L H^T), Thm 3.2.18 (Wishart eigenvalue density).
    Edelman, Rao. Random matrix theory. Acta Numerica 14 (2005), SVD Jacobian.
    Edelman, Arias, Smith (1998): canonical metric, St(n, k) -> Gr(k, n) submersion.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..manifolds.shape_space import shape_factor

__all__ = [
    "cartesian_elbo",
    "cartesian_log_prob",
    "cartesian_log_prob_gram",
    "log_jacobian",
    "log_jacobian_gram",
    "log_volume_orthogonal",
    "random_orthogonal",
    "wishart_eigenvalue_log_prob",
    "wishart_log_prob",
    "wishart_sample",
]


def _log_multigamma(a: float, p: int) -> float:
    """log Gamma_p(a) = p(p-1)/4 log(pi) + sum_{j<p} log Gamma(a - j/2)."""
    return 0.25 * p * (p - 1) * math.log(math.pi) + sum(math.lgamma(a - 0.5 * j) for j in range(p))


def _check_int(name: str, value, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_tensor(x: Tensor, name: str, min_dim: int) -> None:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < min_dim or x.numel() == 0:
        raise ValueError(f"{name} must be a non-empty tensor with >= {min_dim} dims, got "
                         f"shape {tuple(x.shape)}")  # fmt: skip
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf")


def _check_eigenvalues(lam: Tensor) -> None:
    _check_tensor(lam, "lam", 1)
    if (lam <= 0).any():
        raise ValueError("lam must be positive (eigenvalues of P^T P for full-rank P)")
    if (lam[..., 1:] > lam[..., :-1]).any():
        raise ValueError("lam must be sorted in descending order along the last dim")


def _pair_log_gaps(lam: Tensor) -> Tensor:
    """sum_{i<j} log(lam_i - lam_j) for descending ``lam: (..., k)`` -> ``(...)``."""
    k = lam.shape[-1]
    if k == 1:
        return lam.new_zeros(lam.shape[:-1])
    i, j = torch.triu_indices(k, k, offset=1, device=lam.device)
    return torch.log(lam[..., i] - lam[..., j]).sum(-1)


def log_volume_orthogonal(k: int) -> float:
    """log Vol(O(k)) = k log 2 + (k^2/2) log(pi) - log Gamma_k(k/2).

    For the metric (1/2) tr(Om^T Om), Om = Q^T dQ skew (so E_ij - E_ji has unit norm and a
    rotation by angle t has length |t|): Vol(O(1)) = 2, Vol(O(2)) = 4 pi, Vol(O(3)) = 16 pi^2.
    """
    _check_int("k", k, 1)
    return k * math.log(2.0) + 0.5 * k * k * math.log(math.pi) - _log_multigamma(0.5 * k, k)


def log_jacobian(lam: Tensor, n: int) -> Tensor:
    """log of the volume factor ``exp(L)`` in ``dP = exp(L) dvol_Gr dlam dnu``.

    ``nu`` is the Haar probability measure of the pair (Q, R) in O(k) x O(k) (in-plane
    orientation of the principal axes, rotation of the coordinates), see the module docstring:
    ``L = k^2 log(pi) - 2 log Gamma_k(k/2) + (n-k-1)/2 sum log lam_i + sum_{i<j} log(lam_i -
    lam_j)``. Tied eigenvalues give ``-inf``.

    Args:
        lam: ``(..., k)`` positive, descending eigenvalues of P^T P.
        n: number of rows of P, ``n > k``.

    Returns:
        ``(...)``.
    """
    _check_eigenvalues(lam)
    k = lam.shape[-1]
    _check_int("n", n, k + 1)
    const = k * k * math.log(math.pi) - 2.0 * _log_multigamma(0.5 * k, k)
    return const + 0.5 * (n - k - 1) * torch.log(lam).sum(-1) + _pair_log_gaps(lam)


def wishart_eigenvalue_log_prob(lam: Tensor, dof: float, scale: float | Tensor = 1.0) -> Tensor:
    """Log-density of the ordered eigenvalues of a Wishart W_k(dof, scale * I) matrix.

    Muirhead Thm 3.2.18: ``pi^{k^2/2} / ((2 scale)^{dof k/2} Gamma_k(k/2) Gamma_k(dof/2))
    exp(-sum lam / (2 scale)) prod lam^{(dof-k-1)/2} prod_{i<j} (lam_i - lam_j)`` on
    lam_1 > ... > lam_k > 0. With ``dof = n`` these are the eigenvalues of P^T P for P with
    i.i.d. N(0, scale) entries, so it is the ``scale_log_prob`` that makes
    `cartesian_log_prob` that Gaussian.

    Args:
        lam: ``(..., k)`` positive, descending.
        dof: degrees of freedom, ``> k - 1``.
        scale: variance of the underlying Gaussian entries, ``> 0``; a float or a tensor
            broadcastable to ``lam.shape[:-1]`` (e.g. a function of Y).

    Returns:
        ``(...)``.
    """
    _check_eigenvalues(lam)
    k = lam.shape[-1]
    if not dof > k - 1:
        raise ValueError(f"need dof > k - 1 = {k - 1}, got dof={dof}")
    scale = torch.as_tensor(scale, dtype=lam.dtype, device=lam.device)
    if not (torch.isfinite(scale).all() and (scale > 0).all()):
        raise ValueError("scale must be finite and positive")
    const = (
        0.5 * k * k * math.log(math.pi)
        - 0.5 * dof * k * torch.log(2.0 * scale)
        - _log_multigamma(0.5 * k, k)
        - _log_multigamma(0.5 * dof, k)
    )
    return (
        const
        - lam.sum(-1) / (2.0 * scale)
        + 0.5 * (dof - k - 1) * torch.log(lam).sum(-1)
        + _pair_log_gaps(lam)
    )


def wishart_log_prob(S: Tensor, dof: Tensor | float, V: Tensor) -> Tensor:
    """Log-density of the Wishart W_k(dof, V) on SPD(k), Lebesgue on the entries i <= j.

    ``((dof - k - 1)/2) log det S - tr(V^-1 S)/2 - (dof k/2) log 2 - (dof/2) log det V -
    log Gamma_k(dof/2)`` (Muirhead Thm 3.2.1); its mean is ``dof V``. Equivariant:
    ``W(Q^T S Q; dof, Q^T V Q) = W(S; dof, V)`` for Q in O(k).

    Args:
        S: ``(..., k, k)`` SPD.
        dof: ``> k - 1``, a float or a tensor broadcastable to ``S.shape[:-2]``.
        V: ``(..., k, k)`` SPD scale matrix.

    Returns:
        ``(...)``.
    """
    k = S.shape[-1]
    dof = torch.as_tensor(dof, dtype=S.dtype, device=S.device)
    L = torch.linalg.cholesky(V)
    logdet_V = 2 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
    logdet_S = torch.linalg.slogdet(S)[1]
    trace = torch.cholesky_solve(S, L).diagonal(dim1=-2, dim2=-1).sum(-1)
    return (0.5 * (dof - k - 1) * logdet_S - 0.5 * trace - 0.5 * dof * k * math.log(2.0)
            - 0.5 * dof * logdet_V - torch.mvlgamma(0.5 * dof, p=k))  # fmt: skip


def wishart_sample(
    dof: Tensor, V: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """Draws ``S ~ W_k(dof, V)``, ``(..., k, k)``, by the Bartlett decomposition.

    ``S = L A A^T L^T`` with ``L = chol(V)``, A lower triangular, ``A_ii^2 ~ chi^2(dof - i)``
    (i = 0 .. k-1) and standard normal entries below the diagonal.
    """
    k = V.shape[-1]
    dof = torch.as_tensor(dof, dtype=V.dtype, device=V.device).expand(V.shape[:-2])
    seed = int(torch.randint(2**62, (1,), generator=generator))
    # torch's gamma sampler takes no generator: draw it in a forked, seeded global RNG
    with torch.random.fork_rng(devices=[] if V.device.type == "cpu" else [V.device]):
        torch.manual_seed(seed)
        df = dof.unsqueeze(-1) - torch.arange(k, dtype=V.dtype, device=V.device)
        chi2 = torch.distributions.Chi2(df).sample()
        A = torch.randn(*V.shape, dtype=V.dtype, device=V.device).tril(-1)
    A = A + torch.diag_embed(chi2.sqrt())
    LA = torch.linalg.cholesky(V) @ A
    return LA @ LA.mT


def _call_density(fn: Callable, args: tuple, name: str, P: Tensor) -> Tensor:
    out = fn(*args)
    batch = P.shape[:-2]
    if not isinstance(out, Tensor) or out.shape != batch:
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"{name} must return a tensor of shape {tuple(batch)}, got {shape}")
    if out.dtype != P.dtype or out.device != P.device:
        raise ValueError(
            f"{name} returned dtype {out.dtype} on {out.device}, but P is {P.dtype} on {P.device}"
        )
    return out


def cartesian_log_prob(
    P: Tensor,
    grassmann_log_prob: Callable[[Tensor], Tensor],
    scale_log_prob: Callable[[Tensor, Tensor], Tensor],
) -> Tensor:
    """Exact log-density on R^{n x k} (Lebesgue) of the O(k)-invariant model
    ``[Y] ~ p_Gr``, principal axes Haar-uniform within [Y], ``lam | Y ~ p_lam``, R Haar.

    ``log p(P) = grassmann_log_prob(Y) + scale_log_prob(lam, Y) - log_jacobian(lam, n)`` with
    ``(Y, lam, R) = shape_factor(P)``; ``p(P Q) = p(P)`` for every Q in O(k).

    Args:
        P: ``(..., n, k)`` full-rank configurations.
        grassmann_log_prob: ``Y (..., n, k) -> (...)``, a normalized log-density on Gr(k, n)
            w.r.t. the tr-metric volume (e.g. a GrCNF's or a prior's ``log_prob``); it
            receives the canonical representative and should depend on [Y] only.
        scale_log_prob: ``(lam (..., k), Y (..., n, k)) -> (...)``, for each canonical Y a
            normalized log-density of lam on lam_1 > ... > lam_k > 0 (may depend on Y).

    Returns:
        ``(...)`` log p(P).
    """
    Y, lam, _ = shape_factor(P)
    log_gr = _call_density(grassmann_log_prob, (Y,), "grassmann_log_prob", P)
    log_lam = _call_density(scale_log_prob, (lam, Y), "scale_log_prob", P)
    return log_gr + log_lam - log_jacobian(lam, P.shape[-2])


def cartesian_log_prob_gram(
    P: Tensor,
    grassmann_log_prob: Callable[[Tensor], Tensor],
    gram_log_prob: Callable[[Tensor, Tensor], Tensor],
) -> Tensor:
    """Exact log-density on R^{n x k} of ``[Y] ~ p_Gr``, ``S = Y^T P P^T Y | Y ~ p_S``, R Haar.

    The general O(k)-invariant model (it also models the orientation of the principal axes
    within [Y]): ``log p(P) = log p_Gr(Y) + log p_S(S | Y) - (k^2/2) log(pi) +
    log Gamma_k(k/2) - (n-k-1)/2 log det S``, from ``dP = |det B|^{n-k} dvol_Gr dB``.

    Args:
        P: ``(..., n, k)`` full-rank configurations.
        grassmann_log_prob: as in `cartesian_log_prob`.
        gram_log_prob: ``(S (..., k, k), Y (..., n, k)) -> (...)``, for each Y a normalized
            log-density on SPD(k) (Lebesgue on the entries i <= j), equivariant:
            ``gram_log_prob(Q^T S Q, Y Q) == gram_log_prob(S, Y)`` for Q in O(k). It is called
            with the canonical Y of `shape_factor`, where S = diag(lam); to use e.g.
            Cholesky coordinates, map S to a frame that depends on [Y] only (Q = Y_ref^T Y,
            S_ref = Q S Q^T).

    Returns:
        ``(...)`` log p(P).
    """
    Y, lam, _ = shape_factor(P)
    log_gr = _call_density(grassmann_log_prob, (Y,), "grassmann_log_prob", P)
    log_s = _call_density(gram_log_prob, (torch.diag_embed(lam), Y), "gram_log_prob", P)
    return log_gr + log_s + log_jacobian_gram(lam, P.shape[-2])


def log_jacobian_gram(lam: Tensor, n: int) -> Tensor:
    """The data-only term of `cartesian_log_prob_gram`, ``(...)``:
    ``-(k^2/2) log(pi) + log Gamma_k(k/2) - (n-k-1)/2 log det S`` for ``S`` of eigenvalues
    ``lam: (..., k)`` and ``P: (n, k)``."""
    k = lam.shape[-1]
    const = -0.5 * k * k * math.log(math.pi) + _log_multigamma(0.5 * k, k)
    return const - 0.5 * (n - k - 1) * torch.log(lam).sum(-1)


def random_orthogonal(
    shape: tuple[int, ...], k: int, *, generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64, device: torch.device | str | None = None,
) -> Tensor:
    """Haar-distributed ``Q: (*shape, k, k)`` in O(k) (QR of a Gaussian with sign fix)."""
    G = torch.randn(*shape, k, k, generator=generator, dtype=dtype, device=device)
    Q, R = torch.linalg.qr(G)
    return Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)


def cartesian_elbo(
    P: Tensor,
    grassmann_log_prob: Callable[[Tensor], Tensor],
    gram_log_prob: Callable[[Tensor, Tensor], Tensor],
    n_samples: int = 1,
    importance_weighted: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Lower bound on log p(P) for a latent principal-axes orientation (the paper's -ELBO).

    The model: ``[Y] ~ p_Gr``; a representative ``Y' = Y Q`` with Q Haar on O(k);
    ``S' = Y'^T P P^T Y' | Y' ~ gram_log_prob(., Y')``, any normalized density on SPD(k) (need
    not be equivariant); R Haar. Its exact likelihood is `cartesian_log_prob_gram` with
    the gram density ``E_Q[p(Q^T S Q | Y Q)]``. With the posterior ``q(Q | P)`` = Haar:

    * ``importance_weighted=False``: ``ELBO = ... + mean_l log p(Q_l^T S Q_l | Y Q_l)``, the
      paper's bound. In the paper's terms: reconstruction E_q log p_psi(S' | Y'), prior
      E_q log p(Y') = log p_Gr([Y]) - log Vol(O(k)) and entropy H[q] = log Vol(O(k))
      (the differential entropy of the uniform law on O(k); the paper writes
      log V / V), so the two Vol(O(k)) terms cancel.
    * ``importance_weighted=True``: ``log mean_l p(...)`` (IWAE), a tighter bound that tends
      to the exact log p(P) as ``n_samples`` grows.

    The equality ``ELBO = log p`` holds for every draw when the density is equivariant.

    Args:
        P: ``(..., n, k)`` full-rank configurations.
        grassmann_log_prob: as in `cartesian_log_prob`.
        gram_log_prob: ``(S (L, ..., k, k), Y (L, ..., n, k)) -> (L, ...)``.
        n_samples: number L of Haar draws per configuration.
        generator: for the draws.

    Returns:
        ``(...)`` the bound, per configuration.
    """
    _check_int("n_samples", n_samples, 1)
    k = P.shape[-1]

    def fibre_gram_log_prob(S: Tensor, Y: Tensor) -> Tensor:
        Q = random_orthogonal((n_samples, *S.shape[:-2]), k, generator=generator,
                              dtype=S.dtype, device=S.device)  # fmt: skip
        lp = gram_log_prob(Q.mT @ S @ Q, Y @ Q)
        if importance_weighted:
            return torch.logsumexp(lp, dim=0) - math.log(n_samples)
        return lp.mean(0)

    return cartesian_log_prob_gram(P, grassmann_log_prob, fibre_gram_log_prob)
