"""Densities of the paper's artificial textures on Gr(1, 3) (§5.1): presets, training,
evaluation and one run's pictures; what ``grassflow demo`` and ``grassflow train --dataset``
run. The paper's Figures 3 and 4 over all five textures are in the reproduction package
(``grassflow_paper.textures_figures``).

A run directory holds ``experiment.json`` (this preset), the trainer's files
(``config.json``, ``last.pt``, ``best.pt``, ``metrics.jsonl``), ``eval.json`` and pictures.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..data.textures import TEXTURES, sample_texture, texture_splits
from ..distributions import MatrixGaussianPrior
from ..flows import GrCNF
from ..manifolds import Grassmann
from ..metrics import mmd2
from ..nn import GrassmannField, Potential
from ..training import (
    OBJECTIVES,
    TrainConfig,
    TrainResult,
    distributed_log_prob,
    distributed_transport,
    train,
)
from ..training import distributed as dd
from ..training.checkpoint import write_json
from ..training.clock import Stopwatch
from ..training.loop import Callback
from ..training.parallel_eval import save_samples
from ..training.rng import seeded_init
from ..viz import SphereColumn, figure_antipodal, figure_prior_views, figure_textures
from .registry import RunKind
from .run_dir import claim_run_dir, data_identity, load_trained

__all__ = [
    "RUN_KIND",
    "DEMO",
    "DEMO_PAPER",
    "MMD_BANDWIDTH",
    "PAPER_TEXTURES",
    "PRESETS",
    "TexturesExperiment",
    "build_model",
    "density_fn",
    "describe",
    "held_out",
    "preset",
    "claim",
    "evaluate",
    "load_run",
    "plot_prior",
    "plot_run",
    "run",
    "texture_stream",
]

MMD_BANDWIDTH = 0.1  # the median heuristic (~0.65) is too coarse to tell textures apart


# Paper, Table "hyperparams", Textures column: infinite data, so its 72000 "epochs" are
# optimizer steps; validation on 500 samples.
PAPER_TEXTURES = TrainConfig(
    lr=1e-3,
    betas=(0.9, 0.999),
    weight_decay=0.0,
    batch_size=500,
    iterations=72000,
    lr_step=20000,
    lr_gamma=0.1,
    val_every=1000,
    checkpoint_every=1000,
    log_every=50,
)


@dataclass
class TexturesExperiment:
    """Preset for one texture run; defaults are the paper's (appendix Tables 3 and 5).

    Attributes:
        dataset: one of ``TEXTURES``.
        hidden: ConcatSquash widths before the scalar output (paper: 64-64-1).
        horp_width: columns of the HorP weight; None is k = 1 (the paper: one 3-vector).
        fourier_scale: None (the paper): tanh(HorP) features. A float: periodic features
            ``[sin, cos](HorP)`` with the HorP weight drawn from N(0, fourier_scale^2), see
            `Potential`. Needed for thin structure such as spiral arms.
        sigma: prior ``U = sigma^2 I_3``, ``V = I_1``, ``M = e_1`` (paper: 0.3).
        T, train_T: end time and whether it is learned.
        divergence, method, atol, rtol: see `GrCNF`.
        n_val, n_test, data_seed: the fixed held-out sets.
        objective: ``"mle"`` (maximum likelihood through the ODE, the paper), ``"fm"``
            (Riemannian flow matching, simulation-free) or ``"fm-ot"`` (flow matching with
            minibatch optimal-transport pairs); each gives a GrCNF checkpoint.
        train: optimizer and schedule.
    """

    dataset: str = "2spirals"
    hidden: tuple[int, ...] = (64, 64)
    horp_width: int | None = None
    fourier_scale: float | None = None
    sigma: float = 0.3
    T: float = 1.0
    train_T: bool = True
    divergence: str = "exact"
    method: str = "cayley_rkmk"
    atol: float = 1e-5
    rtol: float = 1e-5
    n_val: int = 500
    n_test: int = 500
    data_seed: int = 0
    objective: str = "mle"
    train: TrainConfig = field(default_factory=lambda: PAPER_TEXTURES)

    def __post_init__(self):
        if self.dataset not in TEXTURES:
            raise ValueError(f"unknown texture {self.dataset!r}; choose from {TEXTURES}")
        if self.objective not in OBJECTIVES:
            raise ValueError(
                f"objective must be one of {tuple(OBJECTIVES)}, got {self.objective!r}"
            )
        self.hidden = tuple(self.hidden)
        w = self.horp_width
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(f"horp_width must be a positive integer or None, got {w!r}")
        if self.fourier_scale is not None and not self.fourier_scale > 0:
            raise ValueError(f"fourier_scale must be positive or None, got {self.fourier_scale}")
        if isinstance(self.train, dict):
            self.train = TrainConfig.from_dict(self.train)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["train"] = self.train.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TexturesExperiment:
        return cls(**d)


# Flow matching runs ~200 iterations a second on one CPU core, while one validation NLL
# (exact-divergence ODE on 500 lines) costs seconds: validate rarely.
_FM_TRAIN = PAPER_TEXTURES.replace(
    batch_size=200, iterations=1_000_000, lr_step=None, val_every=5000, checkpoint_every=1000,
    log_every=100,
)

PRESETS: dict[str, TexturesExperiment] = {
    # the paper's model, objective and optimizer (appendix Tables 3 and 5)
    "paper": TexturesExperiment(),
    # Fourier HorP features, a wider potential, flow matching. On 2spirals, 60 s of training:
    # MMD^2 1.5x the data floor with visible arms; every tanh-feature variant 2.5-3.2x, no arms
    "fourier": TexturesExperiment(
        hidden=(128, 128), horp_width=32, fourier_scale=4.0, objective="fm", train=_FM_TRAIN
    ),
}
"""Named texture presets; `preset` returns a copy for one dataset."""


def preset(name: str, dataset: str = "2spirals", **changes) -> TexturesExperiment:
    """A copy of ``PRESETS[name]`` for ``dataset`` with dataclass field ``changes``."""
    if name not in PRESETS:
        raise ValueError(f"unknown texture preset {name!r}; choose from {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name], dataset=dataset, **changes)


def describe(exp: TexturesExperiment) -> str:
    """One line naming the objective and the potential's features, e.g. for the demo."""
    objective = {"mle": "maximum likelihood", "fm": "flow matching",
                 "fm-ot": "flow matching (minibatch OT pairs)"}.get(exp.objective,
                                                                    exp.objective)  # fmt: skip
    if exp.fourier_scale is None:
        features = f"tanh HorP features (width {exp.horp_width or 1}, the paper's)"
    else:
        width, scale = exp.horp_width or 1, exp.fourier_scale
        features = f"Fourier HorP features (width {width}, scale {scale:g})"
    hidden = "-".join(map(str, exp.hidden))
    return f"objective {exp.objective} ({objective}); potential {features}, hidden {hidden}"


