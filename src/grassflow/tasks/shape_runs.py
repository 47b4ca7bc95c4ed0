"""Users' own point clouds: train, evaluate, sample and plot the library's shape model, one
E(n)-equivariant flow on the whole cloud (`ShapeFlow` with the Cartesian geometry, i.e. the EFM
baseline; ``model="equivariant-cnf"``).

``grassflow train --data shapes.npy`` (or ``.npz``, or a folder of ``.xyz`` files) lands here.
The clouds are split at random (seeded) into train / val / test, 10 % each for val and test
by default (``--split VAL,TEST``); `run` prints the split. The flow is trained by flow
matching in ``run_dir/flow`` on the whole budget; its exact validation NLL picks the
checkpoint.

The two-part ShapeFlow (a GrCNF on the spans and a Gram density, ``model="shapeflow"``) was
removed from the library in issue 34: its runs are refused (`REMOVED_MODELS`); the last
commit that trains and reads them is 3531f93. The paper's reproduction keeps that model
(``grassflow_paper.two_part``) for its own tables.

A molecule's chemistry comes with its file (an SDF, or an ``.npz`` with ``atomic_numbers``
and ``bonds``; `grassflow.data.point_clouds.load_point_clouds`): atom types become the
field's node features, the bond graph its edge features and, by default, the harmonic prior
(`ShapeFlow`'s ``prior="harmonic"``); samples are then also written as an SDF with the bonds.

A run directory holds ``experiment.json`` (with the bond table), ``data.json``, ``flow/``,
``eval.json`` (the test split's scores; ``eval_<stem>.json`` for a user's held-out file,
``evaluate(..., data=...)``), ``samples.npy`` / ``samples.xyz`` (``samples.sdf`` for a
molecule), ``molecule.mol`` (the data's molblock, when it has one) and the pictures."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..data.molecule_files import find_hand, molblock_charges, write_sdf
from ..data.point_clouds import element_symbol, labels_path, load_point_clouds, save_clouds
from ..flows import InternalFlow, InternalFlowConfig, ShapeFlow, ShapeFlowConfig
from ..flows.internal_flow import choose_mirror_row
from ..manifolds.internal import straight_angles
from ..manifolds.shape_paths import GEOMETRIES
from ..manifolds.zmatrix import build_zmatrix
from ..metrics import histogram, jsd
from ..training import (
    CFM_COUPLINGS,
    TrainConfig,
    checkpoint_path,
    fit_internal_flow,
    fit_shape_flow,
    load_shape_flow,
)
from ..training.checkpoint import write_json
from ..training.clock import Stopwatch
from ..training.progress import Progress, minutes, progress_line
from ..training.rng import seeded_init
from .registry import RunKind, legacy_kind
from .run_dir import KIND_KEY, claim_run_dir, data_identity, read_preset, training_status

__all__ = [
    "RUN_KIND",
    "MODELS", "REMOVED_MODELS", "ShapeExperiment", "build_model", "eval_path", "evaluate",
    "load_clouds", "load_heldout", "load_run", "model_name", "plot", "nll_summary",
    "refuse_removed_model", "run", "sample", "save_sampled_clouds", "split_summary",
]  # fmt: skip

logger = logging.getLogger(__name__)
_DEFAULTS = ShapeFlowConfig(2, 1)  # the model's defaults (hidden, layers), in one place

MODELS = ("equivariant-cnf",)
REMOVED_MODELS = {"shapeflow": "3531f93"}
"""Models that ``train --data`` no longer has, with the last commit that has them: the
two-part ShapeFlow (GrCNF on the spans + Gram density), removed in issue 34."""
# preset fields added after runs were made: the value those runs had without saying so
# (a preset without ``model`` is a two-part ShapeFlow run's)
ADDED_FIELDS = {"model": "shapeflow", "coupling": "equivariant-ot", "geometry": "cartesian",
                "ring_block": True, "mirror_row": None, "zmatrix": None, "torus": False,
                "train_base": True}
# preset fields of the removed two-part model: a baseline run's saved values of them are ignored
REMOVED_FIELDS = ("potential", "prior", "objective", "gram", "gram_density", "gram_components")


MOLBLOCK = "molecule.mol"
"""The data's molblock in a run directory (charges and all, for the sampled SDF)."""

SHAPE_GEOMETRIES = (*GEOMETRIES, "internal")
"""Of ``ShapeExperiment.geometry``: `ShapeFlow`'s flow-matching geometries, and
``"internal"``, the `InternalFlow` of a molecule with a bond graph."""

SAMPLE_COST = {"cartesian": 0.1, "grassmann": 0.1, "internal": 40.0}
"""Bounds of the CPU cost of drawing a cloud relative to scoring one exactly, by geometry;
the final evaluation's share of a budget rests on them. Measured one thread: 1/85 for the
ODE on 12-point clouds; 17-36 for the internal-coordinate flow on 14-22 atoms (its
autoregressive inverse takes 3n - 6 passes; `results/real_molecules.json`, whose absolute
costs are 0.2 ms per likelihood and 2-7 ms per sample)."""

INTERNAL_DEFAULTS = {"hidden": 64, "layers": 3}
"""The internal-coordinate flow's conditioner width and spline transforms when not given."""


