"""Paper §5.3, QM9 positional, in the com-free protocol with an exact Cartesian likelihood.

A centred 19-atom molecule written in the Helmert basis of 1-perp is ``P: (18, 3)``,
factored as ``P = Y diag(sqrt(lam)) R^T``
(:func:`grassflow.distributions.cartesian.shape_factor`).
Three models, trained separately:

* a GrCNF on Gr(3, 18) for [Y] (flow matching by default, or maximum likelihood);
* exact model: an :class:`~grassflow.nn.eigenvalues.EigenvalueDensity` for lam given the
  canonical Y (the paper's scale-estimator trunk), by maximum likelihood. With the flow it is
  an exact, O(3)-invariant density on the 54-dimensional centred coordinates
  (:func:`~grassflow.distributions.cartesian.cartesian_log_prob`), on the same space as E-NF's;
* the paper's model: the scale estimator as a :class:`~grassflow.nn.scale.GramDecoder`,
  S' = Y'^T P P^T Y' given a representative Y' = Y Q whose orientation Q is latent (Haar
  prior and posterior), trained on the -ELBO of the paper's appendix
  (:func:`~grassflow.distributions.cartesian.cartesian_elbo`). The flow is shared: the GrCNF
  term of the ELBO does not depend on Q. Besides the -ELBO we report an importance-weighted
  estimate of the same model's NLL.

The paper's protocol is Gr(3, 19) with uncentred coordinates; centred molecules lie on a
measure-zero sub-Grassmannian there, so its densities are not comparable with E-NF's (see
Table 1's paper protocol). We use the com-free Gr(3, 18) for both models. Atom types are not
modelled: generated ``.xyz`` files use ``X``.

A run directory holds ``experiment.json``, ``flow/``, ``scale/`` and ``decoder/`` (trainer
files), ``eval.json`` and ``samples.npy`` / ``samples_paper.npy``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..data.qm9 import distance_histogram, load_qm9_positional
from ..data.shapes import helmert_basis
from ..distributions.cartesian import (
    cartesian_elbo,
    cartesian_log_prob,
    log_jacobian,
    random_orthogonal,
    shape_factor,
)
from ..flows import GrCNF
from ..manifolds import Grassmann
from ..metrics import jsd
from ..nn import PRESETS, GrassmannField, Potential
from ..nn.eigenvalues import EigenvalueDensity
from ..nn.scale import GramDecoder, ScaleEstimator
from ..training import OBJECTIVES, TrainConfig, load_checkpoint, train
from ..training import distributed as dd
from ..training.checkpoint import write_json
from ..training.rng import seeded_init
from .runs import (
    RunMismatch,
    checkpoint_path,
    claim_run_dir,
    data_identity,
    read_preset,
    training_status,
)

__all__ = [
    "PAPER", "DecoderModel", "QM9Experiment", "QM9Models", "RunMismatch", "ScaleModel",
    "evaluate", "load_run", "run", "sample_molecules", "training_status",
]  # fmt: skip

# paper Table 2: GrCNF reports -ELBO (an upper bound of its NLL), E-NF an NLL
PAPER = {"GrCNF": {"neg_elbo": -85.3, "jsd": 0.005}, "E-NF": {"nll": -70.2, "jsd": 0.006}}
N, K = 18, 3  # Helmert coordinates of 19 atoms, 3-D


@dataclass
class QM9Experiment:
    """One QM9 run (com-free, Gr(3, 18)).

    Attributes:
        objective: ``"fm"``, ``"fm-ot"`` or ``"mle"`` for the GrCNF.
        prior: GrCNF base distribution, ``"uniform"`` or ``"gaussian"`` (paper: M = I,
            U = sigma^2 I, V = sigma^2 I, sigma = 0.3).
        hidden: GrCNF widths (paper: 32-32-32).
        flow_minutes: GrCNF training wall-clock (resumable).
        scale_minutes: of each scale model, the eigenvalue density and the paper's decoder.
        elbo_samples, iwae_samples: Haar draws per test molecule for the -ELBO (its
            expectation) and for the importance-weighted NLL of the paper's model.
        n_val: validation molecules used for the GrCNF's model selection (an exact ODE per
            molecule; the scale model uses all 2,501).
        n_test: evaluate on the first ``n_test`` test molecules only (None: all 1,813).
        cache_dir: where the processed QM9 split is cached.
        seed: training seed of both models.
    """

    objective: str = "fm"
    prior: str = "uniform"
    sigma: float = 0.3
    hidden: tuple[int, ...] = PRESETS["qm9"]
    atol: float = 1e-5
    rtol: float = 1e-5
    flow_minutes: float = 5.0
    scale_minutes: float = 1.0
    n_val: int = 500
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
        self.hidden = tuple(self.hidden)

    def flow_config(self) -> TrainConfig:
        mle = self.objective == "mle"
        return TrainConfig(
            lr=5e-4 if mle else 1e-3, weight_decay=1e-12, batch_size=128, iterations=10**7,
            val_every=None, val_doubling_from=None if mle else 100, val_every_minutes=0.5,
            log_every=10 if mle else 200, checkpoint_every=100 if mle else 2000,
            seed=self.seed, budget_minutes=self.flow_minutes,
        )  # fmt: skip

    def scale_config(self) -> TrainConfig:
        return TrainConfig(
            lr=1e-3, batch_size=128, iterations=10**7, val_every=500, log_every=100,
            checkpoint_every=1000, seed=self.seed, budget_minutes=self.scale_minutes,
        )  # fmt: skip


class ScaleModel(nn.Module):
    """``log_prob(P)`` = log p(lam | Y) of the eigenvalue density, so the trainer can fit it."""

    def __init__(self, density: EigenvalueDensity):
        super().__init__()
        self.density = density

    def log_prob(self, P: Tensor) -> Tensor:
        Y, lam, _ = shape_factor(P)
        return self.density.log_prob(lam, Y)


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
    flow: GrCNF
    scale: ScaleModel
    decoder: DecoderModel


def load_split(cache_dir: str | Path, dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
    """Train/valid/test molecules as Helmert coordinates ``P: (N, 18, 3)`` (Å)."""
    data = load_qm9_positional(cache_dir, progress=True)
    H = helmert_basis(N + 1, dtype=dtype)
    return {s: H.mT @ torch.as_tensor(data[s], dtype=dtype) for s in ("train", "valid", "test")}


def _models(exp: QM9Experiment, init_mean: Tensor | None = None) -> QM9Models:
    init_scale = None if init_mean is None else torch.exp(0.5 * init_mean).float()
    with seeded_init(exp.seed):
        flow = GrCNF(
            Grassmann(K, N), GrassmannField(Potential(N, K, exp.hidden)), prior=exp.prior,
            prior_mean=torch.eye(N, K), row_cov=exp.sigma**2 * torch.eye(N),
            col_cov=exp.sigma**2 * torch.eye(K), atol=exp.atol, rtol=exp.rtol,
        )  # fmt: skip
        return QM9Models(
            flow, ScaleModel(EigenvalueDensity(N, K, init_mean=init_mean)),
            DecoderModel(GramDecoder(ScaleEstimator(N, K, init_scale=init_scale))),
        )  # fmt: skip


def _train(model, data, val, cfg, run_dir: Path, objective, progress: bool) -> None:
    """Train up to ``cfg.budget_minutes`` in total over invocations, and no further."""
    cfg = cfg.replace(total_budget_minutes=cfg.budget_minutes, budget_minutes=None)
    train(model, data, cfg, run_dir, val_data=val, objective=objective, resume=True,
          progress=progress)  # fmt: skip


def run(
    exp: QM9Experiment, run_dir: str | Path, *, progress: bool = True, force: bool = False
) -> None:
    """Train (or continue) the three models of ``exp`` in ``run_dir``.

    ``run_dir`` must be new or hold the same preset and split (:func:`.runs.claim_run_dir`;
    ``flow_minutes`` and ``scale_minutes`` may grow); ``force`` deletes a mismatched one.
    """
    run_dir = Path(run_dir)
    P = load_split(exp.cache_dir)
    identity = {"path": str(Path(exp.cache_dir).resolve()),
                **data_identity(train=P["train"], valid=P["valid"])}  # fmt: skip
    claim_run_dir(run_dir, dataclasses.asdict(exp), identity,
                  budget_keys=("flow_minutes", "scale_minutes"), force=force)  # fmt: skip
    Y = {s: shape_factor(x)[0] for s, x in P.items()}
    init_mean = shape_factor(P["train"])[1].log().median(dim=0).values
    if dd.is_main():  # under torchrun, rank 0 writes
        torch.save(init_mean, run_dir / "init_mean.pt")
    m = _models(exp, init_mean)
    _train(m.flow, Y["train"], Y["valid"][: exp.n_val], exp.flow_config(), run_dir / "flow",
           OBJECTIVES[exp.objective], progress)  # fmt: skip
    for model, sub in ((m.scale, "scale"), (m.decoder, "decoder")):
        _train(model, P["train"], P["valid"], exp.scale_config(), run_dir / sub,
               OBJECTIVES["mle"], progress)  # fmt: skip


def load_run(run_dir: str | Path) -> tuple[QM9Experiment, QM9Models]:
    """The preset and the trained models (best validation checkpoints), in eval mode."""
    run_dir = Path(run_dir)
    exp = read_preset(run_dir, lambda d: QM9Experiment(**d), "QM9")
    m = _models(exp, torch.load(run_dir / "init_mean.pt"))
    for model, sub in ((m.flow, "flow"), (m.scale, "scale"), (m.decoder, "decoder")):
        ckpt = load_checkpoint(checkpoint_path(run_dir / sub), required=("model",))
        model.double().load_state_dict(ckpt["model"])
        model.eval()
    return exp, m


def sample_molecules(m: QM9Models, n: int, seed: int = 0, model: str = "exact") -> Tensor:
    """``n`` generated centred molecules ``(n, 19, 3)`` (Å); the overall rotation is I.

    [Y] comes from the flow and a Haar representative Y' = Y Q; ``model="exact"`` draws lam
    from the eigenvalue density at the canonical Y' (P = Y diag(sqrt(lam))),
    ``model="paper"`` draws S' from the decoder at Y' (P = Y' chol(S')).
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        Y = m.flow.sample(n, generator=gen) @ random_orthogonal((n,), K, generator=gen)
        if model == "exact":
            Yc, _, _ = shape_factor(Y)  # the canonical sign convention the model saw
            P = Yc * m.scale.density.sample(Yc, generator=gen).sqrt().unsqueeze(-2)
        elif model == "paper":
            P = Y @ torch.linalg.cholesky(m.decoder.decoder.sample(Y, generator=gen))
        else:
            raise ValueError(f"model must be 'exact' or 'paper', got {model!r}")
    return helmert_basis(N + 1) @ P