# `grassflow demo`: the preset that draws the best spiral in ~3 CPU minutes (the paper's MLE
# model reaches test NLL ~0.8 and a blurred spiral there). A fixed number of iterations, not a
# time budget, so that the picture is the same on an idle and on a busy machine (bit for bit
# on one thread); a busy machine only takes longer.
DEMO = preset("fourier", train=_FM_TRAIN.replace(iterations=25_000, log_every=50))

# `grassflow demo --preset paper`: the earlier demo, the paper's MLE model with a smaller batch
DEMO_PAPER = TexturesExperiment(
    train=PAPER_TEXTURES.replace(
        batch_size=200, iterations=400, lr_step=None, val_every=200, checkpoint_every=200,
        log_every=20,
    ),
)


def build_model(exp: TexturesExperiment) -> GrCNF:
    """The GrCNF of ``exp`` on Gr(1, 3) with prior mean e1 (the paper's for the defaults)."""
    with seeded_init(exp.train.seed):
        return GrCNF(
            Grassmann(1, 3),
            GrassmannField(
                Potential(
                    3, 1, exp.hidden, horp_width=exp.horp_width, fourier_scale=exp.fourier_scale
                )
            ),
            sigma=exp.sigma,
            T=exp.T,
            train_T=exp.train_T,
            divergence=exp.divergence,
            method=exp.method,
            atol=exp.atol,
            rtol=exp.rtol,
        )


