"""Tuning the equivariant flow-matching baseline (EFM) on the vs-E-NF protocol.

Run: ``PYTHONPATH=src python experiments/vs_enf/efm_tuning.py [--systems dw4 lj13] [--minutes 2]``.

One factor at a time around EFM's own settings (EGNN 32 x 3, lr 1e-3, batch 64, equivariant
OT): learning rate, batch size, coupling, width and depth. Each setting trains for
``--minutes`` CPU minutes (one thread, seed 0, n_train = 1,000) and is scored by the exact
validation NLL of its final weights on the first 100 validation configurations (one
validation per run: LJ13's costs about a CPU minute), never on the test set. Runs are
resumable (``--runs``, default ``runs/efm_tuning_final``); the table goes to
``results/efm_tuning.{json,md}``, each row with the command that made it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from grassflow.tasks.run_dir import training_status
from grassflow.training import load_checkpoint
from grassflow.training.threads import set_threads
from grassflow_paper import efm, provenance
from grassflow_paper.vs_enf import load_enf_splits

VARIANTS = {  # name -> changes from EFMExperiment's defaults
    "EFM's settings": {},
    "lr 3e-3": {"lr": 3e-3},
    "lr 3e-4": {"lr": 3e-4},
    "batch 256": {"batch_size": 256},
    "plain OT": {"coupling": "ot"},
    "width 64": {"hidden": 64},
    "depth 5": {"layers": 5},
}


def tune(systems, minutes: float, runs: Path, variants: dict) -> list[dict]:
    rows = []
    for system in systems:
        data = load_enf_splits(system, 1000)
        for name, changes in variants.items():
            base = efm.EFMExperiment(system=system, minutes=minutes, val_every_minutes=None,
                                     val_doubling_from=None)  # fmt: skip
            exp = dataclasses.replace(base, **changes)
            run_dir = runs / exp.run_name
            efm.run(exp, run_dir, progress=False, data=data)
            best = load_checkpoint(run_dir / "flow" / "best.pt")
            status = training_status(run_dir / "flow")
            rows.append({
                "system": system, "variant": name, "model": exp.model, "minutes": minutes,
                "val_nll": best["val_nll"], "best_iteration": int(best["iteration"]),
                "iterations": status["iterations"], "cpu_minutes": status["cpu_minutes"],
                "val_cpu_minutes": status["val_cpu_minutes"], "n_val": exp.n_val,
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "Validation NLL of the final weights (nats, first 100 validation configurations, "
        "exact, float32, atol = rtol = 1e-4) after the CPU minutes given, seed 0, n_train = "
        "1,000.", "",
        "| system | variant | model | CPU min | iterations | best at | validation NLL |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['system']} | {r['variant']} | `{r['model']}` | "
                     f"{r['cpu_minutes']:.2f} | {r['iterations']:,} | {r['best_iteration']:,} | "
                     f"{r['val_nll']:.3f} |")  # fmt: skip
    return provenance.made_by(rows) + "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", nargs="+", default=["dw4", "lj13"])
    p.add_argument("--minutes", type=float, default=2.0)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--runs", default="runs/efm_tuning_final")
    p.add_argument("--out", default="results")
    args = p.parse_args()
    set_threads(1)
    rows = tune(args.systems, args.minutes, Path(args.runs),
                {k: VARIANTS[k] for k in args.variants})  # fmt: skip
    rows = [{**r, "command": provenance.command()} for r in rows]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "efm_tuning.json"
    old = json.loads(path.read_text()) if path.exists() else []
    keep = [r for r in old if (r["system"], r["model"], r["minutes"]) not in
            {(s["system"], s["model"], s["minutes"]) for s in rows}]  # fmt: skip
    rows = keep + rows
    path.write_text(json.dumps(rows, indent=1))
    (out / "efm_tuning.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
