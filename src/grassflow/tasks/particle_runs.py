"""Paper §5.2: DW4 and LJ13 on Gr(k, D): preset, data, training and test NLL of one run.

The sweep over training sizes and seeds (the paper's Table 1) is in `table1`.

Two representations (``protocol``):

* ``"paper"``: centre each configuration and Gram-Schmidt its ``n x d`` coordinate matrix:
  Gr(2, 4) for DW4, Gr(3, 13) for LJ13, as the paper describes. Centred data satisfy
  ``1^T Y = 0``, so they lie on the lower-dimensional submanifold Gr(k, n - 1) of Gr(k, n),
  where a density can grow without bound: the NLL has no floor.
* ``"com-free"`` (default): write the centred coordinates in an orthonormal basis of 1-perp
  (Helmert) first: Gr(2, 3) for DW4, Gr(3, 12) for LJ13. Densities there are non-degenerate.

A run directory holds ``experiment.json``, the trainer's files and ``eval.json``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..data.particle_files import SOURCES, load_splits
from ..data.particles import get_system
from ..flows import GrCNF
from ..manifolds import Grassmann
from ..manifolds.shape_space import PROTOCOLS, representation_shape, to_grassmann
from ..nn import PAPER_WIDTHS, GrassmannField, Potential
from ..training import (
    OBJECTIVES,
    TrainConfig,
    TrainResult,
    distributed_log_prob,
    load_checkpoint,
    train,
)
from ..training import distributed as dd
from ..training.checkpoint import write_json
from ..training.clock import Stopwatch
from ..training.parallel_eval import save_samples
from ..training.rng import seeded_init
from .registry import RunKind
from .run_dir import TIMING_KEYS, claim_run_dir, data_identity, load_trained, training_status

__all__ = [
    "RUN_KIND",
    "PAPER_SCHEDULE",
    "SIZES",
    "ParticleExperiment",
    "build_model",
    "evaluate",
    "load_data",
    "load_run",
    "paper_train_config",
    "run",
]

SIZES = {"dw4": (100, 1000, 10_000, 100_000), "lj13": (10, 100, 1000, 10_000)}
"""Training-set sizes of the paper's Table 1."""

# (epochs, batch size) per training size, paper Table 5 (hyperparameters)
PAPER_SCHEDULE = {
    "dw4": {100: (1000, 100), 1000: (300, 100), 10_000: (50, 100), 100_000: (6, 100)},
    "lj13": {10: (500, 10), 100: (1000, 100), 1000: (300, 100), 10_000: (50, 100)},
}


def paper_train_config(system: str, n_train: int, objective: str = "mle") -> TrainConfig:
    """The paper's optimizer and schedule (Adam, lr 1e-4, weight decay 1e-12, Table 5).

    ``"mle"`` runs the paper's number of epochs. Flow-matching iterations cost about 1/100 of
    an MLE iteration, and the regression target is noisier, so FM objectives train until the
    CPU-time budget instead (a 10^7-iteration cap) with a 10x larger learning rate.
    Sizes outside the paper's table get 100 epochs at batch 100. Validation runs every
    15 s of training CPU time and at the end, and for FM also at iterations 100, 200, 400, ...:
    at this learning rate FM overfits 100 LJ13 configurations within a few hundred
    iterations, and model selection on val NLL must be able to see that.
    """
    epochs, batch = PAPER_SCHEDULE.get(system, {}).get(n_train, (100, 100))
    batch = min(batch, n_train)
    mle = objective == "mle"
    return TrainConfig(
        lr=1e-4 if mle else 1e-3,
        weight_decay=1e-12,
        batch_size=batch,
        iterations=epochs * math.ceil(n_train / batch) if mle else 10**7,
        val_every=None,
        val_doubling_from=None if mle else 100,
        val_every_minutes=0.25,
        log_every=10 if mle else 200,
        checkpoint_every=100 if mle else 5000,
    )