def refuse_removed_model(model: str, run_dir: str | Path | None = None) -> None:
    """Raise a ``ValueError`` if ``model`` is one of `REMOVED_MODELS`, naming the removal and
    the last commit that has it (``run_dir``: the run that holds it, if any)."""
    if model not in REMOVED_MODELS:
        return
    what = "the two-part ShapeFlow (a GrCNF on the spans and a Gram density)"
    what = (f"model {model!r}, {what}," if run_dir is None
            else f"{run_dir} is a run of {what}, model {model!r}, which")  # fmt: skip
    commit = REMOVED_MODELS[model]
    raise ValueError(
        f"{what} was removed from grassflow in issue 34; the last commit that has it is "
        f"{commit} (`git checkout {commit}` to evaluate, sample or continue such runs). "
        f"`grassflow train --data` now trains {MODELS[0]!r}, one flow on the whole cloud: "
        "train a new run with it"
    )


def _internal_schedule(flow: TrainConfig) -> TrainConfig:
    """``flow`` with `InternalFlow`'s validation schedule and regularization where it has
    `_flow_config`'s values: its validation is one cheap pass, so it validates often (small
    data sets overfit within minutes, and ``best.pt`` should catch the optimum); with a
    budget and the preset's step count, the budget alone ends the run."""
    preset, schedule = _flow_config(), ("val_every", "val_doubling_from", "val_every_minutes")
    same = lambda keys: all(getattr(flow, k) == getattr(preset, k) for k in keys)
    if same(schedule):  # a user's --val-every stands
        flow = flow.replace(val_every=100, val_doubling_from=None, val_every_minutes=None)
    internal = {"checkpoint_every": 1000, "weight_decay": 1e-4}
    if flow.total_budget_minutes is not None or flow.budget_minutes is not None:
        # a budget decides the length: 20,000 steps take a small flow ~6 CPU minutes, and
        # the circle's design still improves there (issue 46)
        internal["iterations"] = None
    return flow.replace(**{k: v for k, v in internal.items() if same((k,))})


def _flow_config() -> TrainConfig:
    return TrainConfig(
        lr=1e-3, weight_decay=1e-12, batch_size=128, iterations=20_000, val_every=None,
        val_doubling_from=100, val_every_minutes=3.0, log_every=100, checkpoint_every=200,
        dtype="float32",  # 2.1x the steps of float64 per CPU second; eval stays float64
    )  # fmt: skip


