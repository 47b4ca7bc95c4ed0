r"""The two-part shape model: a GrCNF on the clouds' spans times a density of their Gram matrix
given the span, each part trained on its own (`TwoPartShapeFlow`, `train_shape_flow`).

This is the paper's model (GrCNF + scale) made exact, and the diagnosis model of the
vs-E-NF comparison (its "ShapeFlow" rows). It is kept here only to reproduce the paper's QM9
table (`qm9_runs`) and those diagnosis rows (`vs_enf`): it lost to one flow on the whole
cloud in every measured row, so it left the library in issue 34 (it was
``grassflow.flows.ShapeFlow``, ``grassflow.training.train_shape_flow`` and
``grassflow.nn.gram``; the last library commit with it is 3531f93). The library's shape model
is that one flow on the cloud, now named `grassflow.flows.ShapeFlow`.

A cloud ``P: (n, d)`` is centred and written in the Helmert basis H of 1-perp,
``P' = H^T P: (n - 1, d)``, the CoM-free coordinates that E-NF's densities live on (H has
orthonormal columns, so Lebesgue measure on P' is that of the centred subspace). Then
``P' = Y B`` with [Y] in Gr(d, n - 1) and ``S = B B^T``, and

$$
\log p(P') = \log p_{Gr}([Y]) + \log p(S \mid Y) - \tfrac{d^2}{2}\log\pi
+ \log\Gamma_d(d/2) - \tfrac{n-d-2}{2}\log\det S
$$

(`grassflow.distributions.cartesian.cartesian_log_prob_gram`): a GrCNF on
Gr(d, n - 1) for the subspace and a `WishartGram` (or `DistanceGram`) for S given Y.
With the graph potential or the EGNN field and the uniform prior both parts are invariant
to relabelling the points; the MLP potential (the paper's) and the Gaussian prior are not.

The Cartesian NLL is the sum of the Grassmann part, the Gram part and a term of the data
alone, so each part can be trained (and its checkpoint picked by its validation NLL) on its
own, as the whole would be: `train_shape_flow` trains both, each resumably in its own
directory, and `load_shape_flow` loads them back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from grassflow.distributions.cartesian import log_jacobian_gram, random_orthogonal
from grassflow.flows import GrCNF
from grassflow.manifolds import Grassmann
from grassflow.manifolds.shape_space import helmert_basis, shape_factor
from grassflow.nn import PAPER_WIDTHS, EGNNField, GrassmannField, Potential
from grassflow.nn.graph import GraphPotential
from grassflow.training import OBJECTIVES, TrainConfig, TrainResult, train
from grassflow.training.checkpoint import checkpoint_path, load_checkpoint
from grassflow.training.progress import Progress

from .gram_densities import DistanceGram, WishartGram, metric_fit
from .span_fields import PointCloudField

__all__ = [
    "DEFAULT_LAYERS", "GRAMS", "POTENTIALS", "DistanceGram", "GramTerm", "PointCloudField",
    "TwoPartShapeFlow", "WishartGram", "build_field", "build_gram", "load_shape_flow",
    "metric_fit", "nll_summary", "preset_field_options", "split_budget", "train_shape_flow",
]  # fmt: skip

POTENTIALS = ("graph", "mlp", "egnn")
DEFAULT_LAYERS = {"graph": 2, "mlp": 2, "egnn": 3}  # message-passing layers (the MLP has none)
GRAMS = {"wishart": WishartGram, "distance": DistanceGram}  # densities of S given the span


def build_field(
    n_points: int,
    dim: int,
    kind: str = "graph",
    labels: Tensor | None = None,
    *,
    hidden: int | None = None,
    layers: int | None = None,
    widths: tuple[int, ...] | None = None,
) -> nn.Module:
    """A horizontal, O(k)-equivariant field on Gr(``dim``, ``n_points`` - 1) for a
    `TwoPartShapeFlow`.

    Args:
        n_points: the clouds' n.
        dim: the clouds' d.
        kind: ``"graph"``: the gradient of a permutation-invariant message-passing potential
            (`GraphPotential`); ``"egnn"``: not a gradient, an EGNN's
            velocity on the span's whitened points made horizontal
            (`PointCloudField`); ``"mlp"``: the gradient of the paper's
            HorP + ConcatSquash potential (not invariant to relabelling).
        labels: optional ``(n,)`` integer point labels (atom types), seen by graph and EGNN.
        hidden: the graph's or EGNN's width (default 32).
        layers: the graph's or EGNN's message-passing layers (default `DEFAULT_LAYERS`).
        widths: the MLP's hidden widths (default the paper's LJ13 ones, 32-32-32).
    """
    if kind not in POTENTIALS:
        raise ValueError(f"field must be one of {POTENTIALS} or an nn.Module, got {kind!r}")
    layers = DEFAULT_LAYERS[kind] if layers is None else layers
    width = 32 if hidden is None else int(hidden)
    if kind == "graph":
        return GrassmannField(GraphPotential(n_points, dim, width, layers, labels))
    if kind == "egnn":
        return PointCloudField(EGNNField(n_points, dim, width, layers, labels=labels), n_points)
    widths = PAPER_WIDTHS["lj13"] if widths is None else tuple(widths)
    return GrassmannField(Potential(n_points - 1, dim, widths))


def preset_field_options(kind: str, hidden=None, layers: int | None = None) -> dict:
    """`build_field`'s options from an experiment preset's ``hidden`` and ``layers``;
    presets keep one ``hidden`` field, the MLP's widths for ``"mlp"``, so saved runs load."""
    if kind == "mlp":
        return {"widths": None if hidden is None else tuple(hidden)}
    return {"hidden": hidden, "layers": layers}