def held_out(exp: TexturesExperiment, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The held-out ``"val"`` and ``"test"`` draws of ``exp``'s texture (seeded), ``(N, 3, 1)``."""
    return texture_splits(exp.dataset, exp.n_val, exp.n_test, exp.data_seed, dtype=dtype)


def texture_stream(dataset: str, dtype: torch.dtype):
    """A training-loop sampler ``(n, generator) -> (n, 3, 1)`` drawing fresh texture batches."""

    def sampler(n: int, generator: torch.Generator) -> torch.Tensor:
        seed = int(torch.randint(2**62, (1,), generator=generator))
        return sample_texture(dataset, n, seed=seed, dtype=dtype)

    return sampler


def claim(
    exp: TexturesExperiment, run_dir: str | Path, force: bool = False, resume: bool = True
) -> dict:
    """`run_dir.claim_run_dir` for ``exp``; returns its held-out splits.

    The training stream is generated, so the data's identity is the hash of the held-out
    splits that the same generator draws.
    """
    splits = held_out(exp, getattr(torch, exp.train.dtype))
    claim_run_dir(run_dir, exp.to_dict(), data_identity(**splits), kind="textures", force=force,
                  resume=resume)  # fmt: skip
    return splits


def run(
    exp: TexturesExperiment,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    force: bool = False,
    callback: Callback | None = None,
    setup: Stopwatch | None = None,
) -> TrainResult:
    """Train (or resume) one texture model in ``run_dir`` (``callback``, ``setup``: see
    ``train``).

    ``run_dir`` must be new or hold the same preset and data (`claim`); ``force``
    deletes a mismatched one instead of raising.
    """
    splits = claim(exp, run_dir, force, resume)
    return train(
        build_model(exp),
        texture_stream(exp.dataset, getattr(torch, exp.train.dtype)),
        exp.train,
        run_dir,
        val_data=splits["val"],
        objective=OBJECTIVES[exp.objective],
        resume=resume,
        progress=progress,
        callback=callback,
        setup=setup,
    )


def load_run(run_dir: str | Path, which: str = "best") -> tuple[TexturesExperiment, GrCNF]:
    """The preset and the trained model (``which``: ``"best"`` or ``"last"``), in eval mode."""
    return load_trained(run_dir, TexturesExperiment.from_dict, build_model, "texture", which)


def evaluate(
    run_dir: str | Path, n_samples: int = 1000, seed: int = 0, batch_size: int = 250
) -> dict:
    """Test NLL (exact divergence) beside the prior's and the uniform's, and MMD to test data.

    The MMD rows include two references measured the same way: the prior, and a second
    independent draw of the data (the noise floor). Writes ``eval.json``.

    ODE solves run in chunks of ``batch_size`` points; under torchrun the chunks are shared
    among the ranks (same result for any number of ranks) and rank 0 writes the file.
    """
    exp, model = load_run(run_dir)
    dtype = model.dtype
    test = held_out(exp, dtype)["test"]
    gen = torch.Generator().manual_seed(seed)
    logp, nfes = distributed_log_prob(model, test, batch_size, with_nfe=True)
    nll = -logp
    samples = distributed_transport(model, model.sample_prior(n_samples, gen), batch_size)
    prior = model.prior()
    fresh = sample_texture(exp.dataset, n_samples, seed=seed + 12345, dtype=dtype)
    gr = model.manifold
    result = {
        "dataset": exp.dataset,
        "n_test": len(test),
        "test_nll": nll.mean().item(),
        "test_nll_sem": (nll.std() / len(nll) ** 0.5).item(),
        "prior_nll": -prior.log_prob(test).mean().item(),
        "uniform_nll": gr.log_volume(),
        "T": model.T.item(),
        "mmd_bandwidth": MMD_BANDWIDTH,
        "mmd2_model": mmd2(samples, test, MMD_BANDWIDTH).item(),
        "mmd2_prior": mmd2(prior.sample((n_samples,), generator=gen), test, MMD_BANDWIDTH).item(),
        "mmd2_data": mmd2(fresh, test, MMD_BANDWIDTH).item(),
        "antipodal_max_dist": _antipodal_gap(model, n=200, seed=seed),
        "nfe_test": max(nfes),  # of the test chunks' solves
    }
    if dd.is_main():
        write_json(result, Path(run_dir) / "eval.json")
    return result


def _antipodal_gap(model: GrCNF, n: int, seed: int) -> float:
    """Largest Gr distance between the flow of Y0 and of -Y0 (equal lines in exact math)."""
    Y0 = model.sample_prior(n, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        gap = model.manifold.dist(model.transport_forward(Y0), model.transport_forward(-Y0))
    return gap.max().item()


def plot_run(run_dir: str | Path, n_samples: int = 2000, seed: int = 0) -> list[Path]:
    """``textures.png`` (Data / Generated / Density) and ``antipodal.png`` for one run."""
    exp, model = load_run(run_dir)
    dtype = model.dtype
    gen = torch.Generator().manual_seed(seed)
    data = sample_texture(exp.dataset, n_samples, seed=seed, dtype=dtype)
    Y0 = model.sample_prior(n_samples, gen)
    out = Path(run_dir)
    with torch.no_grad():
        generated = model.transport_forward(Y0)
        antipodal = model.transport_forward(-Y0)
    figure_textures(
        [
            SphereColumn("Prior", Y0, None, model.prior().log_prob),
            SphereColumn(exp.dataset, data, generated, density_fn(model)),
        ],
        out / "textures.png",
        dtype=dtype,
    )
    figure_antipodal(-Y0, {exp.dataset: antipodal}, out / "antipodal.png")
    return [out / "textures.png", out / "antipodal.png"]


def density_fn(model: GrCNF):
    """``Y -> model.log_prob(Y)`` without gradients, in the model's dtype (for the pictures)."""

    def log_prob(Y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model.log_prob(Y.to(model.dtype))

    return log_prob


def plot_prior(path: str | Path, sigma2: float = 0.5) -> Path:
    """The paper's appendix prior figure: M = e1, U = sigma^2 I, V = I, sigma^2 = 0.5."""
    gr = Grassmann(1, 3)
    eye = torch.eye(3, dtype=torch.float64)
    prior = MatrixGaussianPrior(gr, eye[:, :1], sigma2 * eye, eye[:1, :1])
    figure_prior_views(prior.log_prob, path, dtype=torch.float64)
    return Path(path)


def eval_summary(result: dict) -> str:
    """Two lines on an `evaluate` result: NLLs against the prior and uniform, and MMD²."""
    r = result
    return (
        f"[{r['dataset']}] test NLL {r['test_nll']:.3f} ± {r['test_nll_sem']:.3f} nats | prior "
        f"{r['prior_nll']:.3f} | uniform {r['uniform_nll']:.3f} (= log V_Gr(1,3))\n"
        f"[{r['dataset']}] MMD² (h={r['mmd_bandwidth']}) model {r['mmd2_model']:.4f} | prior "
        f"{r['mmd2_prior']:.4f} | data-vs-data floor {r['mmd2_data']:.4f}"
    )


RUN_KIND = RunKind(
    evaluate=lambda run_dir, n_samples, seed: eval_summary(
        evaluate(run_dir, n_samples=n_samples, seed=seed)),
    sample=lambda run_dir, n, seed, out: save_samples(load_run(run_dir)[1], n, seed, out),
    plot=plot_run,
)
