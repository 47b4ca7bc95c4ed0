"""Real molecules: the shape model on thermal conformer ensembles (issue 22, item 5).

Until issue 34 this compared both shape models; the two-part ShapeFlow's rows in
``results/real_molecules.*`` were made by commit 3531f93 (the last with it in the library) and
are kept there. Its runs can still be diagnosed (``--diagnose``, with the paper's
`grassflow_paper.two_part`), but only ``equivariant-cnf`` trains now.

Run (one core; roughly 1 hour: per molecule ~30 s of data, 4 min of training, up to as much
validation, and the evaluation, mostly the exact likelihoods: 2.1 CPU min for 20 test
conformers and 100 samples of alanine dipeptide in the smoke run)::

    PYTHONPATH=src python benchmarks/real_molecules.py --minutes 4 \\
        --runs runs/real_molecules --out results

Smoke test (200 conformers, 0.2 training minutes, small evaluation; ~10 minutes)::

    PYTHONPATH=src python benchmarks/real_molecules.py --smoke \\
        --runs runs/realmol_smoke --out runs/realmol_smoke

The issue's target: on ensembles of small flexible molecules (10-25 atoms, a few thousand
conformers) at least 95 % of samples keep every bond within 10 % of its length in the data,
and fewer than 1 % have a clash (two atoms closer than 0.9 Å).

For each molecule (``--molecules``; n-butane 14 atoms, glycerol 14, alanine dipeptide 22,
hydrogens explicit) ``--n-conformers`` MMFF94 conformers at 300 K are generated
(:func:`grassflow.data.conformers.conformer_ensemble`, cached as ``RUNS/data/*.npz``), then
each model (``--models``) is trained as ``grassflow train --data FILE --model M`` trains it
(:func:`grassflow.tasks.shape_runs.run`: the same preset, split and training), except that
``--minutes`` is a total CPU budget of the run, so a rerun continues an interrupted run
instead of training it longer. One thread; each run in ``RUNS/<molecule>/<model>``. The
model gets the atoms' elements as point labels. Reported per molecule and model:

* test NLL ± SEM (nats per molecule, exact, on the (n - 1) 3 centred coordinates) on the
  first ``--n-test`` test conformers (the exact likelihood of the baseline costs ~(n - 1) 3
  forward-mode products per ODE step);
* bonds kept: the fraction of ``--n-samples`` samples in which every bond is within 10 % of
  its mean length in the training conformers, after matching the sample's atoms to the
  molecule's within each element (:func:`grassflow.metrics.bonds_kept`, 16 training
  conformers as references); the ``data`` row scores the test conformers the same way;
* clashes: the fraction of samples with two atoms closer than 0.9 Å;
* training CPU minutes and iterations, and parameters.

``--diagnose`` adds to finished ShapeFlow rows (their runs made by 3531f93, in
``RUNS/<molecule>/shapeflow``) where their nats and broken bonds come from
(`diagnose`): the parts of the test NLL, and the bonds kept of clouds built from the test
conformers' own spans or the flow's spans, with S from the Gram density or from a
least-squares fit of the molecule's bond lengths.

Rows are appended to ``OUT/real_molecules.json`` and ``.md`` as they finish; finished rows
(same molecule, model, conformers, minutes) are skipped on a rerun.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from grassflow.data.conformers import cached_ensemble
from grassflow.distributions.cartesian import log_jacobian_gram
from grassflow.metrics import bond_lengths, bonds_kept_fraction, closest_pair_fraction, mean_sem
from grassflow.tasks import shape_runs as shapes
from grassflow.tasks.run_dir import read_preset, training_status
from grassflow.training.rng import seeded_init
from grassflow.training.threads import set_threads
from grassflow_paper.two_part import (
    DistanceGram,
    TwoPartShapeFlow,
    load_shape_flow,
    metric_fit,
    preset_field_options,
)

MOLECULES = {"butane": "CCCC", "glycerol": "OCC(O)CO",
             "alanine-dipeptide": "CC(=O)NC(C)C(=O)NC"}  # fmt: skip
MODELS = ("equivariant-cnf",)
TOL, CLASH = 0.1, 0.9  # relative bond tolerance; clash distance in Å
N_REFERENCES = 16


def experiment(data: Path, model: str, minutes: float, n_val: int) -> shapes.ShapeExperiment:
    """The preset of ``grassflow train --data DATA --model MODEL`` with a total budget."""
    exp = shapes.ShapeExperiment(data=str(data), model=model, n_val_flow=n_val)
    exp.flow = exp.flow.replace(total_budget_minutes=minutes, clock="cpu")
    return exp


def quality(X: np.ndarray, train: np.ndarray, bonds: np.ndarray, labels: np.ndarray) -> dict:
    """Bonds kept and clash fraction of clouds ``X: (N, n, 3)`` against the training set."""
    refs = train[np.linspace(0, len(train) - 1, N_REFERENCES).astype(int)]
    l0 = bond_lengths(train, bonds).mean(0)
    return {
        "bonds_kept": bonds_kept_fraction(X, bonds, l0, TOL, labels=labels, reference=refs),
        "clash_fraction": closest_pair_fraction(X, CLASH),
    }


def evaluate(run_dir: Path, bonds: np.ndarray, n_test: int, n_samples: int) -> dict:
    """Test NLL of the first ``n_test`` test clouds, and the quality of ``n_samples``."""
    cpu0 = time.process_time()
    exp, model = shapes.load_run(run_dir)
    splits = shapes.load_clouds(exp)
    test = splits["test"][:n_test]
    with torch.no_grad():
        logp = torch.cat([model.log_prob(c) for c in test.split(64)])
        X = model.sample(n_samples, torch.Generator().manual_seed(0)).numpy()
    np.save(run_dir / "samples.npy", X)
    flow = training_status(run_dir / "flow")
    return {
        **{k: -v if k == "test_nll" else v
           for k, v in mean_sem("test_nll", logp).items()},  # fmt: skip
        "n_test": len(test),
        **quality(X, splits["train"].numpy(), bonds, np.asarray(exp.labels)),
        "n_samples": n_samples,
        "cpu_minutes": flow["cpu_minutes"],
        "iterations": flow["iterations"], "gram_iterations": 0,
        "params": sum(p.numel() for p in model.parameters()),
        "eval_cpu_minutes": (time.process_time() - cpu0) / 60,
    }  # fmt: skip


def bond_fit(model, Y: torch.Tensor, bonds: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
    """The metric that best gives the span's bonds their mean data ``lengths`` (least squares
    in S, `grassflow_paper.gram_densities.metric_fit`), lifted to positive definite:
    ``(B, d, d)``."""
    b = torch.as_tensor(bonds)
    points = model.H.to(Y) @ Y  # the span's points in Y's frame, as sample_given builds clouds
    d = points[:, b[:, 0]] - points[:, b[:, 1]]
    target = torch.as_tensor(lengths, dtype=d.dtype).square().expand(d.shape[:-1])
    S = metric_fit(d, torch.ones_like(target), target)
    low = torch.linalg.eigvalsh(S)[:, :1, None]
    return S + torch.relu(1e-3 - low) * torch.eye(S.shape[-1], dtype=S.dtype)


def load_two_part_run(run_dir: Path) -> tuple:
    """The preset (a `shapes.ShapeExperiment` without the removed fields) and the two-part
    model of a ShapeFlow run that ``grassflow train --data`` made up to commit 3531f93, built
    as that commit built it and loaded with each part's best checkpoint."""
    preset = read_preset(run_dir, dict, "shape")
    if preset.get("model", "shapeflow") != "shapeflow":
        raise ValueError(f"{run_dir} is not a ShapeFlow run")
    keep = {k: v for k, v in preset.items() if k not in shapes.REMOVED_FIELDS}
    exp = shapes.ShapeExperiment(**{**keep, "model": "equivariant-cnf"})  # the split's fields
    labels = None if exp.labels is None else torch.tensor(exp.labels)
    hidden = preset.get("hidden")
    with seeded_init(exp.flow.seed):
        model = TwoPartShapeFlow(
            exp.n_points, exp.dim, preset["potential"], preset.get("gram_density", "wishart"),
            labels=labels, chunk_size=exp.chunk_size, prior=preset["prior"],
            field_options=preset_field_options(
                preset["potential"], tuple(hidden) if isinstance(hidden, list) else hidden,
                exp.layers),
            gram_options={"components": preset.get("gram_components", 1)},
            atol=exp.atol, rtol=exp.rtol,
        ).double()  # fmt: skip
    return exp, load_shape_flow(model, run_dir)