def build_gram(
    n_points: int,
    dim: int,
    kind: str = "wishart",
    labels: Tensor | None = None,
    *,
    hidden: int = 32,
    layers: int = 1,
    components: int = 1,
) -> nn.Module:
    """A density of S given the span for a `TwoPartShapeFlow`: ``"wishart"``
    (`WishartGram`) or ``"distance"`` (`DistanceGram`: a log-normal around a least-squares
    fit of learned pair distances, with per-pair precisions), a mixture of ``components``,
    conditioned by a network of ``hidden`` width and ``layers`` layers."""
    if kind not in GRAMS:
        raise ValueError(f"gram must be one of {tuple(GRAMS)} or an nn.Module, got {kind!r}")
    return GRAMS[kind](n_points, dim, hidden, layers, labels, components=components)


class TwoPartShapeFlow(nn.Module):
    """Normalized density on clouds of ``n_points`` points in R^``dim`` (any translation).

    It composes a `GrCNF` on Gr(d, n - 1) for the clouds' spans (``self.flow``) and a
    density of S given the span (``self.gram``). Pass each ready-made, or by name with its
    options.

    Args:
        n_points: n, points per cloud (``n >= dim + 2``).
        dim: d, their dimension.
        field: the GrCNF's field: a name for `build_field` (``"graph"``, default,
            ``"egnn"`` or ``"mlp"``) or a horizontal, O(d)-equivariant ``nn.Module`` on
            Gr(d, n - 1).
        gram: the density of S given the span: a name for `build_gram` (``"wishart"``,
            default, or ``"distance"``) or a module with ``log_prob(S, Y)``,
            ``sample(Y, generator)`` and ``initialize(S, Y)``.
        labels: optional ``(n,)`` integer point labels shared by all clouds (atom types of one
            molecule), seen by the named graph or EGNN field and by the named Gram densities.
        field_options: keyword arguments of `build_field` (``hidden``, ``layers``,
            ``widths``).
        gram_options: keyword arguments of `build_gram` (``hidden``, ``layers``,
            ``components``).
        chunk_size: clouds per ODE solve in `log_prob` and `sample`; bounds the
            peak memory of the exact divergence (k(D - k) Hessian-vector products at once).
        flow: a ready `GrCNF` on Gr(d, n - 1) instead of ``field`` and
            ``flow_options``.
        **flow_options: keyword arguments of `GrCNF` (``prior``, ``sigma``, ``T``,
            ``train_T``, ``divergence``, ``method``, ``atol``, ``rtol``, ...). Defaults here:
            ``prior="uniform"`` (invariant to relabelling), and for the Gaussian prior mean
            ``I_{D,d}`` and covariances ``sigma^2 I``.
    """

    def __init__(
        self,
        n_points: int,
        dim: int,
        field: str | nn.Module = "graph",
        gram: str | nn.Module = "wishart",
        *,
        labels: Tensor | None = None,
        field_options: dict | None = None,
        gram_options: dict | None = None,
        chunk_size: int = 16,
        flow: GrCNF | None = None,
        **flow_options: Any,
    ):
        super().__init__()
        if not (isinstance(n_points, int) and isinstance(dim, int) and 1 <= dim <= n_points - 2):
            raise ValueError(
                f"a density on centred clouds of n points in d dimensions needs n >= d + 2, "
                f"got n_points={n_points}, dim={dim}"
            )
        if not (isinstance(chunk_size, int) and chunk_size >= 1):
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        self.n_points, self.dim, self.chunk_size = n_points, dim, chunk_size
        D, k = n_points - 1, dim
        if flow is not None:
            if flow_options or field_options or not isinstance(field, str) or field != "graph":
                raise ValueError("pass either a ready `flow` or `field`, `field_options` and "
                                 "GrCNF keyword arguments, not both")  # fmt: skip
            if not isinstance(flow, GrCNF) or (flow.manifold.k, flow.manifold.D) != (k, D):
                raise ValueError(f"flow must be a GrCNF on Gr({k}, {D}), got {flow!r}")
            self.flow = flow
        else:
            if isinstance(field, str):
                field = build_field(n_points, dim, field, labels, **(field_options or {}))
            elif field_options:
                raise ValueError("field_options apply to a field given by name")
            sigma = flow_options.pop("sigma", 0.3)
            flow_options = {"prior": "uniform", "prior_mean": torch.eye(D, k),
                            "row_cov": sigma**2 * torch.eye(D),
                            "col_cov": sigma**2 * torch.eye(k), **flow_options}  # fmt: skip
            self.flow = GrCNF(Grassmann(k, D), field, sigma=sigma, **flow_options)
        if isinstance(gram, str):
            gram = build_gram(n_points, dim, gram, labels, **(gram_options or {}))
        elif gram_options:
            raise ValueError("gram_options apply to a Gram density given by name")
        self.gram = gram
        self.register_buffer("H", helmert_basis(n_points))  # float64; used in P's dtype

    def extra_repr(self) -> str:
        return f"n_points={self.n_points}, dim={self.dim}, chunk_size={self.chunk_size}"

    @property
    def manifold(self) -> Grassmann:
        return self.flow.manifold

    @property
    def dtype(self) -> torch.dtype:
        """The model's floating dtype; clouds must match it."""
        return self.flow.dtype

    @property
    def device(self) -> torch.device:
        """The model's device."""
        return self.flow.device

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
        """The parts of `log_prob`, each ``(B,)``: ``grassmann`` (log p_Gr([Y])),
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
        """Alias of `log_prob`."""
        return self.log_prob(P)

    # ------------------------------------------------------------ sampling
    def sample(self, m: int, generator: torch.Generator | None = None) -> Tensor:
        """``m`` centred clouds ``(m, n, d)``, each in a Haar-random orientation (no graph)."""
        with torch.no_grad():
            Y = torch.cat([self.flow.sample(c, generator) for c in _chunks(m, self.chunk_size)])
            return self.sample_given(Y, generator)

    def sample_with_log_prob(
        self, m: int, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """``m`` clouds ``(m, n, d)`` and their exact log-density ``(m,)``: the span's from
        the flow's forward solve with the divergence, the Gram and Jacobian terms at the
        drawn cloud's factors (as `log_prob_terms` computes them; no second ODE solve)."""
        with torch.no_grad():
            drawn = [self.flow.sample_with_log_prob(c, generator)
                     for c in _chunks(m, self.chunk_size)]  # fmt: skip
            Y = torch.cat([y for y, _ in drawn])
            P = self.sample_given(Y, generator)
            Yc, S = self.factor(P)
            jac = log_jacobian_gram(torch.diagonal(S, dim1=-2, dim2=-1), self.n_points - 1)
            return P, torch.cat([lp for _, lp in drawn]) + self.gram.log_prob(S, Yc) + jac

    def sample_given(
        self, Y: Tensor, generator: torch.Generator | None = None, S: Tensor | None = None
    ) -> Tensor:
        """Centred clouds ``(B, n, d)`` with the given spans ``Y: (B, n - 1, d)`` (orthonormal
        representatives): S from the Gram density (or the given ``S: (B, d, d)``, SPD, in Y's
        frame), a Haar-random orientation. With the spans of real clouds this isolates what
        the Gram density does to the samples."""
        with torch.no_grad():
            if S is None:
                S = self.gram.sample(Y, generator)
            elif S.shape != (*Y.shape[:-2], self.dim, self.dim):
                raise ValueError(
                    f"S must have shape {(*Y.shape[:-2], self.dim, self.dim)} "
                    f"for Y of shape {tuple(Y.shape)}, got {tuple(S.shape)}"
                )
            R = random_orthogonal(Y.shape[:-2], self.dim, generator=generator, dtype=Y.dtype,
                                  device=Y.device)  # fmt: skip
            return self.H.to(Y) @ (Y @ torch.linalg.cholesky(S) @ R)


