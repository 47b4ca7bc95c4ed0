"""Does the two-part ShapeFlow's Grassmann part plateau because the field is too small?

The model is the paper's (`grassflow_paper.two_part`, trained by `grassflow_paper.vs_enf`),
out of the library since issue 34.

Run: ``PYTHONPATH=src python experiments/two_part/grassmann_capacity.py [--system lj13]
[--minutes 4]``.

On LJ13 the flow's validation NLL reaches about -5.0 within 400 flow-matching steps and then
stays there for 13,000 more (20 CPU minutes), with independent and with relabelled pairs
alike. This trains the same flow (graph potential, flow matching, vs-E-NF protocol, seed 0,
n_train = 1,000) with wider and deeper graphs for ``--minutes`` CPU minutes each (the Gram
part gets its usual share) and reports the best exact validation NLL of the flow on the 200
validation configurations, and when it was reached. If a larger field goes well below the
plateau, the default field cannot represent the span's density; if not, the limit lies
elsewhere (the objective, the time conditioning, the solver tolerance). Runs are resumable
(``runs/grassmann_capacity``); results go to ``results/grassmann_capacity.{json,md}``,
each row with the command that made it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from grassflow.tasks.run_dir import training_status
from grassflow.training import load_checkpoint
from grassflow.training.threads import set_threads
from grassflow_paper import provenance, vs_enf

SETTINGS = {"graph 32 x 2 (ShapeFlow's)": ("graph", 32, 2), "graph 64 x 3": ("graph", 64, 3),
            "graph 128 x 4": ("graph", 128, 4),
            "EGNN 32 x 3, horizontal (not a gradient)": ("egnn", 32, 3)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", default="lj13")
    p.add_argument("--minutes", type=float, default=4.0)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--runs", default="runs/grassmann_capacity")
    p.add_argument("--out", default="results")
    args = p.parse_args()
    set_threads(1)
    data = vs_enf.load_enf_splits(args.system, 1000)
    path = Path(args.out) / "grassmann_capacity.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    for name in args.settings:
        potential, hidden, layers = SETTINGS[name]
        exp = vs_enf.ENFExperiment(system=args.system, minutes=args.minutes, hidden=hidden,
                                   potential=potential,
                                   layers=layers, gram_components=4, gram_fraction=0.15,
                                   gram_max_minutes=2.0)  # fmt: skip
        tag = "" if potential == "graph" else f"{potential}-"
        run_dir = Path(args.runs) / f"{args.system}-{tag}{hidden}x{layers}-{args.minutes:g}min"
        vs_enf.run(exp, run_dir, progress=False, data=data)
        best = load_checkpoint(run_dir / "flow" / "best.pt")
        status = training_status(run_dir / "flow")
        curve = [json.loads(line) for line in (run_dir / "flow" / "metrics.jsonl").open()]
        curve = [(r["iteration"], r["val_nll"]) for r in curve if "val_nll" in r]
        row = {"system": args.system, "setting": name, "hidden": hidden, "layers": layers,
               "potential": potential, "minutes": args.minutes,
               "flow_cpu_minutes": status["cpu_minutes"],
               "iterations": status["iterations"], "best_iteration": int(best["iteration"]),
               "val_nll_grassmann": best["val_nll"], "curve": curve,
               "command": provenance.command()}  # fmt: skip
        rows = [r for r in rows if (r["system"], r["setting"], r["minutes"]) !=
                (args.system, name, args.minutes)] + [row]  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rows, indent=1))
        print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)
    lines = ["| system | field | CPU min (flow) | iterations | best at | best validation NLL "
             "(Grassmann part) | at 100 / 400 / 1,600 steps |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        at = dict(r["curve"])
        early = " / ".join(f"{at[i]:.2f}" if i in at else "–" for i in (100, 400, 1600))
        lines.append(f"| {r['system']} | {r['setting']} | {r['flow_cpu_minutes']:.1f} | "
                     f"{r['iterations']:,} | {r['best_iteration']:,} | "
                     f"{r['val_nll_grassmann']:.2f} | {early} |")  # fmt: skip
    table = provenance.made_by(rows) + "\n".join(lines) + "\n"
    (Path(args.out) / "grassmann_capacity.md").write_text(table)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
