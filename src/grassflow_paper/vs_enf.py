"""Like-for-like with E-NF (issue 14): exact Cartesian test NLL on DW4 and LJ13.

Same data, space and CPU budget as the anchors (`ANCHORS`): the Klein et al. files in
``../shared/data/alt_klein2023_from_DEM/`` split as `ENF_SPLITS`; densities w.r.t.
Lebesgue measure on the (n - 1) d CoM-free (Helmert) coordinates, nats per configuration. A
run trains the two-part model (`two_part.TwoPartShapeFlow`, the "shapeflow" rows) in two
resumable stages (`two_part.train_shape_flow`): the GrCNF on Gr(d, n - 1), then the Gram
density. That model left the library in issue 34 (last there in commit 3531f93); these rows
are kept as the diagnosis of it.

* Budget: ``minutes`` is the total training CPU time of both parts (validation apart);
  the Gram density gets ``min(gram_max_minutes, gram_fraction minutes)`` (default
  ``min(1, 0.1 minutes)``), the flow the rest. Both shares grow with
  ``minutes``, so a larger budget continues the run and the same one trains nothing more.
* Tolerance: one ``tol`` (atol = rtol; default 1e-4, E-NF's) for the validation that selects
  checkpoints and for the test NLL; ``eval.json`` records it.
* Threads: `sweep` runs on torch's current thread count (the CLI's ``--threads``,
  default 1, like the anchors), recorded in every row.

Run directories ``<runs_dir>/<system>-<potential>-<objective>-n<n_train>-s<seed>`` hold
``experiment.json``, ``data.json``, ``flow/``, ``gram/`` and ``eval.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from grassflow.data.overlap import novel_mask
from grassflow.manifolds.shape_space import helmert_basis
from grassflow.metrics import mean_sem
from grassflow.tasks.registry import RunKind
from grassflow.tasks.run_dir import (
    claim_run_dir,
    data_identity,
    read_preset,
    test_subset,
    training_status,
)
from grassflow.tasks.shape_runs import save_sampled_clouds
from grassflow.training import OBJECTIVES, TrainConfig, load_checkpoint
from grassflow.training.checkpoint import write_json
from grassflow.training.clock import Stopwatch
from grassflow.training.rng import seeded_init

from . import efm  # the baseline's runs, which `sweep` runs too
from .enf_protocol import (  # re-exported: the protocol's names, as before
    ENF_SPLITS,
    KLEIN_DIR,
    SHAPES,
    data_dir_of,
    eval_summary,
    load_enf_splits,
)
from .qm9_runs import QM9Experiment
from .two_part import (
    DEFAULT_LAYERS,
    GRAMS,
    POTENTIALS,
    TwoPartShapeFlow,
    load_shape_flow,
    preset_field_options,
    split_budget,
    train_shape_flow,
)

__all__ = [
    "RUN_KIND",
    "ANCHORS", "ENF_SPLITS", "ENFExperiment", "KLEIN_DIR", "SHAPES", "build_model",
    "data_dir_of", "eval_summary", "evaluate",
    "isotropic_gaussian_nll", "load_enf_splits", "markdown_table", "merge_rows", "qm9_model",
    "qm9_row", "run", "sweep",
]  # fmt: skip

# preset fields added after runs were made: the value those runs had without saying so
ADDED_FIELDS = {"gram_components": 1, "gram_fraction": 0.1, "gram_max_minutes": 1.0,
                "gram": "wishart"}  # fmt: skip
PARTS = ("grassmann", "gram", "jacobian")  # of TwoPartShapeFlow.log_prob_terms

_PAPER_PROTOCOL = "a density on uncentred Gr(k, n), not on these coordinates: not comparable"
# Klein et al. 2023 on these files (GPU, long training); their bgflow prior leaves out the
# log-normalizer, so issue 21's 1.68 and -16.07 plus ((n - 1) d / 2) ln 2 pi
_EFM_NOTE = ("these files; GPU; published value (as issue 21 quotes it) + ((n-1)d/2) ln 2π, "
             "see results/published_nll_conventions.md")  # fmt: skip

# Issue 14, "Anchors" (n_train = 1,000; test NLL in nats on the CoM-free coordinates):
# (model, training minutes, test NLL, note). E-NF: vgsatorras/en_flows' default settings
# trained on this kind of machine, one CPU thread, on the Klein files, evaluated at
# atol = rtol = 1e-4. "E-NF (paper)": Garcia Satorras et al. 2021, its own data. "EFM
# (paper)": Klein, Krämer & Noé 2023, the model the baseline (`efm`) reimplements.
# Midgley et al. 2023 (SE(3) augmented coupling flows): GPU, E-NF's data, 3 seeds.
ANCHORS = {
    "dw4": [("E-NF", 7, 7.92, "1 CPU thread, same split, atol = rtol = 1e-4"),
            ("E-NF", 20, 7.64, "1 CPU thread, same split, atol = rtol = 1e-4"),
            ("E-NF (paper)", None, 8.15, "its own data: not the same test set"),
            ("EFM (paper), normalized", None, 7.19, _EFM_NOTE),
            ("Midgley et al. 2023", None, 8.71, "GPU; on E-NF's files, another Boltzmann density"),
            ("isotropic Gaussian (issue 14)", None, 12.94, "as quoted in the issue"),
            ("GrCNF (paper, Table 1)", None, -13.74, _PAPER_PROTOCOL)],
    "lj13": [("E-NF", 7, 31.85, "1 CPU thread, same split, atol = rtol = 1e-4"),
             ("E-NF (paper)", None, 30.56, "its own data: not the same test set"),
             ("EFM (paper), normalized", None, 17.0, _EFM_NOTE),
             ("Midgley et al. 2023", None, 30.21,
              "GPU; on E-NF's files, another Boltzmann density"),
             ("isotropic Gaussian (issue 14)", None, 38.67, "as quoted in the issue"),
             ("GrCNF (paper, Table 1)", None, -58.02, _PAPER_PROTOCOL)],
    # QM9 positional, 1,813 test molecules; the papers' own data pipeline (E-NF's split)
    "qm9": [("E-NF (paper)", None, -70.2, "exact NLL; 54-D centred space", {"jsd": 0.006}),
            ("GrCNF (paper)", None, -85.3, "-ELBO on uncentred Gr(3, 19): not comparable",
             {"jsd": 0.005}),
            ("Midgley et al. 2023", None, -136.3, "best published; GPU"),
            ("equivariant CNF as diffusion (Midgley et al. 2023)", None, -128.5, "GPU")],
}  # fmt: skip
QM9_N_TRAIN, QM9_N_TEST = 13832, 1813  # E-NF's QM9 positional split (19-atom molecules)


def isotropic_gaussian_nll(
    system: str, n_train: int = 1000, data_dir: str | Path | None = None, split: str = "test"
) -> dict:
    """The anchor baseline: a zero-mean isotropic Gaussian on the (n - 1) d CoM-free (Helmert)
    coordinates, its variance fitted to the training configurations by maximum likelihood
    (``sigma2``: their mean square), and its NLL on ``split`` in nats, with SEM.

    With n_train = 1,000: DW4 12.94 (the issue's 12.94), LJ13 38.59 (the issue's 38.67 is
    this Gaussian on test-file rows 1,000-2,000, ``split="val"``: 38.67; DW4 gives 12.94 on
    those rows too). The space is E-NF's: on the 39 raw coordinates LJ13 would give 40.24."""
    X = load_enf_splits(system, n_train, data_dir, dedup=False)  # as the issue fitted it
    H = helmert_basis(SHAPES[system][0])
    x, y = ((H.mT @ (X[s] - X[s].mean(dim=-2, keepdim=True))).flatten(1) for s in ("train", split))
    D, sigma2 = x.shape[1], x.pow(2).mean()
    nll = 0.5 * D * torch.log(2 * math.pi * sigma2) + y.pow(2).sum(1) / (2 * sigma2)
    return {**mean_sem("test_nll", nll), "n_test": len(nll), "sigma2": sigma2.item(), "dims": D,
            "split": split}  # fmt: skip


