"""The paper's MLP potential against the permutation-invariant graph potential, same CPU budget.

For DW4 and LJ13 (the Klein et al. files, com-free, n = 1,000 training configurations) and
QM9 (the cormorant split, 1,000 training molecules' worth of batches from all 13,832), each
potential's GrCNF on Gr(d, n - 1) (the flow of the paper's two-part model,
`grassflow_paper.two_part`) trains by flow matching for ``--minutes`` of wall-clock,
the validation NLL (exact ODE, ``--n-val`` configurations) picks the checkpoint, and the
Grassmann test NLL is evaluated exactly on the first ``--n-test`` test configurations, with
the ODE's NFE. Resumable: rerunning continues the runs in ``--runs`` (a larger ``--minutes``
trains further) and re-evaluates.

    OMP_NUM_THREADS=1 PYTHONPATH=src python experiments/two_part/shape_potentials.py \
        --out results/shape_potentials --minutes 3      # ~25 min on one core
    OMP_NUM_THREADS=1 PYTHONPATH=src python experiments/two_part/shape_potentials.py --systems qm9 \
        --minutes 5 --runs runs/shape_potentials_qm9    # then --minutes 20: continues the runs

Results accumulate in ``shape_potentials.json``, one row per system, potential and budget,
each with the command that made it.
The NFE columns are the validation solve's (its last chunk) at the first and last validation,
which shows how much harder the learned flow is to integrate as training goes on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from grassflow.data.particle_files import shared_data_dir
from grassflow.training import OBJECTIVES, TrainConfig, load_checkpoint, read_metrics, train
from grassflow.training.rng import seeded_init
from grassflow_paper import provenance
from grassflow_paper.two_part import TwoPartShapeFlow

KLEIN = {"dw4": ("train_split_DW4.npy", "val_split_DW4.npy", "test_split_DW4.npy", 4, 2),
         "lj13": ("val_split_LJ13-1000.npy", None, "test_split_LJ13-1000.npy", 13, 3)}  # fmt: skip


def clouds(system: str) -> dict[str, torch.Tensor]:
    """Train / val / test clouds ``(N, n, d)``, float64."""
    if system == "qm9":
        from grassflow_paper.qm9_runs import load_molecules

        X = load_molecules("data")
        return {"train": X["train"], "val": X["valid"], "test": X["test"]}
    train_f, val_f, test_f, n, d = KLEIN[system]
    root = shared_data_dir() / "alt_klein2023_from_DEM"
    load = lambda f: torch.tensor(np.load(root / f), dtype=torch.float64).reshape(-1, n, d)  # noqa: E731
    train_x, test_x = load(train_f), load(test_f)
    # LJ13 (E-NF/Klein protocol): train on the first 1,000 of the val file, select on test
    # configurations 1,000-2,000, test on the first 1,000
    val_x = test_x[1000:2000] if val_f is None else load(val_f)
    return {"train": train_x[:1000], "val": val_x[:1000], "test": test_x[:1000]}


def run(system: str, potential: str, args, data: dict) -> dict:
    n, d = data["train"].shape[1:]
    with seeded_init(0):
        model = TwoPartShapeFlow(n, d, potential).double()
    Y = {s: model.factor(x)[0] for s, x in data.items()}
    run_dir = Path(args.runs) / f"{system}-{potential}"
    cfg = TrainConfig(lr=1e-3, weight_decay=1e-12, batch_size=100, iterations=10**7,
                      val_every=None, val_doubling_from=100, val_every_minutes=0.5,
                      log_every=200, checkpoint_every=2000, dtype="float64",
                      total_budget_minutes=args.minutes)  # fmt: skip
    train(model.flow, Y["train"], cfg, run_dir, val_data=Y["val"][: args.n_val],
          objective=OBJECTIVES["fm"], resume=True, progress=args.progress)  # fmt: skip
    best = load_checkpoint(run_dir / "best.pt")
    model.flow.load_state_dict(best["model"])
    model.eval()
    test = Y["test"][: args.n_test]
    with torch.no_grad():
        lp = torch.cat([model.flow.log_prob(c) for c in test.split(model.chunk_size)])
    last = load_checkpoint(run_dir / "last.pt")
    curve = [(r["elapsed"] / 60, r["val_nll"], r.get("val_nfe"))
             for r in read_metrics(run_dir / "metrics.jsonl") if "val_nll" in r]  # fmt: skip
    return {
        "system": system, "potential": potential, "manifold": f"Gr({d},{n - 1})",
        "test_nll_grassmann": -lp.mean().item(), "test_nll_sem": (lp.std() / len(lp) ** 0.5).item(),
        "n_test": len(test), "uniform_nll": model.manifold.log_volume(),
        "nfe_test": model.flow.last_stats["nfe"], "iterations": int(last["iteration"]),
        "trained_minutes": last["elapsed"] / 60, "best_iteration": best["iteration"],
        "minutes": args.minutes, "val_curve": curve,
        "nfe_val_first": curve[0][2] if curve else None,
        "nfe_val_last": curve[-1][2] if curve else None,
    }  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", nargs="*", default=["dw4", "lj13", "qm9"],
                   help="none: only rewrite the table from the JSON")
    p.add_argument("--potentials", nargs="+", default=["mlp", "graph"])
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--n-val", type=int, default=200)
    p.add_argument("--n-test", type=int, default=500)
    p.add_argument("--runs", default="runs/shape_potentials")
    p.add_argument("--out", default="results/shape_potentials")
    p.add_argument("--progress", action="store_true")
    args = p.parse_args(argv)
    torch.set_default_dtype(torch.float64)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "shape_potentials.json"
    rows = json.loads(path.read_text()) if path.exists() else {}
    if isinstance(rows, list):  # the first version's format, one budget per system
        rows = {f"{r['system']}-{r['potential']}-{r.get('minutes', 3.0):g}": r for r in rows}
    for system in args.systems:
        data = clouds(system)
        for potential in args.potentials:
            row = run(system, potential, args, data)
            row["command"] = provenance.command(None if argv is None else [sys.argv[0], *argv])
            rows[f"{system}-{potential}-{args.minutes:g}"] = row
            print(json.dumps({k: v for k, v in row.items() if k != "val_curve"}), flush=True)
            path.write_text(json.dumps(rows, indent=1))
    lines = ["| system | manifold | potential | budget (min) | trained (min) | iterations | "
             "Grassmann test NLL | uniform | NFE: first val, last val, test |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    order = lambda r: (r["system"], r["potential"], r.get("minutes", 3.0))  # noqa: E731
    for r in sorted(rows.values(), key=order):
        nfe = f"{r.get('nfe_val_first', '–')}, {r.get('nfe_val_last', '–')}, {r['nfe_test']}"
        lines.append(f"| {r['system'].upper()} | {r['manifold']} | {r['potential']} | "
                     f"{r.get('minutes', 3.0):g} | {r['trained_minutes']:.1f} | "
                     f"{r['iterations']:,} | "
                     f"{r['test_nll_grassmann']:.3f} ± {r['test_nll_sem']:.3f} | "
                     f"{r['uniform_nll']:.3f} | {nfe} |")  # fmt: skip
    made_by = provenance.made_by(sorted(rows.values(), key=order))
    (out / "shape_potentials.md").write_text(made_by + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
