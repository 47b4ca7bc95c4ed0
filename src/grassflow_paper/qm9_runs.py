"""Paper §5.3, QM9 positional, in the com-free protocol with an exact Cartesian likelihood.

A molecule is a centred cloud ``X: (19, 3)`` (Å); in the Helmert basis H of 1-perp it is
``P = H^T X: (18, 3) = Y B`` with [Y] in Gr(3, 18) and the in-span Gram matrix ``S = B B^T``
(`grassflow.manifolds.shape_space.shape_factor`). Two models share one GrCNF on
Gr(3, 18) for [Y] (flow matching by default, or maximum likelihood):

* exact model: a two-part `two_part.TwoPartShapeFlow` ``(19, 3)``, the GrCNF (its ``flow``;
  potential ``"mlp"``, the paper's, by default, or ``"graph"``, invariant to relabelling the
  atoms) and a `WishartGram` for S given Y (its ``gram``), trained
  in two stages (`two_part.train_shape_flow`).
  It is an exact, O(3)-invariant density on the 54-dimensional centred coordinates
  (`TwoPartShapeFlow.log_prob`), on the same space as E-NF's;
* the paper's model: the scale estimator as a `GramDecoder`,
  S' = Y'^T P P^T Y' given a representative Y' = Y Q whose orientation Q is latent (Haar
  prior and posterior), trained on the -ELBO of the paper's appendix
  (`cartesian_elbo`). The flow is the exact model's:
  the GrCNF term of the ELBO does not depend on Q. Besides the -ELBO we report an
  importance-weighted estimate of the same model's NLL.

The paper's protocol is Gr(3, 19) with uncentred coordinates; centred molecules lie on a
measure-zero sub-Grassmannian there, so its densities are not comparable with E-NF's (see
Table 1's paper protocol). We use the com-free Gr(3, 18) for both models. Atom types are not
modelled: generated ``.xyz`` files use ``X``.

A run directory holds ``experiment.json``, ``data.json``, ``flow/``, ``gram/`` and
``decoder/`` (trainer files), ``eval.json`` and ``samples.npy`` / ``samples_paper.npy``.
Runs made before the exact model was the two-part model (with ``scale/``) are refused as another
run (their ``experiment.json`` lacks ``potential``); retrain them with ``force``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from grassflow.data.qm9 import load_qm9_positional
from grassflow.distributions.cartesian import cartesian_elbo, random_orthogonal
from grassflow.flows import GrCNF
from grassflow.manifolds.shape_space import helmert_basis, shape_factor
from grassflow.metrics import closest_pair_fraction, distance_histogram, jsd, mean_sem
from grassflow.nn import PAPER_WIDTHS
from grassflow.nn.scale import GramDecoder, ScaleEstimator
from grassflow.tasks.registry import RunKind
from grassflow.tasks.run_dir import (
    TIMING_KEYS,
    RunMismatch,
    checkpoint_path,
    claim_run_dir,
    data_identity,
    read_preset,
    test_subset,
    training_status,
)
from grassflow.training import OBJECTIVES, TrainConfig, load_checkpoint, train
from grassflow.training.checkpoint import write_json
from grassflow.training.rng import seeded_init

from .two_part import (
    DEFAULT_LAYERS,
    GRAMS,
    POTENTIALS,
    TwoPartShapeFlow,
    load_shape_flow,
    preset_field_options,
    train_shape_flow,
)

__all__ = [
    "RUN_KIND",
    "PAPER", "DecoderModel", "QM9Experiment", "QM9Models", "RunMismatch", "evaluate",
    "load_molecules", "load_run", "run", "sample_molecules", "training_status",
]  # fmt: skip

# paper Table 2: GrCNF reports -ELBO (an upper bound of its NLL), E-NF an NLL
PAPER = {"GrCNF": {"neg_elbo": -85.3, "jsd": 0.005}, "E-NF": {"nll": -70.2, "jsd": 0.006}}
# preset fields added after runs were made: the value those runs had without saying so
ADDED_FIELDS = {"gram_components": 1, "gram": "wishart", "val_every_minutes": 0.5}
N, K = 18, 3  # Helmert coordinates of 19 atoms, 3-D


@dataclass
class QM9Experiment:
    """One QM9 run (com-free, Gr(3, 18)).

    Attributes:
        objective: ``"fm"``, ``"fm-ot"`` or ``"mle"`` for the GrCNF.
        prior: GrCNF base distribution, ``"uniform"`` or ``"gaussian"`` (paper: M = I,
            U = sigma^2 I, V = sigma^2 I, sigma = 0.3).
        potential: the GrCNF's, ``"mlp"`` (the paper's HorP + ConcatSquash MLP),
            ``"graph"`` (message passing on the atoms, invariant to relabelling them) or
            ``"egnn"`` (an EGNN's velocity on the span's whitened points; see
            `TwoPartShapeFlow`).
        hidden: the MLP's widths (paper: 32-32-32).
        graph_hidden, layers: the graph potential's or the EGNN's width and layers (None:
            `DEFAULT_LAYERS`).
        gram, gram_components: the TwoPartShapeFlow's density of S given the span, ``"wishart"``
            or ``"distance"`` (log-normal pair distances), and its mixture components.
        chunk_size: molecules per exact-divergence ODE solve of the TwoPartShapeFlow's
            ``log_prob`` (bounds the memory of evaluation; the graph potential needs small).
        flow_minutes: GrCNF training CPU minutes (resumable).
        scale_minutes: of each scale model, the Gram density and the paper's decoder.
        elbo_samples, iwae_samples: Haar draws per test molecule for the -ELBO (its
            expectation) and for the importance-weighted NLL of the paper's model.
        n_val: validation molecules used for the GrCNF's model selection (an exact ODE per
            molecule; the Gram density and the decoder use all 2,501).
        val_every_minutes: the GrCNF's validation interval in training minutes (flow
            matching; it is also validated at iterations 100, 200, 400, ...).
        n_test: evaluate on a seeded random ``n_test`` test molecules only (None: all
            1,813; the split is ordered by composition, so a prefix would be biased).
        cache_dir: where the processed QM9 split is cached.
        seed: training seed of the models.
    """

    objective: str = "fm"
    prior: str = "uniform"
    sigma: float = 0.3
    potential: str = "mlp"
    hidden: tuple[int, ...] = PAPER_WIDTHS["qm9"]
    graph_hidden: int = 32
    layers: int | None = None
    gram: str = "wishart"
    gram_components: int = 1
    chunk_size: int = 16
    atol: float = 1e-5
    rtol: float = 1e-5
    flow_minutes: float = 5.0
    scale_minutes: float = 1.0
    n_val: int = 500
    val_every_minutes: float = 0.5
    n_test: int | None = None
    elbo_samples: int = 16
    iwae_samples: int = 512
    cache_dir: str = "data"
    seed: int = 0

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(
                f"objective must be one of {tuple(OBJECTIVES)}, got {self.objective!r}"
            )
        if self.potential not in POTENTIALS:
            raise ValueError(f"potential must be one of {POTENTIALS}, got {self.potential!r}")
        if self.gram not in GRAMS:
            raise ValueError(f"gram must be one of {tuple(GRAMS)}, got {self.gram!r}")
        if self.layers is None:  # resolved, so that the saved preset says what was trained
            self.layers = DEFAULT_LAYERS[self.potential]
        self.hidden = tuple(self.hidden)

    def flow_config(self) -> TrainConfig:
        """The GrCNF's; ``flow_minutes`` is the run's total over invocations."""
        mle = self.objective == "mle"
        return TrainConfig(
            lr=5e-4 if mle else 1e-3, weight_decay=1e-12, batch_size=128, iterations=10**7,
            val_every=None, val_doubling_from=None if mle else 100,
            val_every_minutes=self.val_every_minutes,
            log_every=10 if mle else 200, checkpoint_every=100 if mle else 2000,
            seed=self.seed, total_budget_minutes=self.flow_minutes,
        )  # fmt: skip

    def scale_config(self) -> TrainConfig:
        """The Gram density's and the decoder's; ``scale_minutes`` is each one's total."""
        return TrainConfig(
            lr=1e-3, batch_size=128, iterations=10**7, val_every=500, log_every=100,
            checkpoint_every=1000, seed=self.seed, total_budget_minutes=self.scale_minutes,
        )  # fmt: skip