@dataclass
class ENFExperiment:
    """One run. ``minutes``, ``flow_iterations`` and ``gram_iterations`` may grow (the run
    continues); any other change is another run.

    Attributes:
        system (``"dw4"``, ``"lj13"``), n_train (first rows of the train file), seed (initial
            weights and data order); potential: ``"graph"`` or ``"mlp"`` (the paper's);
            objective: the GrCNF's, ``"fm"``, ``"fm-ot"`` or ``"mle"``.
        minutes: total training CPU minutes of both parts (split: `budgets`).
        tol: the ODE's atol = rtol, of validation and of the test NLL.
        hidden, layers, gram, gram_hidden, gram_layers, chunk_size: see `TwoPartShapeFlow`.
        lr, batch_size: the flow's Adam (the Gram density's: 1e-3, 128).
        n_val_flow: validation configurations of the flow's exact NLL (the Gram uses all);
            it runs every ``val_every_minutes`` and at iterations 100, 200, 400, ...
        flow_iterations, gram_iterations: caps on each part's steps (the budget binds first).
        data_dir: the Klein files' folder (None: the shared one); data.json hashes the data.
    """

    system: str = "dw4"
    n_train: int = 1000
    seed: int = 0
    potential: str = "graph"
    objective: str = "fm"
    minutes: float = 7.0
    tol: float = 1e-4
    hidden: int | tuple[int, ...] | None = None
    layers: int | None = None
    gram_hidden: int = 32
    gram_layers: int = 1
    gram_components: int = 1
    gram: str = "wishart"
    gram_fraction: float = 0.1
    gram_max_minutes: float = 1.0
    chunk_size: int = 16
    lr: float = 1e-3
    batch_size: int = 100
    n_val_flow: int = 200
    val_every_minutes: float = 1.0
    flow_iterations: int = 10**7
    gram_iterations: int = 10**7
    data_dir: str | None = None

    def __post_init__(self):
        for name, allowed in (("system", tuple(ENF_SPLITS)), ("potential", POTENTIALS),
                              ("objective", tuple(OBJECTIVES)),
                              ("gram", tuple(GRAMS))):  # fmt: skip
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not (isinstance(self.minutes, (int, float)) and self.minutes > 0):
            raise ValueError(f"minutes must be > 0, got {self.minutes!r}")
        self.hidden = tuple(self.hidden) if isinstance(self.hidden, list) else self.hidden
        if self.layers is None:  # resolved, so that the saved experiment says what was trained
            self.layers = DEFAULT_LAYERS[self.potential]

    @property
    def model(self) -> str:
        tag = "gram" if self.gram == "wishart" else "distgram"
        gram = "" if (self.gram_components, tag) == (1, "gram") else f"-{tag}{self.gram_components}"
        if (self.gram_fraction, self.gram_max_minutes) != (0.1, 1.0):
            gram += f"-share{self.gram_fraction:g}-max{self.gram_max_minutes:g}"
        return f"grassflow-{self.potential}-{self.objective}{gram}"

    @property
    def run_name(self) -> str:
        return f"{self.system}-{self.model.removeprefix('grassflow-')}-n{self.n_train}-s{self.seed}"

    def command(self) -> str:
        """The ``grassflow reproduce vs-enf`` line of this run (non-default options only)."""
        cmd = (f"grassflow reproduce vs-enf --systems {self.system} --n-train {self.n_train} "
               f"--seeds {self.seed} --minutes {self.minutes:g} --potential {self.potential} "
               f"--objective {self.objective} --tol {self.tol:g}")  # fmt: skip
        default = ENFExperiment()
        for name in ("gram_components", "gram_fraction", "gram_max_minutes", "n_val_flow",
                     "val_every_minutes"):  # fmt: skip
            if getattr(self, name) != getattr(default, name):
                cmd += f" --{name.replace('_', '-')} {getattr(self, name):g}"
        return cmd + ("" if self.gram == default.gram else f" --gram {self.gram}")

    def budgets(self) -> tuple[float, float]:
        """``(flow, gram)`` total minutes: the Gram density gets ``min(gram_max_minutes,
        gram_fraction * minutes)`` (default min(1, 0.1 minutes)), the flow the rest."""
        return split_budget(self.minutes, self.gram_fraction, self.gram_max_minutes)

    def flow_config(self) -> TrainConfig:
        return TrainConfig(
            lr=self.lr, weight_decay=1e-12, batch_size=min(self.batch_size, self.n_train),
            iterations=self.flow_iterations, val_every=None, val_doubling_from=100,
            val_every_minutes=self.val_every_minutes, log_every=200, checkpoint_every=200,
            seed=self.seed, dtype="float64", total_budget_minutes=self.budgets()[0],
        )  # fmt: skip

    def gram_config(self) -> TrainConfig:
        return TrainConfig(
            lr=1e-3, batch_size=min(128, self.n_train), iterations=self.gram_iterations,
            val_every=200, log_every=50, checkpoint_every=200, seed=self.seed,
            dtype="float64", total_budget_minutes=self.budgets()[1],
        )  # fmt: skip

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ENFExperiment:
        return cls(**d)


