"""The library's shape model (`grassflow.flows.ShapeFlow`) on the vs-E-NF protocol; with
``geometry="cartesian"`` it is the equivariant flow-matching (EFM) baseline. Same files,
splits, CPU budgets and evaluation as the two-part model's runs of `vs_enf`, so their rows
sit side by side in ``results/vs_enf.json``.

* Budget: ``minutes`` of training CPU time (validation apart), like the two-part model's
  total.
* Training in ``dtype`` and evaluation in ``eval_dtype`` (float32 by default: about two
  to three times the work per CPU second of float64 on this CPU), at atol = rtol = ``tol``.

A run directory ``<runs_dir>/<system>-<model>-n<n_train>-s<seed>`` holds ``experiment.json``,
``data.json``, ``flow/`` (the training run) and ``eval.json``.

QM9 with ``atom_types``: each molecule's atom types (H, C, N, O, F) are node features of the
EGNN, given per molecule, so the model is the conditional density ``p(x | a)`` of the
positions given the atoms' types, on E-NF's 54-D centred space; samples are drawn for the
types of training molecules. It is not E-NF's positional density ``p(x)``, which must also
say which atom is which. A positional density follows by mixing over the labellings,
``q(x) = sum_a q(a) p(x | a)`` with ``q(a) = p(c(a)) / M(c(a))`` (``p(c)``: the training
compositions' frequencies, add-one over all compositions of 19 atoms; ``M(c)``: the labellings
of composition ``c``). Since ``q(x) >= q(a) p(x | a)``, its NLL is at most
``-log p(x | a) - log p(c) + log M(c)`` (`positional_bound`): an upper bound of a positional
NLL on E-NF's space, which is what the rows report beside the conditional NLL.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from grassflow.data.overlap import novel_mask
from grassflow.flows import ShapeFlow, ShapeFlowConfig
from grassflow.flows.shape_flow import pack_labels
from grassflow.manifolds.shape_paths import GEOMETRIES
from grassflow.metrics import closest_pair_fraction, distance_histogram, jsd, mean_sem
from grassflow.tasks.registry import RunKind
from grassflow.tasks.run_dir import claim_run_dir, data_identity, read_preset, training_status
from grassflow.tasks.shape_runs import save_sampled_clouds
from grassflow.training import (
    CFM_COUPLINGS,
    TrainConfig,
    checkpoint_path,
    fit_shape_flow,
    load_checkpoint,
    load_shape_flow,
)
from grassflow.training.checkpoint import write_json
from grassflow.training.clock import Stopwatch
from grassflow.training.rng import seeded_init

from .enf_protocol import SHAPES, data_dir_of, eval_summary, load_enf_splits

SYSTEMS = {**SHAPES, "qm9": (19, 3), "lj55": (55, 3)}  # QM9 positional: E-NF's split
_DEFAULTS = ShapeFlowConfig(2, 1)  # the model's defaults (EGNN, coupling, geometry)
LJ55_SPLIT = (250, 125, 125)  # chains of `grassflow data make lj55` in train, val and test
# preset fields added after runs were made: the value those runs had without saying so
ADDED_FIELDS = {"coupling": "equivariant-ot", "geometry": "cartesian", "atom_types": False}
QM9_TYPES = (1, 6, 7, 8, 9)  # atomic numbers of QM9's elements, in label order

__all__ = [
    "RUN_KIND",
    "QM9_TYPES", "SYSTEMS", "EFMExperiment", "build_model", "evaluate", "load_run",
    "load_splits", "model_name", "positional_bound", "run", "sample",
]  # fmt: skip


@dataclass
class EFMExperiment:
    """One baseline run. ``minutes`` and ``iterations`` may grow (the run continues); any
    other change is another run.

    Attributes:
        system (``"dw4"``, ``"lj13"``, ``"qm9"``), n_train, seed: as
            `vs_enf.ENFExperiment`; QM9 is E-NF's positional split (its 13,832 training
            molecules at most, validation on ``valid``, the 1,813 test molecules).
        minutes: training CPU minutes (validation apart).
        tol: atol = rtol of validation and of the test NLL.
        hidden, layers, attention, coord_range: the EGNN's.
        lr, batch_size: Adam's; coupling: of the flow-matching pairs.
        geometry: of the flow-matching paths (`grassflow.manifolds.shape_paths`).
        dtype: of training.
        n_val: validation configurations (exact NLL after ``val_doubling_from`` x 1, 2, 4,
            ... iterations, every ``val_every_minutes`` and at the end; None: not then).
        data_dir: the Klein files' folder (None: the shared one), or for QM9 the cache of
            `grassflow.data.qm9.load_qm9_positional` (None: ``data``).
        atom_types: QM9 only: the atom types per molecule are node features, and the model
            is ``p(x | a)`` (the module's docstring).
        chunk_size: configurations per ODE solve of the exact NLL (small chunks keep the
            (n - 1) d forward-mode products in cache).
        eval_dtype: of validation and the test NLL. float32 costs a third of float64's CPU
            time; at atol = rtol = 1e-4 the solver's error, not rounding, sets the accuracy
            (they agree to ~1e-3 nats: tests/test_shape_flow.py and the README).
    """

    system: str = "dw4"
    n_train: int = 1000
    seed: int = 0
    minutes: float = 7.0
    tol: float = 1e-4
    hidden: int = _DEFAULTS.hidden
    layers: int = _DEFAULTS.layers
    attention: bool = _DEFAULTS.attention
    coord_range: float = _DEFAULTS.coord_range
    lr: float = 1e-3
    batch_size: int = 64
    coupling: str = _DEFAULTS.coupling
    geometry: str = _DEFAULTS.geometry
    dtype: str = "float32"
    n_val: int = 100
    val_every_minutes: float | None = 2.0
    val_doubling_from: int | None = None
    iterations: int = 10**7
    chunk_size: int = 8
    eval_dtype: str = "float32"
    data_dir: str | None = None
    atom_types: bool = False

    def __post_init__(self):
        if self.system not in SYSTEMS:
            raise ValueError(f"system must be one of {tuple(SYSTEMS)}, got {self.system!r}")
        if self.coupling not in CFM_COUPLINGS:
            raise ValueError(f"coupling must be one of {CFM_COUPLINGS}, got {self.coupling!r}")
        if self.geometry not in GEOMETRIES:
            raise ValueError(f"geometry must be one of {GEOMETRIES}, got {self.geometry!r}")
        if not (isinstance(self.minutes, (int, float)) and self.minutes > 0):
            raise ValueError(f"minutes must be > 0, got {self.minutes!r}")

    @property
    def model(self) -> str:
        geometry = "" if self.geometry == "cartesian" else f"-{self.geometry}"
        types = "-types" if self.atom_types else ""
        return (f"efm-egnn{self.hidden}x{self.layers}-{self.coupling}{geometry}{types}"
                f"-lr{self.lr:g}-b{self.batch_size}")  # fmt: skip

    @property
    def run_name(self) -> str:
        return f"{self.system}-{self.model}-n{self.n_train}-s{self.seed}"

    def command(self) -> str:
        """The ``grassflow reproduce vs-enf`` line of this run."""
        return (f"grassflow reproduce vs-enf --model equivariant-cnf --systems {self.system} "
                f"--n-train {self.n_train} --seeds {self.seed} --minutes {self.minutes:g} "
                f"--hidden {self.hidden} --layers {self.layers} --lr {self.lr:g} "
                f"--batch-size {self.batch_size} --coupling {self.coupling} "
                f"--geometry {self.geometry} " + "--atom-types " * self.atom_types +
                f"--tol {self.tol:g}" + self._validation_options())  # fmt: skip

    def _validation_options(self) -> str:
        default, out = EFMExperiment(), ""
        for name in ("n_val", "chunk_size"):
            if getattr(self, name) != getattr(default, name):
                out += f" --{name.replace('_', '-')} {getattr(self, name)}"
        if self.val_every_minutes != default.val_every_minutes:
            every = self.val_every_minutes
            out += f" --val-every-minutes {'inf' if every is None else f'{every:g}'}"
        return out

    def config(self) -> TrainConfig:
        return TrainConfig(
            lr=self.lr, batch_size=min(self.batch_size, self.n_train), iterations=self.iterations,
            val_every=None, val_doubling_from=self.val_doubling_from,
            val_every_minutes=self.val_every_minutes,
            log_every=200, checkpoint_every=200, seed=self.seed, dtype=self.dtype,
            total_budget_minutes=self.minutes,
        )  # fmt: skip

    def shape_config(self) -> ShapeFlowConfig:
        """The model's `ShapeFlowConfig`."""
        if self.atom_types and self.system != "qm9":  # a sweep's base sets the system later
            raise ValueError(f"atom_types is for QM9, whose molecules differ in composition; "
                             f"{self.system} has one kind of particle")  # fmt: skip
        return ShapeFlowConfig(
            *SYSTEMS[self.system], geometry=self.geometry, coupling=self.coupling,
            hidden=self.hidden, layers=self.layers, attention=self.attention,
            coord_range=self.coord_range, atol=self.tol, rtol=self.tol,
            chunk_size=self.chunk_size, n_labels=len(QM9_TYPES) if self.atom_types else None,
        )  # fmt: skip

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EFMExperiment:
        return cls(**d)


def build_model(exp: EFMExperiment) -> ShapeFlow:
    """The untrained model of ``exp`` (weights seeded by ``exp.seed``) in ``eval_dtype``."""
    with seeded_init(exp.seed):
        return ShapeFlow.from_config(exp.shape_config()).to(getattr(torch, exp.eval_dtype))


def load_splits(system: str, n_train: int, data_dir: str | None = None,
                atom_types: bool = False) -> dict:  # fmt: skip
    """``{"train", "val", "test"}`` clouds ``(N, n, d)`` float64: `enf_protocol.load_enf_splits`
    for DW4 and LJ13; for QM9 the first ``n_train`` training molecules of E-NF's split, its
    validation and its 1,813 test molecules (centred); with ``atom_types`` packed with their
    type indices into `QM9_TYPES` (``(N, 19, 4)``, `grassflow.flows.shape_flow.pack_labels`)."""
    if system == "lj55":
        return load_lj55_splits(n_train, data_dir)
    if system != "qm9":
        return load_enf_splits(system, n_train, data_dir)
    from .qm9_runs import load_molecules

    cache = "data" if data_dir is None else data_dir
    X = load_molecules(cache)
    if atom_types:
        from grassflow.data.qm9 import load_qm9_positional

        charges = load_qm9_positional(cache, progress=False)
        index = torch.full((max(QM9_TYPES) + 1,), -1, dtype=torch.int64)
        index[list(QM9_TYPES)] = torch.arange(len(QM9_TYPES))
        X = {s: pack_labels(X[s], index[torch.as_tensor(charges[f"{s}_charges"])]) for s in X}
    return {"train": X["train"][:n_train], "val": X["valid"], "test": X["test"]}


def positional_bound(log_p: torch.Tensor, labels: torch.Tensor, train_labels: torch.Tensor,
                     n_types: int = len(QM9_TYPES)) -> torch.Tensor:  # fmt: skip
    """An upper bound ``(B,)`` of the NLL of a positional density made from a conditional
    one (the module's docstring): ``-log_p - log p(c) + log M(c)`` for molecules of labels
    ``labels: (B, n)`` with ``log_p = log p(x | a)``, ``p(c)`` the compositions'
    frequencies in ``train_labels: (N, n)`` with one added to each of the ``C(n + K - 1,
    K - 1)`` compositions of n atoms of ``n_types`` = K types, and
    ``M(c) = n! / prod_k c_k!`` labellings."""
    def counts(a: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(a, n_types).sum(-2)

    n = labels.shape[-1]
    train = counts(train_labels)
    c = counts(labels)
    seen = (c[:, None, :] == train[None]).all(-1).sum(-1).double()  # (B,)
    n_comp = math.comb(n + n_types - 1, n_types - 1)
    log_pc = torch.log((seen + 1) / (len(train) + n_comp))
    log_m = math.lgamma(n + 1) - torch.lgamma(c.double() + 1).sum(-1)
    return -log_p.double() - log_pc + log_m


def load_lj55_splits(n_train: int, data_dir: str | None = None) -> dict:
    """LJ55 from ``grassflow data make lj55`` (``<data_dir>/lj55.npy``, default ``data``):
    its rows are (state, chain) in time-major order; whole chains go to one split
    (`LJ55_SPLIT` of the 500 chains), so no split shares a chain. ``train``: its first
    ``n_train`` rows (chain-major); all centred float64 ``(N, 55, 3)``."""
    from grassflow.data.mcmc import DATASET_DEFAULTS

    path = Path("data" if data_dir is None else data_dir) / "lj55.npy"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: make it with `grassflow data make lj55 "
                                f"--out {path.parent}` (~9 CPU minutes)")  # fmt: skip
    X = torch.as_tensor(np.load(path), dtype=torch.float64)
    chains = DATASET_DEFAULTS["lj55"]["n_chains"]
    if X.ndim != 2 or X.shape[1] != 165 or len(X) % chains:
        raise ValueError(f"{path}: expected (states x {chains}, 165) rows from `grassflow data "
                         f"make lj55`, got {tuple(X.shape)}")  # fmt: skip
    X = X.reshape(-1, chains, 55, 3).transpose(0, 1)  # (chain, state, 55, 3)
    X = X - X.mean(-2, keepdim=True)
    a, b, _ = LJ55_SPLIT
    parts = X[:a], X[a : a + b], X[a + b :]
    train, val, test = (p.reshape(-1, 55, 3) for p in parts)
    if n_train > len(train):
        raise ValueError(f"n_train = {n_train} > the {len(train)} LJ55 training configurations")
    return {"train": train[:n_train], "val": val, "test": test}


def _splits(exp: EFMExperiment) -> dict:
    return load_splits(exp.system, exp.n_train, exp.data_dir, exp.atom_types)


def _sample_labels(model: ShapeFlow, train: torch.Tensor, n: int, seed: int):
    """The labels of ``n`` training molecules (seeded), for a model with labels per cloud;
    else None."""
    if not model.labels_per_cloud:
        return None
    pick = torch.randint(len(train), (n,), generator=torch.Generator().manual_seed(seed))
    return model.split_labels(train[pick], dtype=False)[1]


def _protocol(exp: EFMExperiment) -> dict:
    if exp.system == "qm9":
        return {"protocol": "qm9 positional (E-NF's split)"}
    if exp.system == "lj55":
        return {"protocol": f"lj55 by MCMC, chains split {LJ55_SPLIT}"}
    return {"protocol": "vs_enf.ENF_SPLITS", "path": str(data_dir_of(exp.data_dir).resolve())}


def run(exp: EFMExperiment, run_dir: str | Path, *, force: bool = False, progress: bool = True,
        data: dict | None = None) -> None:  # fmt: skip
    """Train (or continue) ``exp`` in ``run_dir`` on ``data`` (default its splits)."""
    data = _splits(exp) if data is None else data
    identity = {**_protocol(exp),
                **data_identity(**{s: data[s] for s in ("train", "val", "test")})}  # fmt: skip
    claim_run_dir(run_dir, exp.to_dict(), identity, kind="efm", added=ADDED_FIELDS, force=force,
                  budget_keys=("minutes", "iterations"))  # fmt: skip
    fit_shape_flow(build_model(exp), data["train"], data["val"][: exp.n_val],
                   Path(run_dir) / "flow", exp.config(), progress=progress)  # fmt: skip


def load_run(run_dir: str | Path) -> tuple[EFMExperiment, ShapeFlow]:
    """The preset and the model (``eval_dtype``) with the best validation checkpoint."""
    exp = read_preset(Path(run_dir), EFMExperiment.from_dict, "vs-enf")
    path = checkpoint_path(Path(run_dir) / "flow", "best")
    return exp, load_shape_flow(build_model(exp), path.parent, path.stem)


def sample(run_dir: str | Path, n: int, seed: int = 0) -> np.ndarray:
    """``n`` generated configurations ``(n, n_points, d)``, centred (with atom types: for
    those of ``n`` training molecules drawn with ``seed``)."""
    exp, model = load_run(run_dir)
    labels = _sample_labels(model, _splits(exp)["train"], n, seed)
    return model.sample(n, torch.Generator().manual_seed(seed), labels=labels).numpy()


def evaluate(run_dir: str | Path, data: dict | None = None) -> dict:
    """Exact test NLL (nats per configuration, with SEM) of the best checkpoint, the same on
    the novel test configurations, training and evaluation minutes and the parameter count,
    as `vs_enf.evaluate` gives for the two-part model. Writes ``eval.json``; an existing one is
    returned if it evaluated the run as it stands on the same test set."""
    run_dir = Path(run_dir)
    exp = read_preset(run_dir, EFMExperiment.from_dict, "vs-enf")
    data = _splits(exp) if data is None else data
    status = training_status(run_dir / "flow")
    done, test_hash = run_dir / "eval.json", data_identity(test=data["test"])["test"]
    if done.exists():
        old = json.loads(done.read_text())
        if (old.get("test_hash"), old.get("iterations"), old.get("train_minutes")) == (
            test_hash, status["iterations"], status["trained_minutes"]):
            return old
    _, model = load_run(run_dir)
    nfe = []
    with torch.no_grad(), Stopwatch() as watch:
        chunks = []
        for c in data["test"].to(model.dtype).split(exp.chunk_size):
            chunks.append(model.log_prob(c).double())
            nfe.append(model.last_stats["nfe"])
        nll = -torch.cat(chunks)
    novel = torch.as_tensor(novel_mask(data["test"], data["train"], data["val"]))
    extra = {}
    if exp.system == "qm9":  # E-NF's sample metrics: distance JSD and broken molecules
        labels = _sample_labels(model, data["train"], 1000, exp.seed)
        samples = model.sample(1000, torch.Generator().manual_seed(exp.seed), labels=labels)
        samples = samples.double().numpy()
        np.save(run_dir / "samples.npy", samples.astype(np.float32))
        train = data["train"][..., :3].numpy()
        extra = {"jsd": jsd(distance_histogram(samples), distance_histogram(train)),
                 "broken_fraction": closest_pair_fraction(samples)}  # fmt: skip
        if labels is not None:
            np.save(run_dir / "sample_labels.npy", labels.numpy())
            bound = positional_bound(-nll, model.split_labels(data["test"], dtype=False)[1],
                                     model.split_labels(data["train"], dtype=False)[1])  # fmt: skip
            extra.update(mean_sem("test_nll_positional_bound", bound))
    best = run_dir / "flow" / "best.pt"
    best = int(load_checkpoint(best)["iteration"]) if best.exists() else None
    result = {
        "system": exp.system, "model": exp.model, "n_train": exp.n_train, "seed": exp.seed,
        "n_train_distinct": len(data["train"]), "budget_minutes": exp.minutes,
        "n_test": len(nll), "test_hash": test_hash, **mean_sem("test_nll", nll),
        "n_test_novel": int(novel.sum()), **mean_sem("test_nll_novel", nll[novel]),
        "atol": exp.tol, "rtol": exp.tol, "params": sum(p.numel() for p in model.parameters()),
        "prior_std": model.prior_std.item(), "eval_nfe_median": float(np.median(nfe)),
        "iterations": status["iterations"], "clock": status["clock"],
        "threads": status["threads"], "train_minutes": status["trained_minutes"],
        **{f"train_{c}_minutes": status[f"{c}_minutes"] for c in ("cpu", "wall")},
        **{f"val_{c}_minutes": status[f"val_{c}_minutes"] for c in ("cpu", "wall")},
        "eval_cpu_minutes": watch.cpu / 60, "eval_wall_minutes": watch.wall / 60,
        "best_iteration": best, **extra,
    }  # fmt: skip
    write_json(result, done)
    return result


def model_name(exp: EFMExperiment) -> str:
    """The model of a run, in words: ``"ShapeFlow (EFM baseline)"`` for the Cartesian
    geometry, else ``"ShapeFlow (<geometry> geometry)"``."""
    return "ShapeFlow " + ("(EFM baseline)" if exp.geometry == "cartesian"
                           else f"({exp.geometry} geometry)")  # fmt: skip


def _sample_comment(run_dir: str | Path, seed: int) -> str:
    """The comment line of sampled ``.xyz`` frames: which model of which run drew them."""
    exp = read_preset(Path(run_dir), EFMExperiment.from_dict, "vs-enf")
    return f"grassflow {model_name(exp)} sample, seed {seed}, run {run_dir}"


RUN_KIND = RunKind(
    evaluate=lambda run_dir, n_samples, seed: eval_summary(evaluate(run_dir)),
    sample=lambda run_dir, n, seed, out: save_sampled_clouds(
        sample(run_dir, n, seed), out, comment=_sample_comment(run_dir, seed)),
)