def _chunks(m: int, size: int) -> list[int]:
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"number of samples must be an integer >= 1, got {m!r}")
    return [min(size, m - i) for i in range(0, m, size)]


class GramTerm(nn.Module):
    """``log_prob(P)`` = the Gram density's term of `TwoPartShapeFlow.log_prob` (for training
    it alone by maximum likelihood; it holds no flow parameters)."""

    def __init__(self, model: TwoPartShapeFlow):
        super().__init__()
        self.gram = model.gram
        self.register_buffer("H", model.H.clone(), persistent=False)  # follows .to(device)

    def log_prob(self, P: Tensor) -> Tensor:
        Y, lam, _ = shape_factor(self.H.mT @ (P - P.mean(dim=-2, keepdim=True)))
        return self.gram.log_prob(torch.diag_embed(lam), Y)


def train_shape_flow(
    model: TwoPartShapeFlow,
    train_clouds: Tensor,
    val_clouds: Tensor,
    run_dir: str | Path,
    flow: TrainConfig,
    gram: TrainConfig,
    *,
    objective: str = "fm",
    n_val_flow: int | None = None,
    progress: bool | Progress = True,
) -> tuple[TrainResult, TrainResult]:
    """Train (or continue) both parts of ``model``, each resumably in its own directory.

    First the flow on the canonical representatives of the training clouds' spans, by
    ``objective`` (``"fm"``, ``"fm-ot"`` or ``"mle"``) with ``flow``, in ``run_dir/flow``;
    then the Gram density by maximum likelihood (`GramTerm`) with ``gram``, in
    ``run_dir/gram``. A fresh Gram density first takes the training clouds' mean scale
    (its ``initialize``); a resumed one continues from its checkpoint.

    Args:
        model: the `TwoPartShapeFlow`, in the clouds' dtype; each part is moved in place to
            its configuration's device and dtype.
        train_clouds: ``(N, n, d)`` clouds (any translation).
        val_clouds: ``(M, n, d)`` clouds (any translation).
        run_dir: the run directory (``flow/`` and ``gram/`` are made in it).
        flow: the flow's training configuration.
        gram: the Gram density's training configuration.
        objective: the flow's.
        n_val_flow: validation clouds for the flow's exact NLL (None: all); the Gram density
            is validated on all of them.
        progress: show progress (or a command's `Progress` line, shared by both parts).

    Returns:
        The two parts' `TrainResult`: the flow's, then the Gram density's.
    """
    run_dir = Path(run_dir)
    Y_train, S_train = model.factor(train_clouds)
    Y_val = model.factor(val_clouds[:n_val_flow])[0]
    model.gram.initialize(S_train, Y_train)
    flow_result = train(model.flow, Y_train, flow, run_dir / "flow", val_data=Y_val,
                        objective=OBJECTIVES[objective], resume=True,
                        progress=progress)  # fmt: skip
    gram_result = train(GramTerm(model), train_clouds, gram, run_dir / "gram",
                        val_data=val_clouds, objective=OBJECTIVES["mle"], resume=True,
                        progress=progress)  # fmt: skip
    return flow_result, gram_result