@dataclass
class ParticleExperiment:
    """One DW4/LJ13 run. Defaults are the paper's (appendix Tables 4 and 5).

    Attributes:
        system: ``"dw4"`` or ``"lj13"``.
        protocol: ``"com-free"`` (default) or ``"paper"``; see the module docstring.
        n_train: training configurations (the first ``n_train`` of the protocol's pool).
        source: data layout, ``"generated"`` (``grassflow data make``), ``"klein"`` or
            ``"enf"``; see `grassflow.data.particle_files`.
        data_dir: directory holding the source's files.
        hidden: ConcatSquash widths; None = the paper's preset for the system.
        prior: ``"gaussian"`` (the paper's matrix Gaussian) or ``"uniform"``.
        sigma: Gaussian prior ``M = I_{D,k}``, ``U = sigma^2 I_D``, ``V = sigma^2 I_k`` (paper:
            0.3).
        T, train_T, divergence, method, atol, rtol: see `GrCNF`. The paper uses the
            adjoint method; here gradients go straight through the Cayley RKMK solver
            (same gradient, more memory, which a 2-core CPU run does not miss).
        objective: ``"mle"`` (the paper), ``"fm"`` or ``"fm-ot"`` (flow matching).
        train: optimizer and schedule; None = `paper_train_config`.
    """

    system: str = "dw4"
    protocol: str = "com-free"
    n_train: int = 1000
    source: str = "generated"
    data_dir: str = "data"
    hidden: tuple[int, ...] | None = None
    prior: str = "gaussian"
    sigma: float = 0.3
    T: float = 1.0
    train_T: bool = True
    divergence: str = "exact"
    method: str = "cayley_rkmk"
    atol: float = 1e-5
    rtol: float = 1e-5
    objective: str = "mle"
    train: TrainConfig | None = field(default=None)

    def __post_init__(self):
        get_system(self.system)  # validates the name
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(
                f"objective must be one of {tuple(OBJECTIVES)}, got {self.objective!r}"
            )
        if not (isinstance(self.n_train, int) and self.n_train >= 1):
            raise ValueError(f"n_train must be a positive integer, got {self.n_train!r}")
        if self.hidden is None:
            self.hidden = PAPER_WIDTHS[self.system]
        self.hidden = tuple(self.hidden)
        if self.train is None:
            self.train = paper_train_config(self.system, self.n_train, self.objective)
        elif isinstance(self.train, dict):
            self.train = TrainConfig.from_dict(self.train)

    @property
    def shape(self) -> tuple[int, int]:
        """``(D, k)`` of the Grassmann manifold the data live on."""
        system = get_system(self.system)
        return representation_shape(system.n_particles, system.dim, self.protocol)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["train"] = self.train.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ParticleExperiment:
        return cls(**d)


def build_model(exp: ParticleExperiment) -> GrCNF:
    """The paper's GrCNF for ``exp.shape`` with prior ``M = I``, ``U = s^2 I``, ``V = s^2 I``."""
    D, k = exp.shape
    with seeded_init(exp.train.seed):
        return GrCNF(
            Grassmann(k, D),
            GrassmannField(Potential(D, k, exp.hidden)),
            prior=exp.prior,
            prior_mean=torch.eye(D, k),
            row_cov=exp.sigma**2 * torch.eye(D),
            col_cov=exp.sigma**2 * torch.eye(k),
            T=exp.T,
            train_T=exp.train_T,
            divergence=exp.divergence,
            method=exp.method,
            atol=exp.atol,
            rtol=exp.rtol,
        )


def load_data(exp: ParticleExperiment, dtype: torch.dtype = torch.float64) -> dict:
    """The protocol's train/val/test splits as Grassmann points ``(N, D, k)``."""
    splits = load_splits(exp.system, exp.source, exp.data_dir, exp.n_train)
    return {name: to_grassmann(torch.as_tensor(X), exp.protocol).to(dtype)
            for name, X in splits.items()}  # fmt: skip