@dataclass
class ShapeExperiment:
    """A shape model of the clouds in ``data``.

    Attributes:
        data: a ``.npy`` array (N, n, d), an ``.npz`` (array ``key``), or a folder or file of
            ``.xyz`` frames (see `grassflow.data.point_clouds.load_point_clouds`).
        key: the ``.npz`` array's name.
        model: ``"equivariant-cnf"``, the only one: one flow on the CoM-free cloud (the
            EFM model, `ShapeFlow` with the Cartesian geometry), trained by flow matching
            with ``coupling``. ``"shapeflow"``, the removed two-part model (and a saved
            preset without ``model``, which meant it), is refused: see `REMOVED_MODELS`.
        geometry: ``"internal"``: the `InternalFlow` in bonds, angles and torsions (a
            molecule's bond graph is needed); ``"cartesian"`` or ``"grassmann"``: `ShapeFlow`
            trained on those flow-matching paths. None, the default, is resolved by `run`:
            ``"internal"`` for a new run on data with a bond graph (the measured winner,
            issue 41), ``"cartesian"`` otherwise (issue 34's winner); a continued run keeps
            its own.
        hidden, layers: `ShapeFlow`'s EGNN width and message-passing layers (default
            `ShapeFlowConfig`'s, 32 and 3); `InternalFlow`'s conditioner width and spline
            transforms (default `INTERNAL_DEFAULTS`).
        atol, rtol: ODE tolerances of every evaluation (validation, test NLL, sampling).
        chunk_size: clouds per exact-divergence solve (bounds the memory of evaluation).
        val_fraction, test_fraction, split_seed: the random split of the usable clouds: the
            fractions held out for validation (which picks the checkpoints) and for test
            (what ``grassflow eval`` scores), at least one cloud each, rounded; default 10 %
            each, seed 0 (``grassflow train --split VAL,TEST``). `run` prints the counts.
        n_val_flow: validation clouds scored by the exact NLL at each validation; None,
            the default, is resolved by `run`: 50 for `ShapeFlow` (an ODE solve each), all
            of them for `InternalFlow` (one pass).
        flow: the training configuration.
        n_points, dim, labels: read from the data (labels when every cloud has the same).
        efm_labels: embed ``labels`` (atom types) in the EGNN's node features. None, the
            default, is resolved by `run`: True for a new run, the saved value when
            continuing one; None in a saved preset (runs made before this
            option) means no labels, as those runs were trained.
        ring_block: the internal geometry places ring atoms as one Cartesian block in the
            root frame; False (the default, the measured winner: issue 41) leaves
            ring-closing bonds implicit, held by the whitening's correlations.
        mirror_row: the internal geometry's Z-matrix row whose torsion sign it symmetrizes
            over by reflection (`grassflow.flows.internal_flow.choose_mirror_row`). Set by
            `run` for a new run on a molecule without a hand (None for a chiral one, which
            keeps its hand); a continued run keeps its saved value.
        zmatrix: the internal geometry's `grassflow.manifolds.zmatrix.ZMatrix` as a dict,
            built by `run` for a new run around the training conformers' straight angles
            (`grassflow.manifolds.internal.straight_angles`: nitriles, alkynes); a continued
            run keeps its saved one. None (runs before linear groups): built from the bonds.
        torus: the internal geometry's torsions live on the circle, with a coupling spline
            flow (`InternalFlowConfig.torus`, ``train --torsions circle``: it keeps learning on
            minimized conformers, but breaks rings on thermal data, issue 46); False (the
            default): every torsion cut open, zuko's autoregressive NSF from a Gaussian
            mixture (issue 41).
        train_base: the internal geometry's fitted mixture is trained with the flow (the
            default, `InternalFlowConfig.train_base`); False: it stays as fitted (no blow-ups
            on minimized conformers, but behind after 20 CPU minutes, issue 46).
        bonds, bond_orders, smiles: the molecule's bond table ``((i, j), ...)``, its orders
            and SMILES, read from the data (None when it has none).
        use_bonds: give the model the bond graph (the field's edge features). None, the
            default, is resolved by `run` as ``efm_labels`` is (True for a new run).
        harmonic_prior: start the flow from the bond graph's harmonic Gaussian instead of
            the isotropic one (`ShapeFlow`'s ``prior``). None, the default, is resolved by
            `run`: True for a new run that uses bonds, the saved value when continuing one.
        hand: d + 1 atoms whose signed volume keeps one sign in every training cloud
            (`grassflow.data.molecule_files.find_hand`: a chiral molecule, or labelled atoms
            that never swap): the model keeps that hand (`ShapeFlow`'s ``hand``). Set by
            `run` for a new run that uses bonds (None when no such atoms exist); a
            continued run keeps its saved value.
    """

    data: str
    key: str | None = None
    model: str = "equivariant-cnf"
    hidden: int | None = None
    layers: int | None = None
    atol: float = 1e-5
    rtol: float = 1e-5
    chunk_size: int = 16
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    split_seed: int = 0
    n_val_flow: int | None = None
    flow: TrainConfig = field(default_factory=_flow_config)
    n_points: int | None = None
    dim: int | None = None
    labels: tuple[int, ...] | None = None
    coupling: str = "equivariant-ot"
    efm_labels: bool | None = None
    geometry: str | None = None
    bonds: tuple[tuple[int, int], ...] | None = None
    bond_orders: tuple[float, ...] | None = None
    smiles: str | None = None
    use_bonds: bool | None = None
    harmonic_prior: bool | None = None
    hand: tuple[int, ...] | None = None
    ring_block: bool = False
    mirror_row: int | None = None
    zmatrix: dict | None = None
    torus: bool = False
    train_base: bool = True

    def __post_init__(self):
        refuse_removed_model(self.model)
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.coupling not in CFM_COUPLINGS:
            raise ValueError(f"coupling must be one of {CFM_COUPLINGS}, got {self.coupling!r}")
        if self.geometry not in (*SHAPE_GEOMETRIES, None):
            raise ValueError(f"geometry must be one of {SHAPE_GEOMETRIES}, got "
                             f"{self.geometry!r}")  # fmt: skip
        # resolved, so that the saved preset says what was trained (ShapeFlow's hidden stays
        # None, as runs before the internal geometry saved it)
        if self.geometry == "internal":
            self.layers = INTERNAL_DEFAULTS["layers"] if self.layers is None else self.layers
            self.hidden = INTERNAL_DEFAULTS["hidden"] if self.hidden is None else self.hidden
        elif self.geometry is not None and self.layers is None:
            self.layers = _DEFAULTS.layers
        if self.geometry == "internal" and self.use_bonds is False:
            raise ValueError("the internal geometry is built on the bond graph that --no-bonds "
                             "drops")  # fmt: skip
        if self.geometry == "internal" and self.n_points is not None and not self.bonds:
            raise ValueError(f"the internal geometry needs a bond table, and {self.data} has "
                             "none (an .sdf, or an .npz with 'bonds', carries one)")  # fmt: skip
        if not (0 < self.val_fraction < 1 and 0 < self.test_fraction < 1
                and self.val_fraction + self.test_fraction < 1):  # fmt: skip
            raise ValueError(f"the split's val and test fractions must each be in (0, 1) with "
                             f"a sum < 1, got {self.val_fraction!r} and "
                             f"{self.test_fraction!r}")  # fmt: skip
        if isinstance(self.flow, dict):
            self.flow = TrainConfig.from_dict(self.flow)
        if self.labels is not None:
            self.labels = tuple(self.labels)
        if self.bonds is not None:  # JSON gives lists
            self.bonds = tuple((int(i), int(j)) for i, j in self.bonds)
        if self.bond_orders is not None:
            self.bond_orders = tuple(float(o) for o in self.bond_orders)
        if self.hand is not None:
            self.hand = tuple(int(i) for i in self.hand)
        if self.harmonic_prior and self.use_bonds is False:
            raise ValueError("the harmonic prior needs the bonds that --no-bonds drops")
        if self.harmonic_prior and self.n_points is not None and not self.bonds:  # data read
            raise ValueError(f"the harmonic prior needs a bond table, and {self.data} has none "
                             "(an .sdf, or an .npz with 'bonds', carries one)")  # fmt: skip

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["flow"] = self.flow.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ShapeExperiment:
        """The preset of a saved ``experiment.json`` (without its kind). A two-part model's
        run (``model`` ``"shapeflow"`` or absent) raises a ``ValueError`` that names its
        removal (`REMOVED_MODELS`); a baseline run's values of the two-part model's options
        (`REMOVED_FIELDS`) are dropped."""
        refuse_removed_model(d.get("model", ADDED_FIELDS["model"]))
        return cls(**{k: v for k, v in d.items() if k not in REMOVED_FIELDS})


