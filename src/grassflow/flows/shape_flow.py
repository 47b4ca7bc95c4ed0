r"""ShapeFlow: an exact density on point clouds, invariant to translation, rotation, reflection
and relabelling of the points.

A cloud ``P: (n, d)`` is centred and written in the Helmert basis H of 1-perp,
``P' = H^T P: (n - 1, d)``, the CoM-free coordinates that E-NF's densities live on (H has
orthonormal columns, so Lebesgue measure on P' is that of the centred subspace). Then
``P' = Y B`` with [Y] in Gr(d, n - 1) and ``S = B B^T``, and

.. math:: \log p(P') = \log p_{Gr}([Y]) + \log p(S \mid Y) - \tfrac{d^2}{2}\log\pi
          + \log\Gamma_d(d/2) - \tfrac{n-d-2}{2}\log\det S

(:func:`~grassflow.distributions.cartesian.cartesian_log_prob_gram`): a GrCNF on
Gr(d, n - 1) for the subspace and a :class:`~grassflow.nn.gram.WishartGram` for S given Y.
With the graph potential or the EGNN field and the uniform prior both parts are invariant
to relabelling the points; the MLP potential (the paper's) and the Gaussian prior are not.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..distributions.cartesian import log_jacobian_gram, random_orthogonal
from ..manifolds import Grassmann
from ..manifolds.shape_space import helmert_basis, shape_factor
from ..nn import PAPER_WIDTHS, EGNNField, GrassmannField, PointCloudField, Potential
from ..nn.gram import DistanceGram, WishartGram
from ..nn.graph import GraphPotential
from .grcnf import GrCNF

__all__ = ["DEFAULT_LAYERS", "GRAMS", "POTENTIALS", "ShapeFlow"]

POTENTIALS = ("graph", "mlp", "egnn")
DEFAULT_LAYERS = {"graph": 2, "mlp": 2, "egnn": 3}  # message-passing layers (the MLP has none)
GRAMS = {"wishart": WishartGram, "distance": DistanceGram}  # densities of S given the span


class ShapeFlow(nn.Module):
    """Normalized density on clouds of ``n_points`` points in R^``dim`` (any translation).

    Args:
        n_points: n, points per cloud (``n >= dim + 2``).
        dim: d, their dimension.
        potential: the Grassmann part's field: the gradient of ``"graph"`` (a
            permutation-invariant message-passing potential, default) or ``"mlp"`` (the
            paper's HorP + ConcatSquash MLP), or ``"egnn"``: not a gradient, the velocity of an
            EGNN on the span's whitened points made horizontal (:class:`PointCloudField`).
        hidden: graph or EGNN width (default 32) or MLP widths (default 32-32-32).
        layers: graph or EGNN message-passing layers (default 2 and 3).
        labels: optional ``(n,)`` integer point labels shared by all clouds (atom types of one
            molecule), seen by the graph potential or the EGNN and by the Gram density.
        prior: GrCNF base, ``"uniform"`` (default; permutation invariant) or ``"gaussian"``.
        sigma, T, train_T, divergence, method, atol, rtol: see :class:`GrCNF`.
        gram: the density of S given the span, ``"wishart"`` (:class:`WishartGram`, default)
            or ``"distance"`` (:class:`DistanceGram`: a log-normal around a least-squares fit
            of learned pair distances, with per-pair precisions; much sharper on LJ13).
        gram_hidden, gram_layers, gram_components: of the Gram density (components: a
            mixture of that many).
        chunk_size: clouds per ODE solve in :meth:`log_prob` and :meth:`sample`; bounds the
            peak memory of the exact divergence (k(D - k) Hessian-vector products at once).
    """

    def __init__(
        self,
        n_points: int,
        dim: int,
        potential: str = "graph",
        hidden: int | tuple[int, ...] | None = None,
        layers: int | None = None,
        labels: Tensor | None = None,
        prior: str = "uniform",
        sigma: float = 0.3,
        T: float = 1.0,
        train_T: bool = True,
        divergence: str = "exact",
        method: str = "cayley_rkmk",
        atol: float = 1e-5,
        rtol: float = 1e-5,
        gram_hidden: int = 32,
        gram_layers: int = 1,
        chunk_size: int = 16,
        gram_components: int = 1,
        gram: str = "wishart",
    ):
        super().__init__()
        if not (isinstance(n_points, int) and isinstance(dim, int) and 1 <= dim <= n_points - 2):
            raise ValueError(
                f"a density on centred clouds of n points in d dimensions needs n >= d + 2, "
                f"got n_points={n_points}, dim={dim}"
            )
        if potential not in POTENTIALS:
            raise ValueError(f"potential must be one of {POTENTIALS}, got {potential!r}")
        if not (isinstance(chunk_size, int) and chunk_size >= 1):
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        self.n_points, self.dim, self.chunk_size = n_points, dim, chunk_size
        D, k = n_points - 1, dim
        width = 32 if hidden is None or potential == "mlp" else int(hidden)
        layers = DEFAULT_LAYERS[potential] if layers is None else layers
        if potential == "graph":
            field = GrassmannField(GraphPotential(n_points, dim, width, layers, labels))
        elif potential == "egnn":
            field = PointCloudField(EGNNField(n_points, dim, width, layers, labels=labels),
                                    n_points)  # fmt: skip
        else:
            field = GrassmannField(
                Potential(D, k, PAPER_WIDTHS["lj13"] if hidden is None else tuple(hidden))
            )
        self.flow = GrCNF(
            Grassmann(k, D), field, prior=prior, prior_mean=torch.eye(D, k),
            row_cov=sigma**2 * torch.eye(D), col_cov=sigma**2 * torch.eye(k), T=T,
            train_T=train_T, divergence=divergence, method=method, atol=atol, rtol=rtol,
        )  # fmt: skip
        if gram not in GRAMS:
            raise ValueError(f"gram must be one of {tuple(GRAMS)}, got {gram!r}")
        self.gram = GRAMS[gram](n_points, dim, gram_hidden, gram_layers, labels,
                                components=gram_components)  # fmt: skip
        self.register_buffer("H", helmert_basis(n_points))  # float64; used in P's dtype

    def extra_repr(self) -> str:
        return f"n_points={self.n_points}, dim={self.dim}, chunk_size={self.chunk_size}"

    @property
    def manifold(self) -> Grassmann:
        return self.flow.manifold

    # ------------------------------------------------------------ coordinates
    def _check(self, P: Tensor) -> None:
        ref = self.flow.prior_mean
        if not isinstance(P, Tensor) or P.dim() != 3 or P.shape[1:] != (self.n_points, self.dim):
            shape = tuple(P.shape) if isinstance(P, Tensor) else type(P).__name__
            raise ValueError(f"P must be (B, {self.n_points}, {self.dim}) clouds, got {shape}")
        if P.dtype != ref.dtype or P.device != ref.device:
            raise ValueError(f"P is {P.dtype} on {P.device}, but the model is {ref.dtype} on "
                             f"{ref.device}; convert with .to() first")  # fmt: skip
        if P.shape[0] == 0 or not torch.isfinite(P).all():
            raise ValueError(
                f"P must be a non-empty batch of finite clouds, got shape {tuple(P.shape)}"
            )

    def helmert(self, P: Tensor) -> Tensor:
        """CoM-free coordinates ``P' = H^T (P - mean): (B, n - 1, d)`` of clouds ``(B, n, d)``."""
        self._check(P)
        return self.H.to(P).mT @ (P - P.mean(dim=-2, keepdim=True))

    def factor(self, P: Tensor) -> tuple[Tensor, Tensor]:
        """``(Y, S)``: the canonical representative ``(B, n - 1, d)`` of the cloud's span and
        its Gram matrix ``Y^T P' P'^T Y = diag(lam)`` ``(B, d, d)``. Raises on rank < d."""
        Y, lam, _ = shape_factor(self.helmert(P))
        return Y, torch.diag_embed(lam)

    # ------------------------------------------------------------ densities
    def log_prob_terms(self, P: Tensor, exact: bool | None = None) -> dict[str, Tensor]:
        """The parts of :meth:`log_prob`, each ``(B,)``: ``grassmann`` (log p_Gr([Y])),
        ``gram`` (log p(S | Y)) and ``jacobian`` (the change of variables, data only), and
        their sum ``log_prob``. The flow runs in chunks of ``chunk_size``."""
        Y, S = self.factor(P)
        log_gr = torch.cat([self.flow.log_prob(c, exact) for c in Y.split(self.chunk_size)])
        log_s = self.gram.log_prob(S, Y)
        jac = log_jacobian_gram(torch.diagonal(S, dim1=-2, dim2=-1), self.n_points - 1)
        return {"grassmann": log_gr, "gram": log_s, "jacobian": jac,
                "log_prob": log_gr + log_s + jac}  # fmt: skip

    def log_prob(self, P: Tensor, exact: bool | None = None) -> Tensor:
        """Exact log-density of clouds ``P: (B, n, d)`` -> ``(B,)``, in nats per cloud, w.r.t.
        Lebesgue measure on the (n - 1) d centred coordinates (E-NF's space)."""
        return self.log_prob_terms(P, exact)["log_prob"]

    def forward(self, P: Tensor) -> Tensor:
        """Alias of :meth:`log_prob`."""
        return self.log_prob(P)

    # ------------------------------------------------------------ sampling
    def sample(self, m: int, generator: torch.Generator | None = None) -> Tensor:
        """``m`` centred clouds ``(m, n, d)``, each in a Haar-random orientation (no graph)."""
        with torch.no_grad():
            Y = torch.cat([self.flow.sample(c, generator) for c in _chunks(m, self.chunk_size)])
            return self.sample_given(Y, generator)

    def sample_given(self, Y: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Centred clouds ``(B, n, d)`` with the given spans ``Y: (B, n - 1, d)`` (orthonormal
        representatives): S from the Gram density, a Haar-random orientation. With the spans
        of real clouds this isolates what the Gram density does to the samples."""
        with torch.no_grad():
            S = self.gram.sample(Y, generator)
            R = random_orthogonal(Y.shape[:-2], self.dim, generator=generator, dtype=Y.dtype,
                                  device=Y.device)  # fmt: skip
            return self.H.to(Y) @ (Y @ torch.linalg.cholesky(S) @ R)


def _chunks(m: int, size: int) -> list[int]:
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"number of samples must be an integer >= 1, got {m!r}")
    return [min(size, m - i) for i in range(0, m, size)]
