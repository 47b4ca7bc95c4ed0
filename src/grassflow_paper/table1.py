"""Paper Table 1: test NLL against training-set size on DW4 and LJ13, measured here.

Every (system, protocol, objective, prior, source, size, seed) run has its own directory
under ``runs_dir`` and a total CPU-time budget. A rerun continues unfinished runs where
they stopped, trains finished ones no further (a larger budget continues them), and reuses
an ``eval.json`` only if it evaluated the run as it stands. A directory holding another
preset or other data stops the sweep with an error naming the difference, unless ``force``.
Writes ``table1.json``, ``table1.md`` and ``table1_val.png`` (val NLL against training CPU time).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from matplotlib.figure import Figure

from grassflow.data.particle_files import missing_files
from grassflow.tasks import particle_runs as px
from grassflow.tasks.run_dir import RunMismatch, training_status
from grassflow.training import distributed as dd
from grassflow.training import read_metrics
from grassflow.training.checkpoint import write_json

__all__ = ["PAPER_NLL", "RunMismatch", "markdown_table", "reproduce"]

# Paper appendix Tables 6-7 (mean, std over 3 runs), keyed by training size.
PAPER_NLL = {
    "dw4": {
        "GrCNF": {100: (-12.53, 0.92), 1000: (-13.74, 0.30), 10_000: (-14.09, 0.44),
                  100_000: (-16.07, 0.46)},
        "E-NF": {100: (-0.54, 0.45), 1000: (-9.89, 2.30), 10_000: (-12.15, 1.16),
                 100_000: (-15.29, 0.53)},
    },
    "lj13": {
        "GrCNF": {10: (-23.64, 2.23), 100: (-44.24, 4.26), 1000: (-58.02, 5.43),
                  10_000: (-58.71, 4.71)},
        "E-NF": {10: (-12.86, 3.67), 100: (-15.75, 5.02), 1000: (-31.51, 1.19),
                 10_000: (-32.83, 1.98)},
    },
}  # fmt: skip


def _run_one(
    exp: px.ParticleExperiment, run_dir: Path, budget: float, progress: bool, force: bool
) -> dict:
    """Train ``exp`` up to ``budget`` minutes in total (no further if it has), then evaluate;
    an ``eval.json`` is reused only if it evaluated the run as it now stands."""
    exp.train = exp.train.replace(total_budget_minutes=budget, budget_minutes=None)
    data = px.load_data(exp)
    px.run(exp, run_dir, resume=True, progress=progress, data=data, force=force)
    done = run_dir / "eval.json"
    if done.exists():
        result = json.loads(done.read_text())
        if result.get("iterations") == training_status(run_dir)["iterations"]:
            return result
    return px.evaluate(run_dir, data)


def reproduce(
    out_dir: str | Path = "results/table1",
    runs_dir: str | Path = "runs/table1",
    *,
    systems: tuple[str, ...] = ("dw4", "lj13"),
    protocols: tuple[str, ...] = ("com-free", "paper"),
    sizes: dict[str, tuple[int, ...]] | None = None,
    seeds: tuple[int, ...] = (0, 1, 2),
    minutes: float = 1.0,
    objective: str = "fm",
    prior: str = "uniform",
    source: str = "generated",
    data_dir: str | Path = "data",
    progress: bool = True,
    force: bool = False,
) -> dict:
    """Run (or resume) the sweep and write the table, JSON and figure to ``out_dir``.

    Args:
        sizes: training sizes per system; default the paper's (`particles.SIZES`).
        minutes: training CPU minutes per run, in total over invocations (the paper's
            epochs may stop it earlier). A rerun with the same budget trains no further; a
            larger one continues every run.
        objective: ``"fm"`` by default: the paper's maximum likelihood (``"mle"``) costs
            about 100x more per iteration, too much for a CPU budget of minutes per run.
        prior: ``"uniform"`` by default. The paper's matrix Gaussian (``"gaussian"``,
            sigma = 0.3) puts the data about 86 nats below the uniform density on DW4's
            Gr(2, 3), so a short run spends its budget just moving mass to where the data are.
        source, data_dir: where the particle files are; see ``grassflow data make``.
        force: delete and retrain runs whose directory holds a different preset or data,
            instead of stopping with an error that names the differing fields.
    """
    sizes = {**px.SIZES, **(sizes or {})}
    for system in systems:
        missing = missing_files(system, source, data_dir)
        if missing:
            hint = (
                f"run `grassflow data make {system} --out {data_dir}`"
                if source == "generated"
                else "see grassflow.data.particle_files for the expected layout"
            )
            raise FileNotFoundError(f"{system} data not found in {data_dir}: {missing}; {hint}")
    rows = []
    for system in systems:
        for protocol in protocols:
            for n in sizes[system]:
                for seed in seeds:
                    exp = px.ParticleExperiment(
                        system=system, protocol=protocol, n_train=n, source=source,
                        data_dir=str(data_dir), objective=objective, prior=prior,
                    )
                    exp.train = exp.train.replace(seed=seed)
                    name = f"{system}-{protocol}-{objective}-{prior}-{source}-n{n}-s{seed}"
                    run_dir = Path(runs_dir) / name
                    rows.append(_run_one(exp, run_dir, minutes, progress, force)
                                | {"run_dir": str(run_dir)})
    result = {"budget_minutes": minutes, "objective": objective, "prior": prior,
              "source": source, "runs": rows}
    if dd.is_main():  # under torchrun, rank 0 writes
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_json(result, out / "table1.json")
        (out / "table1.md").write_text(markdown_table(result))
        plot_val_curves(rows, out / "table1_val.png")
    return result


def _mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def markdown_table(result: dict) -> str:
    """One table per system: ours per protocol (mean ± std over seeds) beside the paper's."""
    runs = result["runs"]
    minutes = [r["trained_minutes"] for r in runs]
    its = [r["iterations"] for r in runs]
    lines = [
        f"Test NLL (nats, 1,000 test configurations, exact divergence); {result['objective']} "
        f"objective, {result['prior']} prior, a budget of {result['budget_minutes']:g} CPU "
        f"minutes per run (trained {min(minutes):.2f}–{max(minutes):.2f} min, "
        f"{min(its):,}–{max(its):,} iterations), "
        f"data source '{result['source']}'. Mean ± std over seeds.",
    ]
    for system in dict.fromkeys(r["system"] for r in runs):
        mine = [r for r in runs if r["system"] == system]
        sizes = sorted({r["n_train"] for r in mine})
        lines += ["", f"**{system.upper()}**", "",
                  "| model | " + " | ".join(f"n = {n:,}" for n in sizes) + " |",
                  "|---" * (len(sizes) + 1) + "|"]
        for model, table in PAPER_NLL[system].items():
            cells = [f"{table[n][0]:.2f} ± {table[n][1]:.2f}" if n in table else "–"
                     for n in sizes]
            lines.append(f"| {model} (paper) | " + " | ".join(cells) + " |")
        for protocol in dict.fromkeys(r["protocol"] for r in mine):
            rs = [r for r in mine if r["protocol"] == protocol]
            manifold = rs[0]["manifold"]
            cells = [_mean_std([r["test_nll"] for r in rs if r["n_train"] == n]) for n in sizes]
            lines.append(f"| GrCNF here, {protocol}, {manifold} | " + " | ".join(cells) + " |")
            lines.append(f"| uniform on {manifold} (log V) | "
                         + " | ".join(f"{rs[0]['uniform_nll']:.3f}" for _ in sizes) + " |")
    return "\n".join(lines) + "\n"


def plot_val_curves(rows: list[dict], path: Path) -> None:
    """Val NLL against training CPU time, one panel per (system, protocol)."""
    panels = list(dict.fromkeys((r["system"], r["protocol"]) for r in rows))
    fig = Figure(figsize=(3.6 * len(panels), 3.2))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (system, protocol) in zip(axes, panels):
        mine = [r for r in rows if (r["system"], r["protocol"]) == (system, protocol)]
        sizes = sorted({r["n_train"] for r in mine})
        for i, n in enumerate(sizes):
            for j, r in enumerate(r for r in mine if r["n_train"] == n):
                recs = [m for m in read_metrics(Path(r["run_dir"]) / "metrics.jsonl")
                        if "val_nll" in m]
                ax.plot([m["elapsed"] / 60 for m in recs], [m["val_nll"] for m in recs],
                        color=f"C{i}", alpha=0.8, lw=1, label=f"n = {n:,}" if j == 0 else None)
        ax.set_title(f"{system.upper()}, {protocol}, {mine[0]['manifold']}", fontsize=10)
        ax.set_xlabel("training CPU minutes")
    axes[0].set_ylabel("val NLL (nats)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