def load_clouds(exp: ShapeExperiment) -> dict:
    """The clouds of ``exp.data`` split into ``train`` / ``val`` / ``test`` float64 tensors
    ``(N_s, n, d)``, with ``labels`` (shared per-point labels or None), ``labels_from`` (where
    they were read, `PointClouds.labels_from`; also when they differ between clouds),
    ``skipped``, and the molecule's ``bonds`` and ``bond_orders`` (tuples), ``molblock`` and
    ``smiles`` (each None when the data has none). `split_summary` says it in words."""
    clouds = load_point_clouds(exp.data, key=exp.key)
    X = torch.as_tensor(clouds.positions, dtype=torch.float64)
    N = len(X)
    n_test, n_val = max(1, round(exp.test_fraction * N)), max(1, round(exp.val_fraction * N))
    if N - n_test - n_val < 1:
        raise ValueError(f"{exp.data}: {N} usable clouds are too few for a train/val/test split")
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(exp.split_seed))
    labels = None
    if clouds.labels is not None and (clouds.labels == clouds.labels[0]).all():
        labels = tuple(int(v) for v in clouds.labels[0])
    elif clouds.labels is not None:
        logger.warning("%s: point labels differ between clouds, so they are not modelled",
                       exp.data)  # fmt: skip
    return {
        "test": X[perm[:n_test]], "val": X[perm[n_test:n_test + n_val]],
        "train": X[perm[n_test + n_val:]], "labels": labels, "skipped": clouds.skipped,
        "labels_from": clouds.labels_from, "molblock": clouds.molblock, "smiles": clouds.smiles,
        "bonds": None if clouds.bonds is None else tuple(map(tuple, clouds.bonds.tolist())),
        "bond_orders": None if clouds.bond_orders is None else tuple(clouds.bond_orders.tolist()),
    }  # fmt: skip


def split_summary(exp: ShapeExperiment, splits: dict) -> str:
    """What `load_clouds` made of ``exp.data``, in two lines: the clouds and their split, then
    their labels (or how to give them)."""
    counts = {s: len(splits[s]) for s in ("train", "val", "test")}
    N, (n, d) = sum(counts.values()), splits["train"].shape[1:]
    skipped = f" ({len(splits['skipped'])} skipped)" if splits["skipped"] else ""
    lines = [f"data: {N} clouds of {n} points in {d}-D from {exp.data}{skipped}; split (seed "
             f"{exp.split_seed}, --split {exp.val_fraction:g},{exp.test_fraction:g}): "
             f"{counts['train']} train, {counts['val']} val, {counts['test']} test "
             f"(`grassflow eval` scores the test clouds)"]  # fmt: skip
    if splits["labels"] is not None:
        lines.append(f"labels (as atomic numbers): {_formula(splits['labels'])}, from "
                     f"{splits['labels_from']}")  # fmt: skip
    elif splits["labels_from"] is not None:
        lines.append(f"labels from {splits['labels_from']} differ between clouds: not modelled")
    else:
        z = (f"{labels_path(exp.data).name} beside it" if Path(exp.data).suffix == ".npy"
             else "a 'labels' array in the .npz, or .xyz files")  # fmt: skip
        lines.append(f"labels: none (per-point labels, e.g. atomic numbers, come from {z})")
    if splits["bonds"] is not None:
        orders = "with orders" if splits["bond_orders"] is not None else "without orders"
        smiles = f" of {splits['smiles']}" if splits["smiles"] else ""
        lines.append(f"bonds: {len(splits['bonds'])} ({orders}){smiles}")
    return "\n".join(lines)


def _formula(labels) -> str:
    """Labels as a formula in Hill order (C, H, then by symbol; others by symbol), e.g.
    ``C4H10O``; labels that are not atomic numbers in parentheses, ``(-1)2``."""
    counts: dict[str, int] = {}
    for z in labels:
        counts[element_symbol(z)] = counts.get(element_symbol(z), 0) + 1
    first = [s for s in ("C", "H") if s in counts and "C" in counts]
    order = first + sorted(s for s in counts if s not in first)
    return "".join((s if s[0].isalpha() else f"({s})") + (str(counts[s]) if counts[s] > 1 else "")
                   for s in order)  # fmt: skip


def build_model(exp: ShapeExperiment) -> ShapeFlow | InternalFlow:
    """The model of ``exp`` (``n_points``, ``dim`` and ``geometry`` resolved), float64."""
    if exp.geometry == "internal":
        config = InternalFlowConfig(exp.n_points, exp.bonds, exp.labels, exp.ring_block,
                                    hidden=(exp.hidden,) * 2, transforms=exp.layers,
                                    mirror_row=exp.mirror_row, zmatrix=exp.zmatrix,
                                    torus=exp.torus, train_base=exp.train_base)  # fmt: skip
        with seeded_init(exp.flow.seed):
            return InternalFlow.from_config(config).double()
    labels = None if exp.labels is None or not exp.efm_labels else exp.labels
    bonds = exp.bonds if exp.use_bonds else None
    config = ShapeFlowConfig(
        exp.n_points, exp.dim, geometry=exp.geometry, coupling=exp.coupling,
        hidden=exp.hidden or _DEFAULTS.hidden, layers=exp.layers, atol=exp.atol, rtol=exp.rtol,
        chunk_size=exp.chunk_size, labels=labels, bonds=bonds,
        bond_orders=exp.bond_orders if bonds else None,
        prior="harmonic" if exp.harmonic_prior else "gaussian", hand=exp.hand if bonds else None,
    )  # fmt: skip
    with seeded_init(exp.flow.seed):
        return ShapeFlow.from_config(config).double()