def build_model(exp: ENFExperiment) -> TwoPartShapeFlow:
    """The untrained `TwoPartShapeFlow` of ``exp`` (weights seeded by ``exp.seed``), float64."""
    with seeded_init(exp.seed):
        return TwoPartShapeFlow(
            *SHAPES[exp.system], exp.potential, exp.gram,
            field_options=preset_field_options(exp.potential, exp.hidden, exp.layers),
            gram_options={"hidden": exp.gram_hidden, "layers": exp.gram_layers,
                          "components": exp.gram_components},
            chunk_size=exp.chunk_size, atol=exp.tol, rtol=exp.tol,
        ).double()  # fmt: skip


def run(exp: ENFExperiment, run_dir: str | Path, *, force: bool = False, progress: bool = True,
        data: dict | None = None) -> None:  # fmt: skip
    """Train (or continue) ``exp`` in ``run_dir`` on ``data`` (default its `ENF_SPLITS`).
    A directory holding another run raises `run_dir.RunMismatch` (``force``: retrain)."""
    data = load_enf_splits(exp.system, exp.n_train, exp.data_dir) if data is None else data
    identity = {"protocol": "vs_enf.ENF_SPLITS", "path": str(data_dir_of(exp.data_dir).resolve()),
                **data_identity(**{s: data[s] for s in ("train", "val", "test")})}  # fmt: skip
    claim_run_dir(run_dir, exp.to_dict(), identity, kind="vs-enf", added=ADDED_FIELDS,
                  force=force,
                  budget_keys=("minutes", "flow_iterations", "gram_iterations"))  # fmt: skip
    train_shape_flow(build_model(exp), data["train"], data["val"], run_dir, exp.flow_config(),
                     exp.gram_config(), objective=exp.objective, n_val_flow=exp.n_val_flow,
                     progress=progress)  # fmt: skip


