r"""``ShapeFlow``: the library's shape model, one E(n)-equivariant flow on the whole cloud.

A normalized density on clouds of n points in R^d: an EGNN velocity field (`EGNNField`) on
centre-of-mass-free coordinates, from a CoM-free Gaussian prior, trained by conditional flow
matching (`grassflow.training.shape_matching`, `grassflow.training.shape_fit`). Clouds
``P: (n, d)`` are centred and written in the Helmert basis H of 1-perp,
``z = H^T (P - mean): (n - 1, d)``; NLLs are nats per cloud, Lebesgue measure on the
(n - 1) d CoM-free coordinates (the space E-NF's densities live on too).

``geometry`` (`ShapeFlowConfig`) picks the flow-matching paths that train the field:

* ``"cartesian"`` (the default): straight lines between aligned clouds, i.e. equivariant
  flow matching (EFM; Klein, Krämer & Noé 2023). ``ShapeFlow`` with this geometry is the
  EFM baseline.
* ``"grassmann"``: the span on its Grassmann geodesic and the in-span metric on its
  affine-invariant SPD geodesic (`grassflow.manifolds.shape_paths`).

The density and the sampler are the same ODE either way:

* Prior: ``N(0, sigma^2 I)`` on z (``prior="gaussian"``), or for a molecule with a bond
  graph the harmonic Gaussian ``N(0, sigma^2 Sigma ⊗ I_d)``, ``Sigma = (H^T L H)^{-1}`` from
  the graph Laplacian L (``prior="harmonic"``, `grassflow.distributions.harmonic`), which
  starts bonded atoms close. Normalized (its log-normalizer is included, unlike the bgflow
  code that EFM's published numbers come from); sigma is fitted to the training clouds by
  maximum likelihood (`ShapeFlow.fit_prior`).
* Likelihood: ``log p(z_1) = log p_0(z_0) - int_0^1 div v(t, z_t) dt``, integrated backwards
  by dopri5 (torchdiffeq) with the exact divergence: the trace of the (n - 1) d x (n - 1) d
  Jacobian by forward-mode products along every basis direction. No Hutchinson estimate.

The density is invariant to translations (it lives on centred clouds), rotations,
reflections and relabellings, because the field is equivariant and the prior invariant. With
per-point ``labels`` (atom types) only relabellings that keep the labels leave it unchanged,
and with ``bonds`` (the field's edge features, the harmonic prior) only those that also keep
the bond graph.

Clouds of different compositions (QM9's molecules) give their atom types per cloud
(``n_labels`` without ``labels``): the model is then the conditional density ``p(x | a)`` of
the positions given the labels ``a: (n,)``, normalized for every ``a``, and it is invariant
to relabelling points and labels together. Such clouds travel as ``(B, n, d + 1)`` with the
labels as last column (`pack_labels`), so that training and validation see one tensor; or
pass ``labels=`` to `ShapeFlow.log_prob` and `ShapeFlow.sample`.

A chiral molecule's conformers all have one hand, which a reflection-invariant density
cannot tell from its mirror image: it puts half its mass there. With ``hand`` (d + 1 points,
`grassflow.data.molecule_files.find_hand`) the model is restricted to the data's hand
exactly: ``2 p(x)`` where the hand's signed volume is positive, 0 on the mirror images (p is
reflection invariant, so this integrates to one), and samples of the wrong hand are
reflected.

References:
    Klein, Krämer, Noé. Equivariant Flow Matching. NeurIPS 2023, arXiv:2306.15030.
    Satorras, Hoogeboom, Welling. E(n) Equivariant Graph Neural Networks. ICML 2021.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torchdiffeq import odeint

from ..distributions.harmonic import harmonic_covariance
from ..manifolds.shape_paths import GEOMETRIES
from ..manifolds.shape_space import helmert_basis
from ..nn.egnn import EGNNField

__all__ = ["ShapeFlow", "ShapeFlowConfig", "pack_labels"]

COUPLINGS = ("independent", "ot", "equivariant-ot")  # of `grassflow.training.shape_matching`
PRIORS = ("gaussian", "harmonic")


@dataclass(frozen=True)
class ShapeFlowConfig:
    """Everything that defines a shape model, in one serializable record (`to_dict`,
    `from_dict`); `ShapeFlow.from_config` builds the model.

    Attributes:
        n_points, dim: the clouds' n and d.
        geometry: of the flow-matching paths (`grassflow.manifolds.shape_paths`):
            ``"cartesian"`` (straight lines between aligned clouds, EFM's) or
            ``"grassmann"`` (span and metric each on their own geodesic).
        coupling: of the flow-matching pairs: ``"equivariant-ot"``, ``"ot"`` or
            ``"independent"``.
        hidden, layers, attention, coord_range: the `EGNNField`'s.
        prior_std: sigma of the CoM-free Gaussian prior (refitted to the data by training).
        atol, rtol: dopri5's, of the exact likelihood and of sampling.
        chunk_size: clouds per ODE solve.
        labels, n_labels: per-point integer labels (atom types) of the field, or None;
            ``n_labels`` without ``labels``: the labels are given per cloud (`pack_labels`).
        bonds, bond_orders: a molecule's bond graph, ``((i, j), ...)`` and its orders
            (`grassflow.data.molecule_files.BOND_ORDERS`), edge features of the field; or None.
        prior: ``"gaussian"`` (isotropic) or ``"harmonic"`` (from the bond graph).
        hand: d + 1 point indices (a centre, then d neighbours) whose signed volume
            ``det[x_j - x_c]`` is positive on the data: the density keeps that hand only
            (a chiral molecule); None: both hands.
    """

    n_points: int
    dim: int
    geometry: str = "cartesian"
    coupling: str = "equivariant-ot"
    hidden: int = 32
    layers: int = 3
    attention: bool = True
    coord_range: float = 10.0
    prior_std: float = 1.0
    atol: float = 1e-5
    rtol: float = 1e-5
    chunk_size: int = 16
    labels: tuple[int, ...] | None = None
    n_labels: int | None = None
    bonds: tuple[tuple[int, int], ...] | None = None
    bond_orders: tuple[float, ...] | None = None
    prior: str = "gaussian"
    hand: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.geometry not in GEOMETRIES:
            raise ValueError(f"geometry must be one of {GEOMETRIES}, got {self.geometry!r}")
        if self.coupling not in COUPLINGS:
            raise ValueError(f"coupling must be one of {COUPLINGS}, got {self.coupling!r}")
        if self.prior not in PRIORS:
            raise ValueError(f"prior must be one of {PRIORS}, got {self.prior!r}")
        if self.prior == "harmonic" and self.bonds is None:
            raise ValueError("prior='harmonic' needs the molecule's bonds")
        if self.labels is not None:
            object.__setattr__(self, "labels", tuple(int(a) for a in self.labels))
        elif self.n_labels is not None and (self.bonds is not None or self.hand is not None):
            raise ValueError("labels given per cloud (n_labels without labels) cannot have "
                             "one molecule's bonds or hand")  # fmt: skip
        if self.bonds is not None:  # JSON gives lists
            object.__setattr__(self, "bonds", tuple((int(i), int(j)) for i, j in self.bonds))
        if self.bond_orders is not None:
            object.__setattr__(self, "bond_orders", tuple(float(o) for o in self.bond_orders))
        if self.hand is not None:
            object.__setattr__(self, "hand", tuple(int(i) for i in self.hand))
            if len(self.hand) != self.dim + 1 or len(set(self.hand)) != self.dim + 1 or not all(
                    0 <= i < self.n_points for i in self.hand):  # fmt: skip
                raise ValueError(f"hand must be {self.dim + 1} distinct point indices in "
                                 f"0..{self.n_points - 1}, got {self.hand}")  # fmt: skip

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ShapeFlowConfig:
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown ShapeFlowConfig fields: {sorted(unknown)}")
        return cls(**d)


class ShapeFlow(nn.Module):
    """Normalized density on clouds of ``n_points`` points in R^``dim`` (any translation).

    Args:
        n_points: n, points per cloud (>= 2).
        dim: d, their dimension.
        hidden: width of the `EGNNField`.
        layers: message-passing layers of the `EGNNField`.
        attention: message gating of the `EGNNField`.
        coord_range: per-layer displacement bound of the `EGNNField`.
        prior_std: sigma of the CoM-free Gaussian prior (refitted by `fit_prior`).
        atol: absolute dopri5 tolerance of `log_prob` and `sample`.
        rtol: relative dopri5 tolerance (as atol).
        chunk_size: clouds per ODE solve; bounds the memory of the exact divergence
            ((n - 1) d forward-mode products at once).
        labels: optional ``(n,)`` integer point labels of the `EGNNField` (e.g. atomic
            numbers); None keeps the unlabelled model.
        n_labels: number of label values (as in the `EGNNField`); without ``labels``, every
            cloud gives its own labels (the conditional density ``p(x | a)``).
        geometry: of the flow-matching paths that train it (`ShapeFlowConfig`).
        coupling: of the flow-matching pairs (`ShapeFlowConfig`).
        bonds: optional ``(B, 2)`` bonded point pairs of a molecule: edge features of the
            `EGNNField`, and the harmonic prior's graph.
        bond_orders: optional ``(B,)`` orders of those bonds.
        prior: ``"gaussian"`` or ``"harmonic"`` (needs ``bonds``).
        hand: optional d + 1 point indices: keep only the data's hand (`ShapeFlowConfig`).

    ``model.config`` is the `ShapeFlowConfig` it was built from (``prior_std`` as given;
    the fitted value is the buffer ``model.prior_std``).
    """

    @classmethod
    def from_config(cls, config: ShapeFlowConfig | dict) -> ShapeFlow:
        """The model of ``config`` (a `ShapeFlowConfig` or its ``to_dict``)."""
        if isinstance(config, dict):
            config = ShapeFlowConfig.from_dict(config)
        kw = config.to_dict()
        tensors = {k: None if v is None else torch.tensor(v)
                   for k in ("labels", "bonds", "bond_orders") for v in [kw.pop(k)]}  # fmt: skip
        return cls(**kw, **tensors)

    def __init__(
        self,
        n_points: int,
        dim: int,
        hidden: int = 32,
        layers: int = 3,
        attention: bool = True,
        coord_range: float = 10.0,
        prior_std: float = 1.0,
        atol: float = 1e-5,
        rtol: float = 1e-5,
        chunk_size: int = 16,
        labels: Tensor | None = None,
        n_labels: int | None = None,
        geometry: str = "cartesian",
        coupling: str = "equivariant-ot",
        bonds: Tensor | None = None,
        bond_orders: Tensor | None = None,
        prior: str = "gaussian",
        hand: tuple[int, ...] | None = None,
    ):
        super().__init__()
        listed = lambda a: None if a is None else tuple(torch.as_tensor(a).tolist())
        self.config = ShapeFlowConfig(
            n_points, dim, geometry, coupling, hidden, layers, attention, coord_range,
            float(prior_std), atol, rtol, chunk_size, listed(labels), n_labels, listed(bonds),
            listed(bond_orders), prior, listed(hand),
        )  # fmt: skip
        if not (isinstance(chunk_size, int) and chunk_size >= 1):
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        if not (atol > 0 and rtol > 0):
            raise ValueError(f"atol and rtol must be > 0, got {atol!r}, {rtol!r}")
        self.field = EGNNField(n_points, dim, hidden, layers, attention, coord_range, labels,
                               n_labels, bonds, bond_orders)  # fmt: skip
        self.n_points, self.dim, self.chunk_size = n_points, dim, chunk_size
        self.atol, self.rtol = atol, rtol
        # float64 until the module is cast; used in the dtype of the clouds
        self.register_buffer("H", helmert_basis(n_points))
        self.register_buffer("prior_std", torch.tensor(float(prior_std), dtype=torch.float64))
        self.prior = prior
        if prior == "harmonic":  # Sigma = C C^T; rebuilt from the config, so not saved
            C = torch.linalg.cholesky(harmonic_covariance(self.field.bonds, n_points))
            self.register_buffer("prior_factor", C, persistent=False)
        hand = self.config.hand  # rebuilt from the config, so not saved
        self.register_buffer("hand", None if hand is None else torch.tensor(hand),
                             persistent=False)  # fmt: skip
        self.last_stats: dict = {}

    @property
    def dtype(self) -> torch.dtype:
        """The model's floating dtype (that of its parameters; inputs must match it)."""
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        """The model's device (that of its parameters; inputs must be on it)."""
        return next(self.parameters()).device

    @property
    def labels(self) -> Tensor | None:
        """The ``(n,)`` point labels of the field, or None."""
        return self.field.labels

    @property
    def labels_per_cloud(self) -> bool:
        """Whether every cloud gives its own labels (`pack_labels`): the model is ``p(x | a)``."""
        return self.field.labels_per_cloud

    @property
    def bonds(self) -> Tensor | None:
        """The ``(B, 2)`` bond graph of the field and the prior, or None."""
        return self.field.bonds

    @property
    def event_dim(self) -> int:
        """(n - 1) d, the dimension of the CoM-free coordinates."""
        return (self.n_points - 1) * self.dim

    def extra_repr(self) -> str:
        return (f"n_points={self.n_points}, dim={self.dim}, "
                f"prior_std={self.prior_std.item():.4g}, atol={self.atol:g}, rtol={self.rtol:g}, "
                f"chunk_size={self.chunk_size}")  # fmt: skip

    # ------------------------------------------------------------ coordinates
    def _check(self, P: Tensor, dtype: bool = True) -> None:
        """Raise a ``ValueError`` unless ``P`` is a non-empty ``(B, n, d)`` batch of finite
        clouds, in the model's dtype and on its device (unless not ``dtype``)."""
        if not isinstance(P, Tensor) or P.dim() != 3 or P.shape[1:] != (self.n_points, self.dim):
            shape = tuple(P.shape) if isinstance(P, Tensor) else type(P).__name__
            raise ValueError(f"P must be (B, {self.n_points}, {self.dim}) clouds, got {shape}")
        if dtype and (P.dtype != self.dtype or P.device != self.device):
            raise ValueError(f"P is {P.dtype} on {P.device}, but the model is {self.dtype} on "
                             f"{self.device}; convert with .to() first")  # fmt: skip
        if P.shape[0] == 0 or not torch.isfinite(P).all():
            raise ValueError(f"P must be a non-empty batch of finite clouds, got {tuple(P.shape)}")

    def split_labels(self, P: Tensor, labels: Tensor | None = None,
                     dtype: bool = True) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        """Checked clouds ``(B, n, d)`` and, for a model with labels per cloud, their checked
        labels ``(B, n)`` (int64): ``labels`` (``(B, n)`` or ``(n,)`` for all), else the last
        column of packed clouds ``P: (B, n, d + 1)`` (`pack_labels`). Raises a ``ValueError``
        for labels the model does not take, or none where it needs them."""
        if not self.labels_per_cloud:
            if labels is not None:
                raise ValueError("this model has no per-cloud labels: pass labels=None")
            self._check(P, dtype)
            return P, None
        if labels is None:
            if not isinstance(P, Tensor) or P.dim() != 3 or P.shape[-1] != self.dim + 1:
                shape = tuple(P.shape) if isinstance(P, Tensor) else type(P).__name__
                raise ValueError(f"this model takes each cloud's labels: pass labels= or packed "
                                 f"clouds (B, {self.n_points}, {self.dim + 1}) (pack_labels), "
                                 f"got {shape}")  # fmt: skip
            P, labels = P[..., : self.dim], P[..., self.dim]
        self._check(P, dtype)
        return P, self._check_labels(labels, P.shape[0], P.device)

    def _check_labels(self, labels: Tensor, B: int, device: torch.device) -> Tensor:
        """``(B, n)`` int64 labels on ``device`` from ``(B, n)`` or ``(n,)`` integral values in
        ``0..n_labels - 1``; else a ``ValueError``."""
        labels = torch.as_tensor(labels, device=device)
        n, k = self.n_points, self.field.n_labels
        if labels.shape not in ((n,), (B, n)):
            raise ValueError(f"labels must be ({B}, {n}) or ({n},), got {tuple(labels.shape)}")
        if labels.is_floating_point() or labels.is_complex():
            if not torch.equal(labels, labels.round()):
                raise ValueError("labels must be integers (the packed column is not)")
        if ((labels < 0) | (labels >= k)).any():
            raise ValueError(f"labels must lie in 0..{k - 1}, got {labels.min()}..{labels.max()}")
        return labels.long().expand(B, n)

    def helmert(self, P: Tensor) -> Tensor:
        """CoM-free coordinates ``z = H^T (P - mean): (B, n - 1, d)`` of clouds ``(B, n, d)``."""
        self._check(P)
        return self.H.to(P).mT @ (P - P.mean(dim=-2, keepdim=True))

    def clouds(self, z: Tensor) -> Tensor:
        """Centred clouds ``H z: (..., n, d)`` of CoM-free coordinates ``z: (..., n - 1, d)``."""
        return self.H.to(z) @ z

    @torch.no_grad()
    def fit_prior(self, P: Tensor) -> float:
        """Set sigma to the maximum-likelihood scale of the clouds ``P: (N, n, d)`` (any
        dtype): the root mean square of their CoM-free coordinates, computed in the dtype of
        ``H`` (float64 unless the model was cast); packed clouds are fine. Returns it."""
        P = self.split_labels(P, dtype=False)[0].to(self.H)
        z = self._whiten(self.H.mT @ (P - P.mean(dim=-2, keepdim=True)))
        self.prior_std.fill_(z.square().mean().sqrt().item())
        return self.prior_std.item()

    # ------------------------------------------------------------ the flow
    def velocity(self, t: Tensor, z: Tensor, labels: Tensor | None = None) -> Tensor:
        """``dz/dt = H^T v(t, H z)``: ``(..., n - 1, d)``; t is scalar or ``(...)``; the
        clouds' ``labels: (..., n)`` for a model with labels per cloud."""
        H = self.H.to(z)
        return H.mT @ self.field(t, H @ z, labels)

    def _velocity_and_divergence(
        self, t: Tensor, z: Tensor, labels: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Velocity and its exact divergence ``(B,)``: one forward-mode product per
        coordinate direction, batched with ``vmap``."""
        B = z.shape[0]
        basis = torch.eye(self.event_dim, dtype=z.dtype, device=z.device)
        basis = basis.reshape(-1, 1, self.n_points - 1, self.dim).expand(-1, B, -1, -1)
        f = lambda y: self.velocity(t, y, labels)
        v, Jv = torch.func.vmap(lambda e: torch.func.jvp(f, (z,), (e,)))(basis.contiguous())
        div = (Jv * basis).sum(dim=(0, -2, -1))
        return v[0], div

    def _whiten(self, z: Tensor) -> Tensor:
        """``C^{-1} z`` for the harmonic prior's ``Sigma = C C^T``; z itself otherwise."""
        if self.prior == "gaussian":
            return z
        C = self.prior_factor.to(z)
        return torch.linalg.solve_triangular(C, z, upper=False)

    def scale_prior(self, eps: Tensor) -> Tensor:
        """Prior draws ``z: (..., n - 1, d)`` from standard normal ``eps`` of the same shape:
        ``sigma eps``, or ``sigma C eps`` for the harmonic prior."""
        z = eps * self.prior_std.to(eps)
        return z if self.prior == "gaussian" else self.prior_factor.to(eps) @ z

    def prior_log_prob(self, z: Tensor) -> Tensor:
        """Log-density of the normalized CoM-free prior at ``z: (B, n - 1, d)`` -> ``(B,)``."""
        var = self.prior_std.to(z).square()
        lp = -0.5 * self.event_dim * torch.log(2 * math.pi * var) - self._whiten(z).square().sum(
            (-2, -1)) / (2 * var)  # fmt: skip
        if self.prior == "harmonic":  # log det(Sigma ⊗ I_d)^{-1/2}
            lp = lp - self.dim * self.prior_factor.to(z).diagonal().log().sum()
        return lp

    def _solve(self, z: Tensor, t0: float, t1: float, divergence: bool,
               labels: Tensor | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
        nfe = 0
        a0 = torch.zeros(z.shape[0], dtype=z.dtype, device=z.device)

        def dynamics(t: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
            nonlocal nfe
            nfe += 1
            if divergence:
                return self._velocity_and_divergence(t, state[0], labels)
            return self.velocity(t, state[0], labels), torch.zeros_like(state[1])

        times = torch.tensor([t0, t1], dtype=z.dtype, device=z.device)
        zs, a = odeint(dynamics, (z, a0), times, method="dopri5", atol=self.atol, rtol=self.rtol)
        self.last_stats = {"nfe": nfe}
        return zs[-1], a[-1]

    # ------------------------------------------------------------ densities
    def log_prob(self, P: Tensor, labels: Tensor | None = None) -> Tensor:
        """Exact log-density of clouds ``P: (B, n, d)`` -> ``(B,)``, in nats per cloud, w.r.t.
        Lebesgue measure on the (n - 1) d CoM-free coordinates; ``chunk_size`` clouds per
        solve. Differentiable (through the solver) unless called under ``no_grad``. A model
        with labels per cloud gives ``log p(x | a)`` of packed clouds ``(B, n, d + 1)`` or of
        ``P`` with ``labels: (B, n)`` (or ``(n,)``).

        A float32 solve can meet a non-finite value (a trial step of dopri5 far off the
        path, in a model trained for long on QM9); such a chunk is solved again in float64,
        and a chunk still not finite raises."""
        P, labels = self.split_labels(P, labels)
        chunks = self.helmert(P).split(self.chunk_size)
        per_chunk = [None] * len(chunks) if labels is None else labels.split(self.chunk_size)
        out = [self._chunk_log_prob(z1, a) for z1, a in zip(chunks, per_chunk)]
        return self._keep_hand(P, torch.cat(out))

    def handedness(self, P: Tensor) -> Tensor:
        """The signed volume ``det[P_j - P_c]`` ``(B,)`` of the ``hand`` points of clouds
        ``P: (B, n, d)``: positive on the data's hand, negative on its mirror images."""
        if self.hand is None:
            raise ValueError("this model keeps both hands (hand=None)")
        return torch.linalg.det(P[..., self.hand[1:], :] - P[..., self.hand[:1], :])

    def _keep_hand(self, P: Tensor, log_p: Tensor) -> Tensor:
        """``log_p + log 2`` on the data's hand, ``-inf`` on the mirror images (no ``hand``:
        ``log_p``)."""
        if self.hand is None:
            return log_p
        return torch.where(self.handedness(P) > 0, log_p + math.log(2.0),
                           torch.full_like(log_p, -math.inf))  # fmt: skip

    def _to_hand(self, X: Tensor) -> Tensor:
        """Clouds ``X: (B, n, d)`` with the mirror images reflected (first axis) into the
        data's hand (no ``hand``: ``X``)."""
        if self.hand is None:
            return X
        mirror = torch.ones(self.dim, dtype=X.dtype, device=X.device)
        mirror[0] = -1.0
        return torch.where((self.handedness(X) < 0)[:, None, None], X * mirror, X)

    def _chunk_log_prob(self, z1: Tensor, labels: Tensor | None = None) -> Tensor:
        try:
            z0, a = self._solve(z1, 1.0, 0.0, divergence=True, labels=labels)
            lp = self.prior_log_prob(z0) + a  # a(0) = -int_0^1 div v dt
            if torch.isfinite(lp).all():
                return lp
        except AssertionError:  # torchdiffeq's check of a non-finite state
            pass
        if z1.dtype == torch.float64:
            raise FloatingPointError("the exact log-likelihood is not finite for some clouds")
        warnings.warn("a float32 likelihood solve was not finite: solved again in float64",
                      stacklevel=3)
        # on a float64 twin, not by recasting this module (which the caller holds, perhaps in
        # another thread or an optimizer) in the middle of the call; its parameters are
        # float64 casts of ours, so gradients still reach ours
        twin = copy.deepcopy(self)
        tensors = {f"model.{name}": x.double() if x.is_floating_point() else x
                   for name, x in (*self.named_parameters(), *self.named_buffers())}  # fmt: skip
        try:
            lp = torch.func.functional_call(_ChunkLogProb(twin), tensors, (z1.double(), labels))
        finally:
            self.last_stats = twin.last_stats
        return lp.to(z1.dtype)

    def forward(self, P: Tensor, labels: Tensor | None = None) -> Tensor:
        """Alias of `log_prob`."""
        return self.log_prob(P, labels)

    # ------------------------------------------------------------ sampling
    def sample_prior(self, m: int, generator: torch.Generator | None = None) -> Tensor:
        """``m`` centred clouds ``(m, n, d)`` from the prior (CPU generator: drawn on CPU)."""
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise ValueError(f"number of samples must be an integer >= 1, got {m!r}")
        z = torch.randn(m, self.n_points - 1, self.dim, dtype=self.dtype, generator=generator)
        return self.clouds(self.scale_prior(z.to(self.device)))

    def _sample_labels(self, m: int, labels: Tensor | None) -> list[Tensor | None]:
        """The checked labels of ``m`` samples, per chunk (all None without per-cloud labels)."""
        if labels is None and not self.labels_per_cloud:
            return [None] * math.ceil(m / self.chunk_size)
        if labels is None:
            raise ValueError("this model samples given labels: pass labels=(m, n) or (n,)")
        if not self.labels_per_cloud:
            raise ValueError("this model has no per-cloud labels: pass labels=None")
        return list(self._check_labels(labels, m, self.device).split(self.chunk_size))

    def sample(self, m: int, generator: torch.Generator | None = None,
               labels: Tensor | None = None) -> Tensor:  # fmt: skip
        """``m`` centred clouds ``(m, n, d)``: prior samples carried by the flow to t = 1;
        given ``labels: (m, n)`` or ``(n,)`` for a model with labels per cloud."""
        with torch.no_grad():
            x0 = self.sample_prior(m, generator)
            chunks = zip((self.H.to(x0).mT @ x0).split(self.chunk_size),
                         self._sample_labels(m, labels))  # fmt: skip
            z = [self._solve(c, 0.0, 1.0, divergence=False, labels=a)[0] for c, a in chunks]
            return self._to_hand(self.clouds(torch.cat(z)))

    def sample_with_log_prob(
        self, m: int, generator: torch.Generator | None = None, labels: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``m`` samples ``(m, n, d)`` and their exact log-density ``(m,)``, from one forward
        solve with the divergence (for importance weights); ``labels`` as in `sample`."""
        with torch.no_grad():
            x0 = self.sample_prior(m, generator)
            z0 = self.H.to(x0).mT @ x0
            zs, logps = [], []
            for c, lab in zip(z0.split(self.chunk_size), self._sample_labels(m, labels)):
                z1, a = self._solve(c, 0.0, 1.0, divergence=True, labels=lab)  # a(1) = int div
                zs.append(z1)
                logps.append(self.prior_log_prob(c) - a)
            # the reflected ones keep their density: p is reflection invariant
            X = self._to_hand(self.clouds(torch.cat(zs)))
            return X, self._keep_hand(X, torch.cat(logps))


class _ChunkLogProb(nn.Module):
    """``model._chunk_log_prob`` as a forward (for ``torch.func.functional_call``)."""

    def __init__(self, model: ShapeFlow):
        super().__init__()
        self.model = model

    def forward(self, z: Tensor, labels: Tensor | None) -> Tensor:
        return self.model._chunk_log_prob(z, labels)


def pack_labels(P: Tensor, labels: Tensor) -> Tensor:
    """Clouds ``P: (B, n, d)`` with their integer ``labels: (B, n)`` (or ``(n,)`` for all)
    as a last column: ``(B, n, d + 1)``, in P's dtype, the form a model with labels per cloud
    trains on (`ShapeFlow.split_labels` takes it apart)."""
    labels = torch.as_tensor(labels, device=P.device)
    if labels.is_floating_point() or labels.shape not in (P.shape[1:2], P.shape[:2]):
        raise ValueError(f"labels must be integers of shape {tuple(P.shape[:2])} or "
                         f"{tuple(P.shape[1:2])}, got {labels.dtype} "
                         f"{tuple(labels.shape)}")  # fmt: skip
    return torch.cat([P, labels.expand(P.shape[:2]).to(P.dtype)[..., None]], dim=-1)
