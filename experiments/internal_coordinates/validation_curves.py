"""The validation curves of finished ``grassflow train --data`` runs (issue 46: where does
validation peak, and does it keep improving once a budget, not a step cap, ends the run).

Run (after ``experiments/molecules/real_molecules.py`` made the runs; reads only)::

    PYTHONPATH=src python experiments/internal_coordinates/validation_curves.py \\
        runs/real_molecules/butane/internal runs/real_molecules/glycerol/internal \\
        --out results/validation_curves

Each run's ``flow/metrics.jsonl`` gives the validation NLL at every validation (nats per
molecule, the run's own validation split) and the training loss beside it. Reported per run:
the best validation and its iteration, the last iteration, the validation and the training
loss at a few milestones (the last validation at or before 100, 300, 1,000, 3,000, 10,000
steps and the end), and what the steps after 1,000 bought: the best validation up to step
1,000 minus the best after it (positive: the run kept learning; negative: it had peaked).
``OUT.json`` / ``.md`` and ``OUT.png`` (every curve against the iteration, log scale).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from grassflow.training.metrics_log import read_metrics
from grassflow_paper import provenance

MILESTONES = (100, 300, 1_000, 3_000, 10_000)


def curve(run: Path) -> list[tuple[int, float, float]]:
    """``(iteration, validation NLL, training loss)`` at each validation of ``run``."""
    records = read_metrics(run / "flow" / "metrics.jsonl")
    if not records:
        raise SystemExit(f"{run}: no flow/metrics.jsonl (not a finished train --data run?)")
    return [(r["iteration"], r["val_nll"], r["loss"]) for r in records
            if r.get("val_nll") is not None]  # fmt: skip


def at(points: list[tuple[int, float, float]], step: int) -> tuple[int, float, float] | None:
    """The last validation at or before ``step``."""
    before = [p for p in points if p[0] <= step]
    return before[-1] if before else None


def summary(run: Path) -> dict:
    points = curve(run)
    best = min(points, key=lambda p: p[1])
    last = points[-1]
    early = [p[1] for p in points if p[0] <= 1_000]
    late = [p[1] for p in points if p[0] > 1_000]
    return {
        "run": str(run),
        "best_iteration": best[0], "best_val": best[1],
        "last_iteration": last[0], "last_val": last[1], "last_loss": last[2],
        "gain_after_1000": min(early) - min(late) if early and late else None,
        "milestones": {str(s): list(p) for s in MILESTONES if (p := at(points, s)) is not None},
        "curve": points,
    }  # fmt: skip


def markdown(rows: list[dict]) -> str:
    head = "| run | best val (iteration) | " + " | ".join(
        f"val / loss at {s:,}" for s in MILESTONES) \
        + " | end: val / loss (iteration) | best to 1,000 - best after |"  # fmt: skip
    lines = [provenance.made_by(rows).rstrip(), "",
             "Validation NLL and training loss (nats per molecule) of each run, at the last "
             "validation at or before each step.", "", head,
             "|" + "---|" * (len(MILESTONES) + 4)]  # fmt: skip
    for r in rows:
        cells = []
        for s in MILESTONES:
            p = r["milestones"].get(str(s))
            cells.append("–" if p is None else f"{p[1]:.1f} / {p[2]:.1f}")
        gain = "–" if r["gain_after_1000"] is None else f"{r['gain_after_1000']:+.1f}"
        lines.append(f"| `{r['run']}` | {r['best_val']:.1f} ({r['best_iteration']:,}) | "
                     + " | ".join(cells)
                     + f" | {r['last_val']:.1f} / {r['last_loss']:.1f} ({r['last_iteration']:,})"
                     f" | {gain} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def picture(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        it, val, _ = zip(*r["curve"])
        line, = ax.plot(it, val, label="/".join(Path(r["run"]).parts[-3:]))
        ax.plot([r["best_iteration"]], [r["best_val"]], "o", color=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("validation NLL (nats per molecule)")
    ax.set_title("validation curves (dot: best)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run directories of grassflow train --data")
    p.add_argument("--out", default="results/validation_curves")
    args = p.parse_args()
    command = provenance.command()
    rows = [{**summary(Path(r)), "command": command} for r in args.runs]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    out.with_suffix(".md").write_text(markdown(rows))
    picture(rows, out.with_suffix(".png"))
    print(markdown(rows))


if __name__ == "__main__":
    main()