def run(
    exp: ShapeExperiment,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool | Progress = True,
    force: bool = False,
    final_eval: bool = False,
    n_samples: int | None = None,
    setup: Stopwatch | None = None,
) -> ShapeExperiment:
    """Train (or continue) ``exp`` in ``run_dir``; returns the resolved preset. A
    ``run_dir`` that holds a run of a removed model (`REMOVED_MODELS`) is refused, unless
    ``force`` (which deletes it).

    With ``final_eval``, `evaluate` the test split afterwards (``n_samples`` samples for the
    JSD; None: as many as test clouds), announced with its estimated cost: that of
    ``n_test + SAMPLE_COST * n_samples`` validation points of the flow. A budget that charges
    validation (``exp.flow.charge_validation``) keeps room for it, unless it would take more
    than half the budget (training comes first). It runs if it fits in what the budget left,
    give or take a quarter of the budget; otherwise it is skipped with its estimate, for
    ``grassflow eval`` to run later.

    ``setup``: a `Stopwatch` started when the command began (default: at this call); the
    work before training (loading and checking the data) is charged with validation.
    """
    setup = Stopwatch().start() if setup is None else setup
    run_dir = Path(run_dir)
    if not resume and (run_dir / "flow" / "last.pt").exists():
        raise FileExistsError(f"{run_dir} holds a trained run: pass --resume or use a new one")
    splits = load_clouds(exp)
    for line in splits["skipped"]:
        print(f"skipped: {line}")
    print(split_summary(exp, splits))
    n, d = splits["train"].shape[1:]
    exp = dataclasses.replace(exp, n_points=n, dim=d, labels=splits["labels"],
                              bonds=splits["bonds"], bond_orders=splits["bond_orders"],
                              smiles=splits["smiles"])  # fmt: skip
    saved = run_dir / "experiment.json"
    old = json.loads(saved.read_text()) if saved.exists() and not force else {}
    if old and (old.get(KIND_KEY) or legacy_kind(old)) == "shapes":
        refuse_removed_model(old.get("model", ADDED_FIELDS["model"]), run_dir)
    if exp.efm_labels is None:
        # a new run embeds the labels; a continued one stays as trained (None: before labels)
        exp = dataclasses.replace(exp, efm_labels=old.get("efm_labels") if old else True)
    if exp.use_bonds is None:  # as the labels: a new run uses them, a continued one as trained
        exp = dataclasses.replace(exp, use_bonds=old.get("use_bonds") if old else True)
    if exp.geometry is None:  # a new run on a molecule: internal coordinates
        new = "internal" if exp.bonds and exp.use_bonds else "cartesian"
        exp = dataclasses.replace(exp, geometry=old.get("geometry", "cartesian") if old else new)
    internal = exp.geometry == "internal"
    if internal and exp.harmonic_prior:
        raise ValueError("--prior harmonic is ShapeFlow's (--geometry cartesian or grassmann); "
                         "the internal geometry has no prior to choose")  # fmt: skip
    if exp.harmonic_prior is None:
        new = bool(exp.bonds and exp.use_bonds) and not internal
        exp = dataclasses.replace(exp, harmonic_prior=old.get("harmonic_prior") if old else new)
    if exp.n_val_flow is None:
        exp = dataclasses.replace(exp, n_val_flow=len(splits["val"]) if internal else 50)
    if internal:
        exp.flow = _internal_schedule(exp.flow)
    if old:
        kept = {k: old.get(k, ADDED_FIELDS[k]) for k in ("torus", "train_base")}
        exp = dataclasses.replace(exp, hand=old.get("hand"), mirror_row=old.get("mirror_row"),
                                  zmatrix=old.get("zmatrix"), **kept)  # fmt: skip
        trained = old.get("flow", {}).get("dtype", "float64")
        if exp.flow.dtype == _flow_config().dtype:  # the preset's: a run continues as trained
            exp.flow = exp.flow.replace(dtype=trained)
    elif exp.bonds and exp.use_bonds and not internal:
        exp = dataclasses.replace(exp, hand=find_hand(splits["train"].numpy(), exp.bonds))
    elif internal:  # the torsions carry a hand; an achiral molecule's is symmetrized
        hand = find_hand(splits["train"].numpy(), exp.bonds)
        zm = build_zmatrix(n, exp.bonds, exp.labels, exp.ring_block,
                           straight=straight_angles(splits["train"], exp.bonds))  # linear groups
        mirror = None if hand is not None else choose_mirror_row(zm, splits["train"], exp.labels)
        exp = dataclasses.replace(exp, zmatrix=zm.to_dict(), mirror_row=mirror)
        if exp.mirror_row is not None:
            print(f"mirror: no atom keeps one hand in the training conformers, so the model is "
                  f"symmetric under reflection (canonical sign: the torsion of Z-matrix row "
                  f"{exp.mirror_row}, atom {zm.rows[exp.mirror_row][0]})")  # fmt: skip
    if exp.hand is not None:
        print(f"hand: atoms {exp.hand[1:]} around atom {exp.hand[0]} keep one hand in every "
              "training cloud, so the model keeps it (its mirror images get density 0)")
    identity = {"path": str(Path(exp.data).resolve()),
                **data_identity(**{s: splits[s] for s in ("train", "val", "test")})}  # fmt: skip
    claim_run_dir(run_dir, exp.to_dict(), identity, kind="shapes", added=ADDED_FIELDS,
                  removed=REMOVED_FIELDS, force=force, resume=resume,
                  budget_keys=("flow.iterations", "flow.total_budget_minutes"))  # fmt: skip
    if splits["molblock"] is not None:
        (run_dir / MOLBLOCK).write_text(splits["molblock"])
    n_test = len(splits["test"])
    n_samples = n_test if n_samples is None else n_samples
    eval_points = n_test + SAMPLE_COST[exp.geometry] * n_samples  # in flow validation points
    if final_eval:
        exp.flow = exp.flow.replace(reserve_points=eval_points)
    model = build_model(exp)
    print(f"model: {model_name(exp)}" + (
        " (the default for a molecule with a bond graph; --geometry cartesian for ShapeFlow)"
        if internal else ""))  # fmt: skip
    if internal:
        symbols = None if exp.labels is None else [element_symbol(z) for z in exp.labels]
        print(model.zmatrix.describe(symbols))
    val = splits["val"][: exp.n_val_flow]
    with progress_line(progress, run_dir.name) as display:
        if internal:
            flow = fit_internal_flow(model, splits["train"], val, run_dir / "flow", exp.flow,
                                     progress=display, setup=setup)  # fmt: skip
        else:
            flow = fit_shape_flow(model, splits["train"], val, run_dir / "flow", exp.flow,
                                  coupling=exp.coupling, progress=display, setup=setup)
        if not final_eval:
            return exp
        estimate = None if flow.last_val_seconds is None \
            else flow.last_val_seconds / flow.val_points * eval_points  # fmt: skip
        lefts = [flow.budget_left_seconds]
        # a quarter of the budget, in s
        slack = 15.0 * (exp.flow.total_budget_minutes or exp.flow.budget_minutes or 0.0)
        fits = estimate is None or None in lefts or estimate <= sum(lefts) + slack
        display.close()  # the announcement is printed with or without a progress line
        print(_eval_announcement(n_test, n_samples, estimate, lefts, exp.flow.clock, fits,
                                 run_dir))  # fmt: skip
        if fits:
            r = evaluate(run_dir, n_samples=n_samples, progress=display)
            display.close()
            print(f"test NLL {nll_summary(r)} on {r['n_test']} clouds | pair-distance JSD "
                  f"{r['distance_jsd']:.4f} (wrote {eval_path(run_dir)})")  # fmt: skip
    return exp