def _once(fn):
    """Memoize a one-argument call: the three likelihoods of a chunk share one flow ODE."""
    cache = []

    def wrapped(Y):
        if not cache:
            cache.append(fn(Y))
        return cache[0]

    return wrapped


def _status(run_dir: Path) -> dict:
    status = training_status(run_dir)
    return {"minutes": status["trained_minutes"], "iterations": status["iterations"]}


def _mean_sem(name: str, x: Tensor) -> dict[str, float]:
    return {name: x.mean().item(), f"{name}_sem": (x.std() / len(x) ** 0.5).item()}


def evaluate(run_dir: str | Path, n_samples: int = 1000, batch_size: int = 200) -> dict:
    """Test NLL of the exact model, -ELBO and IWAE NLL of the paper's (nats per molecule,
    54-D centred coordinates), and the distance JSD of both models' samples."""
    run_dir = Path(run_dir)
    exp, m = load_run(run_dir)
    P = load_split(exp.cache_dir)
    P["test"] = P["test"][: exp.n_test]
    gen = torch.Generator().manual_seed(exp.seed)
    terms = {k: [] for k in ("log_p", "log_p_gr", "log_p_lam", "log_jac", "elbo", "iwae")}
    with torch.no_grad():
        for chunk in P["test"].split(batch_size):
            log_p_gr = _once(m.flow.log_prob)

            def log_p_lam(lam, Y):
                terms["log_jac"].append(log_jacobian(lam, N))
                terms["log_p_lam"].append(m.scale.density.log_prob(lam, Y))
                return terms["log_p_lam"][-1]

            terms["log_p"].append(cartesian_log_prob(chunk, log_p_gr, log_p_lam))
            terms["log_p_gr"].append(log_p_gr(None))
            for key, L, iw in (("elbo", exp.elbo_samples, False),
                               ("iwae", exp.iwae_samples, True)):  # fmt: skip
                terms[key].append(cartesian_elbo(
                    chunk, log_p_gr, m.decoder.decoder.log_prob, L, importance_weighted=iw,
                    generator=gen,
                ))  # fmt: skip
        t = {k: torch.cat(v) for k, v in terms.items()}
    H = helmert_basis(N + 1)
    train_hist = distance_histogram((H @ P["train"]).numpy())
    X = sample_molecules(m, n_samples, exp.seed).numpy()
    X_paper = sample_molecules(m, n_samples, exp.seed, model="paper").numpy()
    nll = -t["log_p"]

    result = {
        **_mean_sem("test_nll", nll),
        "test_nll_grassmann": -t["log_p_gr"].mean().item(),
        "test_nll_eigenvalues": -t["log_p_lam"].mean().item(),
        "mean_log_jacobian": t["log_jac"].mean().item(),
        "uniform_nll_grassmann": m.flow.manifold.log_volume(),
        **_mean_sem("paper_neg_elbo", -t["elbo"]),
        **_mean_sem("paper_nll_iwae", -t["iwae"]),
        "jsd": jsd(distance_histogram(X), train_hist),
        "paper_jsd": jsd(distance_histogram(X_paper), train_hist),
        "jsd_test_data": jsd(distance_histogram((H @ P["test"]).numpy()), train_hist),
        "n_test": len(nll),
        "n_samples": n_samples,
        "elbo_samples": exp.elbo_samples,
        "iwae_samples": exp.iwae_samples,
        **{f"{sub}_{key}": value for sub in ("flow", "scale", "decoder")
           for key, value in _status(run_dir / sub).items()},
        "objective": exp.objective,
        "prior": exp.prior,
    }
    write_json(result, run_dir / "eval.json")
    np.save(run_dir / "samples.npy", X.astype(np.float32))
    np.save(run_dir / "samples_paper.npy", X_paper.astype(np.float32))
    return result