def load_run(run_dir: str | Path) -> tuple[ENFExperiment, TwoPartShapeFlow]:
    """The preset and the model with each part's best validation checkpoint, eval mode."""
    exp = read_preset(Path(run_dir), ENFExperiment.from_dict, "vs-enf")
    return exp, load_shape_flow(build_model(exp), run_dir)


def sample(run_dir: str | Path, n: int, seed: int = 0) -> np.ndarray:
    """``n`` generated configurations ``(n, n_points, d)``, centred (``grassflow sample``)."""
    _, model = load_run(run_dir)
    with torch.no_grad():
        return model.sample(n, torch.Generator().manual_seed(seed)).numpy()


def evaluate(run_dir: str | Path, data: dict | None = None) -> dict:
    """Exact test NLL (nats per configuration, with SEM) of the run's best checkpoints, its
    parts (``test_nll = grassmann + gram + jacobian``), the same on the test configurations
    that occur in no training or validation row (``test_nll_novel``), each part's training
    (CPU and wall minutes, validation apart, threads), the evaluation's own minutes, and the
    ODE tolerance. Writes ``eval.json``; an existing one is returned instead if it evaluated
    the run as it stands on the same test set (both parts' iterations and trained minutes,
    and the test configurations' hash, unchanged)."""
    run_dir, keys = Path(run_dir), ("iterations", "trained_minutes")
    exp = read_preset(run_dir, ENFExperiment.from_dict, "vs-enf")
    data = load_enf_splits(exp.system, exp.n_train, exp.data_dir) if data is None else data
    status = {part: training_status(run_dir / part) for part in ("flow", "gram")}
    done, test_hash = run_dir / "eval.json", data_identity(test=data["test"])["test"]
    if done.exists():
        old = json.loads(done.read_text())
        if old.get("test_hash") == test_hash and all(
            old.get(f"{p}_{k}") == s[k] for p, s in status.items() for k in keys
        ):
            return old
    _, model = load_run(run_dir)
    with torch.no_grad(), Stopwatch() as watch:
        t = model.log_prob_terms(data["test"])
    nll = -t["log_prob"]
    novel = torch.as_tensor(novel_mask(data["test"], data["train"], data["val"]))
    best = {p: run_dir / p / "best.pt" for p in status}
    total = lambda key: sum(s[key] or 0.0 for s in status.values())
    result = {
        "system": exp.system, "model": exp.model, "n_train": exp.n_train, "seed": exp.seed,
        "n_train_distinct": len(data["train"]),
        "potential": exp.potential, "objective": exp.objective, "budget_minutes": exp.minutes,
        "n_test": len(nll), "test_hash": test_hash, **mean_sem("test_nll", nll),
        **{f"test_nll_{p}": -t[p].mean().item() for p in PARTS},
        "n_test_novel": int(novel.sum()), **mean_sem("test_nll_novel", nll[novel]),
        "uniform_nll_grassmann": model.manifold.log_volume(), "atol": exp.tol, "rtol": exp.tol,
        "params": sum(p.numel() for p in model.parameters()),
        "iterations": status["flow"]["iterations"], "clock": status["flow"]["clock"],
        "threads": status["flow"]["threads"], "train_minutes": total("trained_minutes"),
        **{f"train_{c}_minutes": total(f"{c}_minutes") for c in ("cpu", "wall")},
        **{f"val_{c}_minutes": total(f"val_{c}_minutes") for c in ("cpu", "wall")},
        "eval_cpu_minutes": watch.cpu / 60, "eval_wall_minutes": watch.wall / 60,
        **{f"{p}_{k}": s[k] for p, s in status.items() for k in keys},
        **{f"{p}_best_iteration": int(load_checkpoint(b)["iteration"]) if b.exists() else None
           for p, b in best.items()},
    }  # fmt: skip
    write_json(result, done)
    return result