def _eval_announcement(n_test: int, n_samples: int, estimate_s: float | None,
                       left_s: list[float | None], kind: str, fits: bool,
                       run_dir: Path) -> str:  # fmt: skip
    """The line that announces the final evaluation and its estimated cost."""
    what = f"{n_test} test clouds and {n_samples} samples"
    if estimate_s is None:
        return f"evaluating {what} (cost unknown: no validation was timed in this invocation)"
    cost = f"about {minutes(estimate_s)} {kind} min"
    if None in left_s:
        return f"evaluating {what}: {cost}"
    left = f"{minutes(sum(left_s))} min of the budget left"
    if fits:
        return f"evaluating {what}: {cost} ({left})"
    return (f"skipped the evaluation of {what}: {cost}, beyond the budget ({left}); "
            f"`grassflow eval {run_dir}` runs it")


def load_run(run_dir: str | Path) -> tuple[ShapeExperiment, ShapeFlow]:
    """The preset and the model with its best validation checkpoint, eval mode. A run of a
    removed model (`REMOVED_MODELS`) raises a ``ValueError`` that says so."""
    run_dir = Path(run_dir)
    exp = read_preset(run_dir, _preset_reader(run_dir), "shape")
    path = checkpoint_path(run_dir / "flow", "best")
    return exp, load_shape_flow(build_model(exp), path.parent, path.stem)


def _preset_reader(run_dir: Path):
    """`ShapeExperiment.from_dict`, whose refusal of a removed model names ``run_dir``."""

    def from_dict(d: dict) -> ShapeExperiment:
        refuse_removed_model(d.get("model", ADDED_FIELDS["model"]), run_dir)
        return ShapeExperiment.from_dict(d)

    return from_dict


def _distances(P: np.ndarray) -> np.ndarray:
    i, j = np.triu_indices(P.shape[1], 1)
    return np.linalg.norm(P[:, i] - P[:, j], axis=-1).ravel()


def model_name(exp: ShapeExperiment) -> str:
    """The model of a run, in words, as the README names it."""
    if exp.geometry == "internal" and exp.torus:
        return "InternalFlow (internal coordinates: bonds, angles, torsions on the circle)"
    return {"internal": "InternalFlow (internal coordinates: bonds, angles, torsions)",
            "grassmann": "ShapeFlow (Grassmann geometry)"}.get(
        exp.geometry, "ShapeFlow (Cartesian geometry, the EFM baseline)")  # fmt: skip


def _sample_comment(exp: ShapeExperiment, run_dir: str | Path, seed: int) -> str:
    """The comment line of sampled ``.xyz`` frames: which model of which run drew them."""
    where = str(run_dir).replace("\n", " ").replace("\r", " ")
    return f"grassflow {model_name(exp)} sample, seed {seed}, run {where}"