def load_shape_flow(
    model: TwoPartShapeFlow, run_dir: str | Path, which: str = "best"
) -> TwoPartShapeFlow:
    """``model`` with the ``which`` checkpoint of each part trained by
    `train_shape_flow` in ``run_dir`` (cast to ``model``'s dtype), in eval mode."""
    run_dir = Path(run_dir)
    for part, module in (("flow", model.flow), ("gram", model.gram)):
        ckpt = load_checkpoint(checkpoint_path(run_dir / part, which), required=("model",))
        state = ckpt["model"]
        if part == "gram":  # saved from a GramTerm
            state = {k.removeprefix("gram."): v for k, v in state.items()}
        module.load_state_dict(state)
    return model.eval()


def split_budget(
    minutes: float, gram_fraction: float = 0.3, gram_max_minutes: float = 3.0
) -> tuple[float, float]:
    """``(flow, gram)`` minutes of a budget of ``minutes`` for both parts of a
    `TwoPartShapeFlow`: the Gram density gets ``min(gram_max_minutes, gram_fraction *
    minutes)``, the flow the rest. The Gram density has few parameters and converges in far
    fewer steps than the flow; the defaults are those of the DW4 and LJ13 rows of the EGNN
    field (README, issue 22)."""
    if not (minutes > 0 and 0 < gram_fraction < 1 and gram_max_minutes > 0):
        raise ValueError(f"need minutes > 0, 0 < gram_fraction < 1 and gram_max_minutes > 0, "
                         f"got {minutes!r}, {gram_fraction!r}, {gram_max_minutes!r}")  # fmt: skip
    gram = min(gram_max_minutes, gram_fraction * minutes)
    return minutes - gram, gram


def nll_summary(r: dict) -> str:
    """A `TwoPartShapeFlow`'s test NLL and its parts (a one-flow model's alone), from an
    ``eval.json``."""
    total = f"{r['test_nll']:.3f} ± {r['test_nll_sem']:.3f} nats per shape"
    if "test_nll_gram" not in r:
        return total
    return (f"{total} = Grassmann {r['test_nll_grassmann']:.3f} (uniform "
            f"{r['uniform_nll_grassmann']:.3f}) + Gram {r['test_nll_gram']:.3f} + Jacobian "
            f"{r['test_nll_jacobian']:.3f}")  # fmt: skip