def _key(r: dict) -> str:
    budget = r.get("budget_minutes")  # 60 and 60.0 are one budget
    return json.dumps([r[k] for k in ("system", "model", "n_train")]
                      + [None if budget is None else float(budget), r.get("seed")])  # fmt: skip


def sweep(
    systems: tuple[str, ...] = ("dw4", "lj13"), n_trains: tuple[int, ...] = (1000,),
    seeds: tuple[int, ...] = (0,), minutes: float = 7.0, runs_dir: str | Path = "runs/vs_enf",
    out_dir: str | Path = "results", *, base: ENFExperiment | efm.EFMExperiment | None = None,
    progress: bool = True, force: bool = False, n_test: int | None = None,
) -> list[dict]:  # fmt: skip
    """Train (or continue) and evaluate every (system, n_train, seed) run of ``base`` (its
    potential, objective, widths, tolerance) at ``minutes``, on the current torch threads
    (``n_test``: on `test_subset` rows only; default all). Merge the rows, the
    isotropic Gaussian's and the anchors into ``out_dir/vs_enf.json``
    (key: system, model, n_train, budget, seed; rows of other systems, e.g. QM9, are kept)
    and write ``out_dir/vs_enf/<system>.md``. Returns this invocation's rows."""
    base = ENFExperiment() if base is None else base
    train_run, evaluate_run = (efm.run, efm.evaluate) if isinstance(base, efm.EFMExperiment) \
        else (run, evaluate)  # fmt: skip
    if "qm9" in systems and not isinstance(base, efm.EFMExperiment):
        raise ValueError("QM9's TwoPartShapeFlow rows come from `grassflow reproduce table2`")
    splits = functools.partial(efm.load_splits, atom_types=base.atom_types) \
        if isinstance(base, efm.EFMExperiment) else load_enf_splits  # fmt: skip
    for system in systems:  # missing files or rows: fail before training anything
        splits(system, max(n_trains), base.data_dir)
    rows = []
    for system in systems:
        for n in n_trains:
            data = splits(system, n, base.data_dir)
            if system in SHAPES:  # the Gaussian floor on E-NF's files
                rows.append({"system": system, "model": "isotropic-gaussian", "n_train": n,
                             "train_minutes": 0.0, "iterations": 0,
                             **isotropic_gaussian_nll(system, n, base.data_dir)})  # fmt: skip
            for seed in seeds:
                exp = dataclasses.replace(base, system=system, n_train=n, seed=seed,
                                          minutes=minutes)  # fmt: skip
                run_dir = Path(runs_dir) / exp.run_name
                train_run(exp, run_dir, force=force, progress=progress, data=data)
                scored = {**data, "test": test_subset(data["test"], n_test)}
                rows.append({**evaluate_run(run_dir, scored), "budget_minutes": minutes,
                             "run_dir": str(run_dir), "command": exp.command()})  # fmt: skip
    merge_rows(rows, out_dir)
    return rows