def sample(run_dir: str | Path, n: int, seed: int = 0, save: bool = True,
           progress: bool = False) -> np.ndarray:  # fmt: skip
    """``n`` generated clouds ``(n, n_points, d)``, centred; with ``save``, also written to
    ``samples.npy`` (and ``samples.xyz`` for 3-D clouds, with the shared labels if any as
    element symbols, and the model in each frame's comment line; see `save_clouds`; and
    ``samples.sdf`` for a molecule with bonds).
    ``progress``: show the CPU time it takes on a progress line."""
    exp, model = load_run(run_dir)
    display = Progress(Path(run_dir).name, enabled=progress)
    display.start(f"sampling {n} clouds", 1)
    with torch.no_grad(), display.blocking("solving"):
        X = model.sample(n, torch.Generator().manual_seed(seed)).numpy()
    display.close()
    if not save:
        return X
    _save_run_samples(X, Path(run_dir) / "samples.npy", exp, run_dir, seed)
    return X


def eval_path(run_dir: str | Path, data: str | Path | None = None) -> Path:
    """Where `evaluate` writes: ``eval.json`` for the test split, ``eval_<stem>.json`` for
    the clouds of ``data`` (``heldout.npy`` -> ``eval_heldout.json``)."""
    return Path(run_dir) / ("eval.json" if data is None else f"eval_{Path(data).stem}.json")


def load_heldout(exp: ShapeExperiment, data: str | Path, key: str | None = None) -> dict:
    """The clouds of a user's file (any format `load_point_clouds` reads) for a run of
    ``exp``: ``clouds`` (float64 ``(N, n, d)``), ``skipped`` and ``labels_checked`` (whether
    both the file and the run have labels, which then agree).

    Raises:
        ValueError: clouds of another number of points or dimension than the run's, or
            labels other than the run's (per cloud, in the same point order).
    """
    pc = load_point_clouds(data, key=key)
    N, n, d = pc.positions.shape
    if (n, d) != (exp.n_points, exp.dim):
        raise ValueError(f"{data}: clouds of {n} points in {d}-D, but the run models clouds of "
                         f"{exp.n_points} points in {exp.dim}-D")  # fmt: skip
    checked = pc.labels is not None and exp.labels is not None
    if checked:
        bad = np.flatnonzero((pc.labels != np.asarray(exp.labels)).any(axis=1))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"{data}: {bad.size} of {N} clouds have other point labels than the run's "
                f"(first: {pc.sources[i]}, labels {pc.labels[i].tolist()}; the run's "
                f"{list(exp.labels)}); a model's points carry the run's labels in this "
                "order, so reorder the points (or drop the file's labels)")  # fmt: skip
    return {"clouds": torch.as_tensor(pc.positions, dtype=torch.float64),
            "skipped": pc.skipped, "labels_checked": checked}  # fmt: skip


def _test_log_prob(model, test: torch.Tensor, display: Progress) -> torch.Tensor:
    """The model's log-density of ``test``, in multiples of the model's own chunks (the
    numbers of one call), cloud by cloud on ``display``."""
    display.start("test log-likelihood", len(test), bar_text="{n_fmt}/{total_fmt} clouds")
    chunks = []
    with torch.no_grad():
        for c in test.split(4 * getattr(model, "chunk_size", 16)):
            chunks.append(model.log_prob(c))
            display.update(sum(len(t) for t in chunks))
    return torch.cat(chunks)


def evaluate(
    run_dir: str | Path,
    n_samples: int = 1000,
    seed: int = 0,
    data: str | Path | None = None,
    key: str | None = None,
    progress: bool | Progress = False,
) -> dict:
    """Test NLL in nats per cloud (exact, on the (n - 1) d centred coordinates) and the JSD
    of the pair-distance histograms of samples and test clouds.

    The test clouds are the run's test split, written to ``eval.json``; or, with ``data``,
    every cloud of that file (``key``: its ``.npz`` array; see `load_heldout` for the
    checks), written to ``eval_<stem>.json`` (`eval_path`) with ``data`` and ``n_skipped``.
    """
    run_dir = Path(run_dir)
    exp, model = load_run(run_dir)
    heldout = None if data is None else load_heldout(exp, data, key)
    test = load_clouds(exp)["test"] if heldout is None else heldout["clouds"]
    with progress_line(progress, f"{run_dir.name} eval") as display:
        log_prob = _test_log_prob(model, test, display)
        with display.blocking(f"sampling {n_samples} clouds"):
            X = sample(run_dir, n_samples, seed, save=False)  # leaves the user's samples.npy
    a, b = _distances(X), _distances(test.numpy())
    hi = float(np.quantile(b, 0.999)) * 1.5
    result = {
        "n_test": len(test), "n_points": exp.n_points, "dim": exp.dim, "model": exp.model,
        "test_nll": -log_prob.mean().item(),
        "test_nll_sem": (log_prob.std() / len(test) ** 0.5).item(),
        "params": sum(p.numel() for p in model.parameters()),
        "distance_jsd": jsd(histogram(a, 100, 0.0, hi), histogram(b, 100, 0.0, hi)),
        **{f"flow_{k}": value for k, value in training_status(run_dir / "flow").items()},
    }  # fmt: skip
    if heldout is not None:
        result.update(data=str(Path(data).resolve()), n_skipped=len(heldout["skipped"]),
                      labels_checked=heldout["labels_checked"])  # fmt: skip
    write_json(result, eval_path(run_dir, data))
    return result


