"""How low can the two-part model's Gram part go? The Gram density alone, more data and longer
training.

Run: ``PYTHONPATH=src python experiments/two_part/gram_bound.py [--systems dw4 lj13]
[--minutes 10]``.

The two-part ShapeFlow (the paper's, `grassflow_paper.two_part`; out of the library since
issue 34) has a Cartesian NLL of Grassmann + Gram + Jacobian, and the Gram part (the density of
a cloud's in-span Gram matrix S given its span, `grassflow_paper.gram_densities.WishartGram`) is
trained on its own by maximum likelihood. This trains only that part, for each setting in
:data:`SETTINGS` (mixture components, width, depth) and each training size (up to the 10,000
rows of the training file; the first ``n``, distinct rows), for ``--minutes`` CPU minutes on
one thread, selecting on the validation rows of the vs-E-NF protocol, and reports its test
NLL part on the 1,000 test rows. It separates "the Wishart family cannot represent S given
the span" (more data and time do not help) from "it does not learn fast enough", and puts
beside it another family, `grassflow_paper.gram_densities.DistanceGram` (a log-normal around a
least-squares fit of learned pair distances, with per-pair precisions). The floor that no
conditional can beat is ``experiments/two_part/part_floors.py``'s.
Runs are resumable (``runs/gram_bound``); results go to ``results/gram_bound.{json,md}``, each
row with the command that made it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from grassflow.training import TrainConfig, load_checkpoint, train
from grassflow.training.rng import seeded_init
from grassflow.training.threads import set_threads
from grassflow_paper import provenance
from grassflow_paper.two_part import GramTerm, TwoPartShapeFlow
from grassflow_paper.vs_enf import SHAPES, load_enf_splits

SETTINGS = {  # name -> (family, components, hidden, layers)
    "4 Wisharts, 32 x 1 (ShapeFlow's)": ("wishart", 4, 32, 1),
    "16 Wisharts, 64 x 2": ("wishart", 16, 64, 2),
    "pair-distance fit, 1 log-normal, 32 x 1": ("distance", 1, 32, 1),
    "pair-distance fit, 4 log-normals, 32 x 2": ("distance", 4, 32, 2),
    "pair-distance fit, 8 log-normals, 32 x 2": ("distance", 8, 32, 2),
}


def gram_nll(system: str, n_train: int, setting: str, minutes: float, runs: Path) -> dict:
    family, components, hidden, layers = SETTINGS[setting]
    data = load_enf_splits(system, n_train)
    with seeded_init(0):
        model = TwoPartShapeFlow(*SHAPES[system], gram=family, gram_options={
            "components": components, "hidden": hidden, "layers": layers}).double()  # fmt: skip
    Y, S = model.factor(data["train"])
    model.gram.initialize(S, Y)
    term = GramTerm(model)
    config = TrainConfig(lr=1e-3, batch_size=128, iterations=10**7, val_every=200,
                         log_every=100, checkpoint_every=1000, dtype="float64",
                         total_budget_minutes=minutes)  # fmt: skip
    tag = "" if family == "wishart" else "pairfit-"
    run_dir = runs / f"{system}-n{n_train}-{tag}{components}x{hidden}x{layers}"
    result = train(term, data["train"], config, run_dir, val_data=data["val"],
                   resume=True, progress=False)  # fmt: skip
    best = load_checkpoint(run_dir / "best.pt")
    term.load_state_dict(best["model"])
    with torch.no_grad():
        test = -term.log_prob(data["test"])
        train_nll = -term.log_prob(data["train"][:1000]).mean().item()
    return {
        "system": system, "setting": setting, "n_train": n_train,
        "n_train_distinct": len(data["train"]), "minutes": minutes,
        "iterations": result.iterations, "best_iteration": int(best["iteration"]),
        "val_nll_gram": best["val_nll"], "train_nll_gram": train_nll,
        "test_nll_gram": test.mean().item(), "test_nll_gram_sem": (test.std() /
                                                                   len(test) ** 0.5).item(),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", nargs="+", default=["dw4", "lj13"])
    p.add_argument("--n-train", nargs="+", type=int, default=[1000, 10000])
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--runs", default="runs/gram_bound")
    p.add_argument("--out", default="results")
    args = p.parse_args()
    set_threads(1)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "gram_bound.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    for system in args.systems:
        for n in args.n_train:
            for setting in args.settings:
                r = gram_nll(system, n, setting, args.minutes, Path(args.runs))
                r["command"] = provenance.command()
                rows = [o for o in rows if (o["system"], o["setting"], o["n_train"],
                        o["minutes"]) != (system, setting, n, args.minutes)] + [r]  # fmt: skip
                path.write_text(json.dumps(rows, indent=1))
                print(json.dumps(r), flush=True)
    lines = ["| system | Gram density | n_train (distinct) | CPU min | iterations | train | "
             "validation | test (± SEM) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['system']} | {r['setting']} | {r['n_train']:,} "
                     f"({r['n_train_distinct']:,}) | {r['minutes']:g} | {r['iterations']:,} | "
                     f"{r['train_nll_gram']:.2f} | {r['val_nll_gram']:.2f} | "
                     f"{r['test_nll_gram']:.2f} ± {r['test_nll_gram_sem']:.2f} |")  # fmt: skip
    table = provenance.made_by(rows) + "\n".join(lines) + "\n"
    (Path(args.out) / "gram_bound.md").write_text(table)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