def merge_rows(rows: list[dict], out_dir: str | Path = "results") -> list[dict]:
    """Merge ``rows`` and the anchors into ``out_dir/vs_enf.json`` (a row replaces the one
    with the same system, model, n_train, budget and seed) and rewrite the tables
    ``out_dir/vs_enf/<system>.md`` of every system it holds. Returns all rows."""
    out, path = Path(out_dir), Path(out_dir) / "vs_enf.json"
    (out / "vs_enf").mkdir(parents=True, exist_ok=True)
    merged = {_key(r): r for r in (json.loads(path.read_text()) if path.exists() else [])}
    merged.update({_key(r): r for r in _anchor_rows() + rows})
    everything = list(merged.values())
    write_json(everything, path)
    for system in {r["system"] for r in everything}:
        (out / "vs_enf" / f"{system}.md").write_text(markdown_table(everything, system))
    return everything


def _anchor_rows() -> list[dict]:
    rows = []
    for system, table in ANCHORS.items():
        n_train, n_test = (QM9_N_TRAIN, QM9_N_TEST) if system == "qm9" else (1000, 1000)
        for model, minutes, nll, note, *extra in table:  # extra: e.g. {"jsd": ...}
            rows.append({"system": system, "model": model, "n_train": n_train,
                         "budget_minutes": minutes, "train_minutes": minutes,
                         "iterations": None, "test_nll": nll, "test_nll_sem": None,
                         "n_test": n_test, "note": note, "source": "issue 14",
                         **(extra[0] if extra else {})})  # fmt: skip
    return rows


def qm9_model(exp) -> str:
    """The ``model`` name of a `QM9Experiment`'s exact TwoPartShapeFlow rows."""
    prior = "" if exp.prior == "uniform" else f"-{exp.prior}"
    gram = "" if exp.gram == "wishart" else f"-distgram{exp.gram_components}"
    return f"grassflow-{exp.potential}-{exp.objective}{prior}{gram}"


def table2_command(exp) -> str:
    """The ``grassflow reproduce table2`` command line of a `QM9Experiment`
    (options at their defaults are left out)."""
    cmd = (f"grassflow reproduce table2 --objective {exp.objective} --prior {exp.prior} "
           f"--potential {exp.potential} --minutes {exp.flow_minutes:g} "
           f"--scale-minutes {exp.scale_minutes:g}")  # fmt: skip
    default = QM9Experiment(potential=exp.potential)
    for name in ("gram", "gram_components", "layers", "n_val", "val_every_minutes", "n_test"):
        if getattr(exp, name) != getattr(default, name):
            cmd += f" --{name.replace('_', '-')} {getattr(exp, name)}"
    if exp.atol != exp.rtol:
        raise ValueError(f"the command line sets atol = rtol, got {exp.atol} and {exp.rtol}")
    return cmd + ("" if exp.atol == default.atol else f" --tol {exp.atol:g}")