def run(
    exp: ParticleExperiment,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    data: dict | None = None,
    force: bool = False,
    setup: Stopwatch | None = None,
) -> TrainResult:
    """Train (or resume) one run in ``run_dir``; ``data`` defaults to `load_data`; ``setup``:
    see ``train``.

    ``run_dir`` must be new or hold the same preset and data (`run_dir.claim_run_dir`);
    ``force`` deletes a mismatched one instead of raising.
    """
    data = load_data(exp) if data is None else data
    claim_run_dir(run_dir, exp.to_dict(), data_identity_of(exp, data), kind="particles",
                  force=force, resume=resume)  # fmt: skip
    return train(
        build_model(exp),
        data["train"],
        exp.train,
        run_dir,
        val_data=data["val"],
        objective=OBJECTIVES[exp.objective],
        resume=resume,
        progress=progress,
        setup=setup,
    )


def data_identity_of(exp: ParticleExperiment, data: dict) -> dict:
    """Source, resolved path and content hashes of the splits."""
    return {"source": exp.source, "path": str(Path(exp.data_dir).resolve()),
            **data_identity(train=data["train"], val=data["val"], test=data["test"])}  # fmt: skip


def load_run(run_dir: str | Path, which: str = "best") -> tuple[ParticleExperiment, GrCNF]:
    """The preset and the trained model (``best.pt``, else ``last.pt``), in eval mode."""
    return load_trained(run_dir, ParticleExperiment.from_dict, build_model, "DW4/LJ13", which)


def evaluate(run_dir: str | Path, data: dict | None = None, batch_size: int = 250) -> dict:
    """Test NLL (exact divergence) of the best model, beside the prior's and the uniform's.

    Writes and returns ``eval.json``. Under torchrun the chunks of ``batch_size`` test
    points are shared among the ranks (same result) and rank 0 writes the file.
    """
    exp, model = load_run(run_dir)
    dtype = model.dtype
    test = (load_data(exp) if data is None else data)["test"].to(dtype)
    nll = -distributed_log_prob(model, test, batch_size)
    with torch.no_grad():
        prior_nll = -model.prior().log_prob(test)
    best_path = Path(run_dir) / "best.pt"
    best = load_checkpoint(best_path) if best_path.exists() else {}
    status = training_status(run_dir)
    result = {
        "system": exp.system,
        "protocol": exp.protocol,
        "n_train": exp.n_train,
        "seed": exp.train.seed,
        "objective": exp.objective,
        "manifold": f"Gr({exp.shape[1]},{exp.shape[0]})",
        "n_test": len(test),
        "test_nll": nll.mean().item(),
        "test_nll_sem": (nll.std() / len(nll) ** 0.5).item(),
        "prior_nll": prior_nll.mean().item(),
        "uniform_nll": model.manifold.log_volume(),
        "best_val_nll": best.get("val_nll"),
        "best_iteration": best.get("iteration"),
        "T": model.T.item(),
        "iterations": status["iterations"],
        "trained_minutes": status["trained_minutes"],
        **{key: status[key] for key in TIMING_KEYS},
    }
    if dd.is_main():
        write_json(result, Path(run_dir) / "eval.json")
    return result


def _eval_line(run_dir: Path, n_samples: int, seed: int) -> str:
    r = evaluate(run_dir)
    return (f"[{r['system']}, {r['protocol']}, {r['manifold']}] test NLL {r['test_nll']:.3f} "
            f"± {r['test_nll_sem']:.3f} nats | prior {r['prior_nll']:.3f} | uniform "
            f"{r['uniform_nll']:.3f}")  # fmt: skip


RUN_KIND = RunKind(
    evaluate=_eval_line,
    sample=lambda run_dir, n, seed, out: save_samples(load_run(run_dir)[1], n, seed, out),
)