class DecoderModel(nn.Module):
    """``log_prob(P)`` = the decoder's term of a one-draw ELBO, log p(Q^T S Q | Y Q), Q Haar.

    The ELBO's other terms do not depend on the decoder, so the trainer maximizing this
    maximizes the paper's ELBO (its expectation over Q) in the decoder's parameters.
    """

    def __init__(self, decoder: GramDecoder):
        super().__init__()
        self.decoder = decoder

    def log_prob(self, P: Tensor) -> Tensor:
        Y, lam, _ = shape_factor(P)
        Q = random_orthogonal(P.shape[:-2], K, dtype=P.dtype, device=P.device)
        return self.decoder.log_prob(Q.mT @ torch.diag_embed(lam) @ Q, Y @ Q)


@dataclass
class QM9Models:
    """The exact model (``shape``) and the paper's decoder, which share ``shape.flow``."""

    shape: TwoPartShapeFlow
    decoder: DecoderModel

    @property
    def flow(self) -> GrCNF:
        return self.shape.flow


def load_molecules(cache_dir: str | Path, dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
    """Train/valid/test molecules as centred clouds ``X: (M, 19, 3)`` (Å)."""
    data = load_qm9_positional(cache_dir, progress=True)
    out = {}
    for s in ("train", "valid", "test"):
        X = torch.as_tensor(data[s], dtype=dtype)
        out[s] = X - X.mean(dim=-2, keepdim=True)
    return out


def _models(exp: QM9Experiment, init_scale: Tensor | None = None) -> QM9Models:
    """The untrained models of ``exp``: the TwoPartShapeFlow in float64, the decoder in float32
    (``init_scale``: the scale estimator's starting scales, from the training data)."""
    mlp = exp.potential == "mlp"
    with seeded_init(exp.seed):
        shape = TwoPartShapeFlow(
            N + 1, K, exp.potential, exp.gram,
            field_options=preset_field_options(
                exp.potential, exp.hidden if mlp else exp.graph_hidden, exp.layers),
            gram_options={"components": exp.gram_components}, chunk_size=exp.chunk_size,
            prior=exp.prior, sigma=exp.sigma, atol=exp.atol, rtol=exp.rtol,
        ).double()  # fmt: skip
        decoder = DecoderModel(GramDecoder(ScaleEstimator(N, K, init_scale=init_scale)))
    return QM9Models(shape, decoder)


def run(
    exp: QM9Experiment, run_dir: str | Path, *, progress: bool = True, force: bool = False
) -> None:
    """Train (or continue) the models of ``exp`` in ``run_dir``: the TwoPartShapeFlow's flow and
    Gram density (`two_part.train_shape_flow`), then the paper's decoder.

    ``run_dir`` must be new or hold the same preset and split (`run_dir.claim_run_dir`;
    ``flow_minutes`` and ``scale_minutes`` may grow); ``force`` deletes a mismatched one.
    """
    run_dir = Path(run_dir)
    X = load_molecules(exp.cache_dir)
    identity = {"path": str(Path(exp.cache_dir).resolve()),
                **data_identity(train=X["train"], valid=X["valid"])}  # fmt: skip
    claim_run_dir(run_dir, dataclasses.asdict(exp), identity, kind="qm9", added=ADDED_FIELDS,
                  budget_keys=("flow_minutes", "scale_minutes"), force=force)  # fmt: skip
    H = helmert_basis(N + 1, dtype=X["train"].dtype)
    P = {s: H.mT @ X[s] for s in ("train", "valid")}  # the decoder's coordinates
    lam = shape_factor(P["train"])[1]
    m = _models(exp, init_scale=torch.exp(0.5 * lam.log().median(dim=0).values).float())
    train_shape_flow(m.shape, X["train"], X["valid"], run_dir, exp.flow_config(),
                     exp.scale_config(), objective=exp.objective, n_val_flow=exp.n_val,
                     progress=progress)  # fmt: skip
    train(m.decoder, P["train"], exp.scale_config(), run_dir / "decoder", val_data=P["valid"],
          objective=OBJECTIVES["mle"], resume=True, progress=progress)  # fmt: skip


def load_run(run_dir: str | Path) -> tuple[QM9Experiment, QM9Models]:
    """The preset and the trained models (best validation checkpoints), float64, eval mode."""
    run_dir = Path(run_dir)
    exp = read_preset(run_dir, lambda d: QM9Experiment(**d), "QM9")
    m = _models(exp)
    load_shape_flow(m.shape, run_dir)
    ckpt = load_checkpoint(checkpoint_path(run_dir / "decoder"), required=("model",))
    m.decoder.double().load_state_dict(ckpt["model"])
    m.decoder.eval()
    return exp, m


def sample_molecules(m: QM9Models, n: int, seed: int = 0, model: str = "exact") -> Tensor:
    """``n`` generated centred molecules ``(n, 19, 3)`` (Å), float64.

    ``model="exact"``: `TwoPartShapeFlow.sample` (in a Haar-random overall orientation).
    ``model="paper"``: [Y] from the flow, a Haar representative Y' = Y Q and S' from the
    decoder at Y' (P = Y' chol(S'); the overall rotation is I).
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if model == "exact":
            return m.shape.sample(n, generator=gen)
        if model != "paper":
            raise ValueError(f"model must be 'exact' or 'paper', got {model!r}")
        Y = m.flow.sample(n, generator=gen)
        Y = Y @ random_orthogonal((n,), K, generator=gen, dtype=Y.dtype)
        P = Y @ torch.linalg.cholesky(m.decoder.decoder.sample(Y, generator=gen))
        return m.shape.H.to(P) @ P


def _status(run_dir: Path) -> dict:
    status = training_status(run_dir)
    return {"minutes": status["trained_minutes"], "iterations": status["iterations"],
            **{key: status[key] for key in TIMING_KEYS}}  # fmt: skip


def evaluate(run_dir: str | Path, n_samples: int = 1000, batch_size: int = 200) -> dict:
    """Test NLL of the exact model (-`TwoPartShapeFlow.log_prob`, with its parts), -ELBO and
    IWAE NLL of the paper's (nats per molecule, 54-D centred coordinates), and the distance
    JSD of both models' samples. ``batch_size``: molecules per -ELBO / IWAE batch.

    ``given_spans_*``: the JSD and broken fraction of molecules built from the test
    molecules' own spans with S from the Gram density (`TwoPartShapeFlow.sample_given`), so
    the Gram density's share of the samples' errors shows.

    ``mean_log_jacobian`` is the mean log-Jacobian of the change of variables to (Y, S, R),
    a term of the data alone: ``test_nll = test_nll_grassmann + test_nll_gram +
    mean_log_jacobian``."""
    run_dir = Path(run_dir)
    exp, m = load_run(run_dir)
    X = load_molecules(exp.cache_dir)
    test = test_subset(X["test"], exp.n_test)
    gen = torch.Generator().manual_seed(exp.seed)
    elbo, iwae = [], []
    with torch.no_grad():
        t = m.shape.log_prob_terms(test)
        for P, log_gr in zip(m.shape.helmert(test).split(batch_size),
                             t["grassmann"].split(batch_size)):  # fmt: skip

            def log_p_gr(Y, log_gr=log_gr):  # the flow's term of these molecules, solved once
                return log_gr

            for out, L, iw in ((elbo, exp.elbo_samples, False), (iwae, exp.iwae_samples, True)):
                out.append(cartesian_elbo(P, log_p_gr, m.decoder.decoder.log_prob, L,
                                          importance_weighted=iw, generator=gen))  # fmt: skip
    train_hist = distance_histogram(X["train"].numpy())
    samples = sample_molecules(m, n_samples, exp.seed).numpy()
    samples_paper = sample_molecules(m, n_samples, exp.seed, model="paper").numpy()
    # the Gram density alone: the test molecules' own spans, S and orientation sampled
    given = m.shape.sample_given(m.shape.factor(test[:n_samples])[0], gen).numpy()
    nll = -t["log_prob"]

    result = {
        **mean_sem("test_nll", nll),
        "test_nll_grassmann": -t["grassmann"].mean().item(),
        "test_nll_gram": -t["gram"].mean().item(),
        "mean_log_jacobian": -t["jacobian"].mean().item(),
        "uniform_nll_grassmann": m.shape.manifold.log_volume(),
        **mean_sem("paper_neg_elbo", -torch.cat(elbo)),
        **mean_sem("paper_nll_iwae", -torch.cat(iwae)),
        "jsd": jsd(distance_histogram(samples), train_hist),
        "paper_jsd": jsd(distance_histogram(samples_paper), train_hist),
        "jsd_test_data": jsd(distance_histogram(test.numpy()), train_hist),
        # issue 14: molecules with two atoms nearer than 0.9 Å (the data have none)
        "broken_fraction": closest_pair_fraction(samples),
        "paper_broken_fraction": closest_pair_fraction(samples_paper),
        "given_spans_jsd": jsd(distance_histogram(given), train_hist),
        "given_spans_broken_fraction": closest_pair_fraction(given),
        "n_test": len(nll),
        "n_train": len(X["train"]),
        "n_samples": n_samples,
        "elbo_samples": exp.elbo_samples,
        "iwae_samples": exp.iwae_samples,
        **{
            f"{sub}_{key}": value
            for sub in ("flow", "gram", "decoder")
            for key, value in _status(run_dir / sub).items()
        },
        "objective": exp.objective,
        "prior": exp.prior,
        "potential": exp.potential,
    }
    write_json(result, run_dir / "eval.json")
    np.save(run_dir / "samples.npy", samples.astype(np.float32))
    np.save(run_dir / "samples_paper.npy", samples_paper.astype(np.float32))
    return result


def _eval_line(run_dir: Path, n_samples: int, seed: int) -> str:
    r = evaluate(run_dir, n_samples)
    return (f"[QM9 positional] exact test NLL {r['test_nll']:.3f} ± {r['test_nll_sem']:.3f} "
            f"nats | paper's -ELBO {r['paper_neg_elbo']:.3f} | distance JSD {r['jsd']:.4f} | "
            f"broken {100 * r['broken_fraction']:.1f} %")  # fmt: skip


RUN_KIND = RunKind(evaluate=_eval_line)