def diagnose(run_dir: Path, bonds: np.ndarray, n_test: int, n_samples: int) -> dict:
    """Where a ShapeFlow's nats and broken bonds come from (its run made by 3531f93).

    * the Gram and Jacobian parts of the test NLL (the Grassmann part is the rest);
    * ``own``: clouds from the test conformers' own spans with S drawn from the Gram density
      (the Gram part alone);
    * ``own_centre``: the same spans with the Gram density's centre (pair-distance density);
    * ``own_bondfit``: the same spans with the S that best fits the molecule's bond lengths
      (what a Gram density centred on the bond graph could reach);
    * ``model_bondfit``: the flow's sampled spans with that S (whether its spans admit the
      molecule's bonds at all).
    """
    exp, model = load_two_part_run(run_dir)
    splits = shapes.load_clouds(exp)
    test, train = splits["test"], splits["train"].numpy()
    lengths = bond_lengths(train, bonds).mean(0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        Y, S = model.factor(test[:n_test])
        out = {"test_nll_gram": -model.gram.log_prob(S, Y).mean().item(),
               "test_nll_jacobian": -log_jacobian_gram(torch.diagonal(S, dim1=-2, dim2=-1),
                                                       exp.n_points - 1).mean().item()}
        own = model.factor(test[:n_samples])[0]
        spans = model.flow.sample(min(n_samples, len(own)), generator=gen)
        clouds = {"own": model.sample_given(own, gen)}
        if isinstance(model.gram, DistanceGram):  # its centre S*, of the likeliest component
            L, _, log_pi = model.gram.mixture_params(own)
            c = log_pi.argmax(-1)[:, None, None, None].expand(-1, 1, *L.shape[-2:])
            L = L.take_along_dim(c, dim=1).squeeze(1)
            clouds["own_centre"] = model.sample_given(own, gen, S=L @ L.mT)
        for name, Ys in (("own_bondfit", own), ("model_bondfit", spans)):
            clouds[name] = model.sample_given(Ys, gen, S=bond_fit(model, Ys, bonds, lengths))
    for name, X in clouds.items():
        q = quality(X.numpy(), train, bonds, np.asarray(exp.labels))
        out |= {f"{name}_bonds_kept": q["bonds_kept"], f"{name}_clashes": q["clash_fraction"]}
    return out


def data_row(path: Path, bonds: np.ndarray, n_test: int) -> dict:
    """The same quality measures on the test conformers themselves (what a model aims at)."""
    exp = shapes.ShapeExperiment(data=str(path))
    splits = shapes.load_clouds(exp)
    test = splits["test"][:n_test].numpy()
    return {**quality(test, splits["train"].numpy(), bonds, np.asarray(splits["labels"])),
            "n_samples": len(test)}  # fmt: skip


def markdown(rows: list[dict]) -> str:
    lines = [
        "Shape models on thermal MMFF94 conformer ensembles (300 K, hydrogens explicit), one "
        "CPU thread. NLL: nats per molecule, exact, on the first test conformers. Bonds kept: "
        f"samples with every bond within {TOL:.0%} of its mean data length (atoms matched "
        f"within elements). Clashes: samples with two atoms closer than {CLASH} Å. Target "
        "(issue 22): bonds kept >= 95 %, clashes < 1 %. `data`: the test conformers.", "",
        "| molecule | atoms | conformers | model | test NLL | bonds kept | clashes | target | "
        "CPU min | iterations | params |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        nll = "" if r.get("test_nll") is None else \
            f"{r['test_nll']:.2f} ± {r['test_nll_sem']:.2f} (n={r['n_test']})"  # fmt: skip
        met = "yes" if r["bonds_kept"] >= 0.95 and r["clash_fraction"] < 0.01 else "no"
        iters = "" if "iterations" not in r else f"{r['iterations']:,}" + (
            f" + {r['gram_iterations']:,}" if r.get("gram_iterations") else "")
        lines.append(
            f"| {r['molecule']} | {r['n_atoms']} | {r['n_conformers']:,} | `{r['model']}` | "
            f"{nll} | {r['bonds_kept']:.1%} | {r['clash_fraction']:.1%} | {met} | "
            + ("" if "cpu_minutes" not in r else f"{r['cpu_minutes']:.2f}")
            + f" | {iters} | " + ("" if "params" not in r else f"{r['params']:,}") + " |"
        )
    parts = [r for r in rows if "own_bondfit_bonds_kept" in r]
    if parts:
        lines += ["", "ShapeFlow's parts (`--diagnose`): the test NLL as Grassmann + Gram + "
                  "Jacobian (the last is the data's); bonds kept / clashes of clouds from the "
                  "test conformers' own spans with S from the Gram density (the Gram part "
                  "alone), its centre, or the S that best fits the bond lengths (bond fit), "
                  "and of the flow's sampled spans with the bond fit (do its spans admit the "
                  "bonds?).", "", "| molecule | Grassmann | Gram | Jacobian | own spans, Gram "
                  "density | own spans, its centre | own spans, bond fit | model spans, bond "
                  "fit |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in parts:
            grassmann = r["test_nll"] - r["test_nll_gram"] - r["test_nll_jacobian"]
            cells = [f"{r[f'{c}_bonds_kept']:.1%} / {r[f'{c}_clashes']:.1%}"
                     for c in ("own", "own_centre", "own_bondfit", "model_bondfit")
                     if f"{c}_bonds_kept" in r]  # fmt: skip
            lines.append(f"| {r['molecule']} | {grassmann:.2f} | {r['test_nll_gram']:.2f} | "
                         f"{r['test_nll_jacobian']:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--molecules", nargs="+", default=list(MOLECULES), choices=list(MOLECULES))
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--minutes", type=float, default=4.0, help="training CPU minutes per run")
    p.add_argument("--n-conformers", type=int, default=3000)
    p.add_argument("--n-test", type=int, default=200, help="test conformers for the NLL")
    p.add_argument("--n-samples", type=int, default=1000)
    p.add_argument("--n-val", type=int, default=200,
                   help="validation conformers for the flow's exact NLL during training")
    p.add_argument("--seed", type=int, default=0, help="of the conformer ensembles")
    p.add_argument("--runs", default="runs/real_molecules")
    p.add_argument("--out", default="results")
    p.add_argument("--smoke", action="store_true",
                   help="tiny: 200 conformers, 0.2 min, 20 test conformers, 100 samples")
    p.add_argument("--diagnose", action="store_true",
                   help="add to finished ShapeFlow rows (runs made by 3531f93) where their "
                        "nats and broken bonds come from (see diagnose)")
    args = p.parse_args()
    if args.smoke:
        args.n_conformers, args.minutes, args.n_test, args.n_samples, args.n_val = \
            200, 0.2, 20, 100, 20  # fmt: skip
    set_threads(1)
    runs, out = Path(args.runs), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "real_molecules.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    key = lambda r: (r["molecule"], r["model"], r["n_conformers"], r.get("minutes"))
    done = {key(r) for r in rows}
    for name in args.molecules:
        data = runs / "data" / f"{name}-{args.n_conformers}-seed{args.seed}.npz"
        ens = cached_ensemble(data, MOLECULES[name], args.n_conformers, seed=args.seed)
        base = {"molecule": name, "smiles": ens.smiles, "n_atoms": ens.positions.shape[1],
                "n_conformers": len(ens.positions), "data_acceptance": ens.stats["acceptance"],
                "data_cpu_seconds": ens.stats["cpu_seconds"]}  # fmt: skip
        todo = [("data", None)] + [(m, args.minutes) for m in args.models]
        if args.diagnose:  # the removed model's finished rows
            todo += [("shapeflow", r.get("minutes")) for r in rows
                     if (r["molecule"], r["model"], r["n_conformers"])
                     == (name, "shapeflow", base["n_conformers"])]  # fmt: skip
        for model, minutes in todo:
            row = {**base, "model": model, "minutes": minutes}
            if key(row) in done:
                if args.diagnose and model == "shapeflow":
                    i = next(i for i, r in enumerate(rows) if key(r) == key(row))
                    rows[i] |= diagnose(runs / name / model, ens.bonds, rows[i]["n_test"],
                                        args.n_samples)  # fmt: skip
                    path.write_text(json.dumps(rows, indent=1))
                    (out / "real_molecules.md").write_text(markdown(rows))
                continue
            if model == "data":
                row |= data_row(data, ens.bonds, args.n_samples)
            else:
                run_dir = runs / name / model
                shapes.run(experiment(data, model, minutes, args.n_val), run_dir, resume=True,
                           progress=False)  # fmt: skip
                row |= evaluate(run_dir, ens.bonds, args.n_test, args.n_samples)
            rows.append(row)
            done.add(key(row))
            print(json.dumps(row), flush=True)
            path.write_text(json.dumps(rows, indent=1))
            (out / "real_molecules.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