def qm9_row(result: dict, exp) -> dict:
    """A ``vs_enf.json`` row of a QM9 run's evaluation (`qm9.evaluate`) of
    ``exp`` (its `QM9Experiment`): the exact TwoPartShapeFlow's test NLL, distance
    JSD and broken fraction; budget and minutes are the flow's plus the Gram density's."""
    return {
        "system": "qm9", "model": qm9_model(exp),
        "n_train": result["n_train"], "seed": exp.seed,
        "budget_minutes": exp.flow_minutes + exp.scale_minutes,
        "train_minutes": result["flow_minutes"] + result["gram_minutes"],
        # CPU budgets (issue 20) record the CPU and wall minutes of both parts
        **({f"train_{c}_minutes": result[f"flow_{c}_minutes"] + result[f"gram_{c}_minutes"]
            for c in ("cpu", "wall")} if result.get("flow_cpu_minutes") is not None else {}),
        "iterations": result["flow_iterations"], "n_test": result["n_test"],
        **{k: result[k] for k in ("test_nll", "test_nll_sem", "test_nll_grassmann",
                                  "test_nll_gram", "jsd", "broken_fraction")},
        "test_nll_jacobian": result["mean_log_jacobian"], "atol": exp.atol, "rtol": exp.rtol,
        # the training's threads (the flow's), not this process's
        "threads": result.get("flow_threads", torch.get_num_threads()),
        "command": table2_command(exp),
    }  # fmt: skip