def plot(run_dir: str | Path, path: str | Path | None = None, n_show: int = 4) -> Path:
    """Pair-distance histograms of samples beside the test clouds, and ``n_show`` samples."""
    from matplotlib.figure import Figure

    run_dir = Path(run_dir)
    exp, _ = load_run(run_dir)
    samples_path = run_dir / "samples.npy"
    X = np.load(samples_path) if samples_path.exists() else sample(run_dir, 1000)
    data = load_clouds(exp)["test"].numpy()
    fig = Figure(figsize=(3.0 * (n_show + 1), 3.0))
    axes = fig.subplots(1, n_show + 1)
    a, b = _distances(X), _distances(data)
    hi = float(np.quantile(b, 0.999)) * 1.5
    for values, label, color in ((b, "test clouds", "k"), (a, "samples", "C3")):
        axes[0].hist(values, bins=100, range=(0, hi), density=True, histtype="step",
                     color=color, label=label)  # fmt: skip
    axes[0].set_xlabel("pair distance")
    axes[0].legend(fontsize=7)
    for ax, cloud in zip(axes[1:], X):
        ax.scatter(cloud[:, 0], cloud[:, 1], s=12, c="C3")
        ax.set_aspect("equal")
        ax.set_title("sample (first two coordinates)" if exp.dim > 2 else "sample", fontsize=8)
    fig.tight_layout()
    path = run_dir / "shapes.png" if path is None else Path(path)
    fig.savefig(path, dpi=110)
    return path


def nll_summary(r: dict) -> str:
    """The test NLL with its standard error, from an ``eval.json``."""
    return f"{r['test_nll']:.3f} ± {r['test_nll_sem']:.3f} nats per shape"


def save_sampled_clouds(
    X: np.ndarray,
    out: str | Path,
    labels=None,
    comment: str = "grassflow sample",
    *,
    bonds=None,
    bond_orders=None,
    charges=None,
) -> str:
    """`save_clouds`, and what it wrote, in words. With ``bonds`` (and labels, in 3-D) also
    an ``.sdf`` beside it, ready for a molecule viewer (`write_sdf`: ``bond_orders``,
    formal ``charges``)."""
    written = save_clouds(X, out, labels, comment)
    if bonds is not None and labels is not None and X.shape[-1] == 3:
        titles = [f"{comment}, #{i}" for i in range(len(X))]
        sdf = Path(out).with_suffix(".sdf")
        written.append(write_sdf(sdf, X, np.asarray(labels), np.asarray(bonds), bond_orders,
                                 titles, charges=charges))  # fmt: skip
    return f"wrote {len(X)} clouds {tuple(X.shape)} to " + ", ".join(map(str, written))


def _save_run_samples(X: np.ndarray, out: str | Path, exp: ShapeExperiment, run_dir: str | Path,
                      seed: int) -> str:  # fmt: skip
    """`save_sampled_clouds` for clouds drawn by the run of ``exp`` in ``run_dir``: its
    labels, bonds and the charges of its ``molecule.mol``."""
    mol = Path(run_dir) / MOLBLOCK
    return save_sampled_clouds(
        X, out, exp.labels, _sample_comment(exp, run_dir, seed), bonds=exp.bonds,
        bond_orders=exp.bond_orders,
        charges=molblock_charges(mol.read_text()) if mol.exists() else None)  # fmt: skip


def _run_label(run_dir: Path) -> str:
    """``[n points in d-D, <model_name>]``: what `eval` lines call the run's model (the
    results' ``model`` field is the preset's identifier, ``equivariant-cnf`` for every run)."""
    exp = read_preset(run_dir, _preset_reader(run_dir), "shape")
    return f"[{exp.n_points} points in {exp.dim}-D, {model_name(exp)}]"


def _eval_line(run_dir: Path, n_samples: int, seed: int) -> str:
    r = evaluate(run_dir, n_samples=n_samples, seed=seed, progress=True)
    return (f"{_run_label(run_dir)} test NLL {nll_summary(r)} | "
            f"pair-distance JSD {r['distance_jsd']:.4f}")  # fmt: skip


def _eval_data_line(run_dir: Path, data: Path, key: str | None, n_samples: int, seed: int) -> str:
    r = evaluate(run_dir, n_samples=n_samples, seed=seed, data=data, key=key, progress=True)
    notes = [f"{r['n_skipped']} rank-deficient clouds skipped"] if r["n_skipped"] else []
    if not r["labels_checked"]:
        notes.append("labels not checked: the file or the run has none")
    notes = f" ({'; '.join(notes)})" if notes else ""
    return (f"{_run_label(run_dir)} NLL of the "
            f"{r['n_test']} clouds of {data}{notes}: {nll_summary(r)} | pair-distance JSD "
            f"{r['distance_jsd']:.4f}\n"
            f"wrote {eval_path(run_dir, data)}")  # fmt: skip


def _sample_line(run_dir: Path, n: int, seed: int, out: Path) -> str:
    exp = read_preset(run_dir, _preset_reader(run_dir), "shape")
    return _save_run_samples(sample(run_dir, n, seed, progress=True), out, exp, run_dir, seed)


RUN_KIND = RunKind(evaluate=_eval_line, sample=_sample_line, plot=lambda run_dir: [plot(run_dir)],
                   evaluate_data=_eval_data_line)  # fmt: skip