def _fmt(x, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def _mean(rs: list[dict], key: str) -> float | None:
    return None if rs[0].get(key) is None else statistics.mean(r[key] for r in rs)


def _seed_se(values: list[float]) -> float | None:
    return statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else None


def markdown_table(rows: list[dict], system: str) -> str:
    """``system``'s anchors, isotropic Gaussians and ours: one line per (model, n_train,
    budget) with the mean over seeds, the mean test-set SEM, the seed SE, the NLL on the
    test configurations seen in no training or validation row, training CPU and wall
    minutes, threads, iterations and the parts' means."""
    qm9 = system == "qm9"
    if qm9:
        space = (f"nats per molecule, Lebesgue measure on the 54 centred coordinates, on the "
                 f"{QM9_N_TEST:,} test molecules of E-NF's split. JSD: distance histograms of "
                 "1,000 samples against the training molecules; broken: the fraction of "
                 "samples with two atoms nearer than 0.9 Å (the data have none).")  # fmt: skip
    elif system == "lj55":
        space = ("nats per configuration, Lebesgue measure on the 162 CoM-free coordinates, on "
                 "the test chains of `grassflow data make lj55` (efm.LJ55_SPLIT; a seeded "
                 "subset of them, n_test in the row). Novel: as for DW4 and LJ13.")  # fmt: skip
    else:
        (n, d), test = SHAPES[system], ENF_SPLITS[system]["test"]
        space = (f"nats per configuration, Lebesgue measure on the {(n - 1) * d} CoM-free "
                 f"coordinates, on `{test[0]}[:{test[2]}]`. Novel: the same NLL on the test "
                 "configurations that occur in no training or validation row of the run "
                 "(± its test-set SEM; their number in brackets).")  # fmt: skip
    extra = " JSD | broken |" if qm9 else " novel test NLL |"
    lines = [
        f"**{system.upper()}**: exact Cartesian test NLL, {space} Budget and CPU: training CPU "
        "minutes of both parts (rows before CPU budgets: wall minutes, validation included); "
        "wall: their wall minutes; validation and evaluation are not included. n_train: rows "
        "asked for (distinct rows used). Iterations: the flow's. Test NLL: mean over seeds; "
        "SEM: the test-set standard error (mean over seeds); seed SE: the standard error over "
        "seeds.", "",
        "| model | n_train | budget (CPU min) | CPU min | wall min | threads | iterations "
        f"| params | test NLL | SEM | seed SE |{extra} Grassmann + Gram + Jacobian | seeds "
        "| note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * qm9 + "---|---|---|",
    ]  # fmt: skip
    groups: dict[tuple, list[dict]] = {}
    for r in (r for r in rows if r["system"] == system):
        groups.setdefault((r["model"], r["n_train"], r.get("budget_minutes")), []).append(r)
    trained = lambda r: r.get("seed") is not None  # TwoPartShapeFlow's and the baseline's rows
    order = lambda g: (g[1][0].get("source") != "issue 14", trained(g[1][0]), g[0][1],
                       not g[0][0].startswith("grassflow"), g[0][0], g[0][2] or 0)  # fmt: skip
    for (model, n_train, budget), rs in sorted(groups.items(), key=order):
        r0, k, ours = rs[0], len(rs), trained(rs[0])
        its = sorted(r["iterations"] for r in rs) if ours else None
        parts = " + ".join(_fmt(_mean(rs, f"test_nll_{p}")) for p in PARTS)
        parts = parts if "test_nll_gram" in r0 else "–"
        old = ours and "train_cpu_minutes" not in r0  # made before CPU budgets (issue 20)
        note = r0.get("note") or (f"ML variance {r0['sigma2']:.4f}" if "sigma2" in r0 else
                                  f"atol = rtol = {r0['atol']:g}")  # fmt: skip
        if old:
            note += "; budget in wall minutes, validation included (before issue 20)"
        if "test_nll_positional_bound" in r0:  # a conditional model (efm's docstring)
            note += (f"; p(x \\| atom types), not positional; a positional NLL of it <= "
                     f"{_mean(rs, 'test_nll_positional_bound'):.2f}")  # fmt: skip
        distinct = {r.get("n_train_distinct") for r in rs} - {None, n_train}
        n_label = f"{n_train:,}" + "".join(f" ({d:,})" for d in sorted(distinct))
        if qm9:
            tail = "".join(f"{_fmt(_mean(rs, key), spec)} | " for key, spec in
                           (("jsd", ".4f"), ("broken_fraction", ".3f")))  # fmt: skip
        elif r0.get("test_nll_novel") is not None:
            tail = (f"{_mean(rs, 'test_nll_novel'):.2f} ± {_mean(rs, 'test_nll_novel_sem'):.2f} "
                    f"({r0['n_test_novel']:,}) | ")  # fmt: skip
        else:
            tail = "– | "
        cpu = None if old else _mean(rs, "train_cpu_minutes")
        wall = _mean(rs, "train_minutes") if old else _mean(rs, "train_wall_minutes")
        lines.append(
            f"| {'isotropic Gaussian (here)' if 'sigma2' in r0 else model} | {n_label} | "
            f"{_fmt(budget, 'g')} | {_fmt(cpu)} | {_fmt(wall)} | "
            f"{r0.get('threads') or '–'} | "
            f"{'–' if not its else f'{its[0]:,}' + (f'–{its[-1]:,}' if k > 1 else '')} | "
            f"{_fmt(r0.get('params'), ',')} | {_mean(rs, 'test_nll'):.2f} | "
            f"{_fmt(_mean(rs, 'test_nll_sem'))} | "
            f"{_fmt(_seed_se([r['test_nll'] for r in rs]))} | {tail}"
            f"{parts} | {k if ours else '–'} | {note} |"
        )  # fmt: skip
    commands = dict.fromkeys(r["command"] for r in rows if r["system"] == system and "command" in r)
    return "\n".join([*lines, "", "Made by:", *[f"- `{c}`" for c in commands]]) + "\n"


RUN_KIND = RunKind(
    evaluate=lambda run_dir, n_samples, seed: eval_summary(evaluate(run_dir)),
    sample=lambda run_dir, n, seed, out: save_sampled_clouds(
        sample(run_dir, n, seed), out,
        comment=f"grassflow TwoPartShapeFlow sample, seed {seed}, run {run_dir}"),
)
