"""Test NLL against training CPU time: maximum likelihood vs flow matching, in one run.

Each objective trains the same GrCNF (same preset, seed and data stream) for the same budget.
Snapshots of the parameters are taken at geometrically spaced times during training and
their test NLL is computed afterwards with the exact-divergence ODE, so evaluation time is not
counted as training time.

Each (dataset, objective) run is an ordinary resumable run directory (see
`run_dir.claim_run_dir`) with its snapshots in ``snapshots/<iteration>.pt`` and their
test NLLs beside them. A rerun continues an unfinished run from ``last.pt``, trains a
finished one no further, and a larger budget continues it with snapshots at the new
budget's marks. ``curve.json`` is reused only if it describes the run as it stands.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from matplotlib.figure import Figure

from grassflow.tasks.run_dir import training_status
from grassflow.tasks.texture_runs import (
    PAPER_TEXTURES,
    TexturesExperiment,
    build_model,
    claim,
    held_out,
    run,
)
from grassflow.training import atomic_save, load_checkpoint
from grassflow.training import distributed as dd
from grassflow.training.checkpoint import write_json

__all__ = ["compare", "markdown_table"]


def _marks(minutes: float, n_snapshots: int) -> list[float]:
    """Snapshot times (s), geometric from 1 % of the budget: early times decide the
    time-to-NLL ratio."""
    budget_s = 60 * minutes
    return [budget_s * 0.01 ** (1 - i / (n_snapshots - 1)) for i in range(n_snapshots)]


def _train_with_snapshots(
    exp: TexturesExperiment, run_dir: Path, n_snapshots: int, progress: bool, force: bool
) -> None:
    """Train ``exp`` up to its total budget, saving a snapshot at each mark it passes."""
    claim(exp, run_dir, force)
    snap_dir = run_dir / "snapshots"
    done = training_status(run_dir)["iterations"]
    taken = []
    for path in sorted(snap_dir.glob("*.pt")):
        if int(path.stem) > done:  # past last.pt: steps that the resumed run redoes
            if dd.is_main():
                path.unlink()
                path.with_suffix(".json").unlink(missing_ok=True)
        else:
            taken.append(load_checkpoint(path, required=("elapsed",))["elapsed"])
    marks = [m for m in _marks(exp.train.total_budget_minutes, n_snapshots)
             if m > max(taken, default=-1.0) / 0.98]  # fmt: skip

    def callback(iteration: int, model, record: dict) -> None:
        if marks and record["elapsed"] >= marks[0] * 0.98:
            if dd.is_main():
                atomic_save({"elapsed": record["elapsed"], "iteration": iteration,
                             "model": model.state_dict()}, snap_dir / f"{iteration:09d}.pt")
            while marks and record["elapsed"] >= marks[0] * 0.98:
                marks.pop(0)

    if dd.is_main():
        snap_dir.mkdir(parents=True, exist_ok=True)
    run(exp, run_dir, resume=True, progress=progress, callback=callback)


def _curve(
    exp: TexturesExperiment, run_dir: Path, n_snapshots: int, progress: bool, force: bool
) -> dict:
    """``{"iterations", "trained_minutes", "points": [{seconds, iteration, test_nll,
    test_nll_sem}]}`` of one run; each snapshot's NLL is computed once and kept."""
    _train_with_snapshots(exp, run_dir, n_snapshots, progress, force)
    status = training_status(run_dir)
    cached = run_dir / "curve.json"
    if cached.exists():
        curve = json.loads(cached.read_text())
        if curve.get("iterations") == status["iterations"]:
            return curve
    test = held_out(exp, getattr(torch, exp.train.dtype))["test"]
    points = []
    for path in sorted((run_dir / "snapshots").glob("*.pt")):
        nll_path = path.with_suffix(".json")
        if nll_path.exists():
            points.append(json.loads(nll_path.read_text()))
            continue
        snap = load_checkpoint(path, required=("elapsed", "iteration", "model"))
        model = build_model(exp).to(test.dtype)
        model.load_state_dict(snap["model"])
        with torch.no_grad():
            nll = -model.eval().log_prob(test)
        points.append({"seconds": snap["elapsed"], "iteration": snap["iteration"],
                       "test_nll": nll.mean().item(),
                       "test_nll_sem": (nll.std() / len(nll) ** 0.5).item()})
        if dd.is_main():
            write_json(points[-1], nll_path)
    curve = {"iterations": status["iterations"], "trained_minutes": status["trained_minutes"],
             "points": points}  # fmt: skip
    if dd.is_main():
        write_json(curve, cached)
    return curve


def compare(
    out_dir: str | Path,
    runs_dir: str | Path = "runs/fm_vs_mle",
    datasets: tuple[str, ...] = ("2sines",),
    minutes: float = 5.0,
    objectives: tuple[str, ...] = ("mle", "fm"),
    n_snapshots: int = 16,
    progress: bool = True,
    force: bool = False,
) -> dict:
    """Run every objective on every dataset; write ``fm_vs_mle.{json,md,png}`` to ``out_dir``.

    The first objective (MLE by default) sets the reference NLL that the others must reach.
    ``minutes`` is each run's total; ``force`` retrains run directories that hold
    another preset instead of stopping with an error.
    """
    if "mle" not in objectives:
        raise ValueError("objectives must include 'mle', the reference")
    objectives = ("mle",) + tuple(o for o in objectives if o != "mle")
    out = Path(out_dir)
    train_cfg = PAPER_TEXTURES.replace(
        batch_size=200, iterations=10**7, lr_step=None, val_every=None, log_every=10,
        checkpoint_every=500, total_budget_minutes=minutes,
    )  # fmt: skip
    results = {}
    for dataset in datasets:
        runs = {}
        for objective in objectives:
            exp = TexturesExperiment(dataset=dataset, objective=objective, train=train_cfg)
            run_dir = Path(runs_dir) / f"{dataset}-{objective}"
            runs[objective] = _curve(exp, run_dir, n_snapshots, progress, force)
        curves = {objective: r["points"] for objective, r in runs.items()}
        summary = _summary(curves)
        for objective, r in runs.items():  # what each run trained, not its last snapshot
            summary[objective].update(iterations=r["iterations"],
                                      trained_minutes=r["trained_minutes"])  # fmt: skip
        results[dataset] = {"curves": curves, "summary": summary}
    result = {"budget_minutes": minutes, "objectives": list(objectives),
              "datasets": results}
    if dd.is_main():  # under torchrun, rank 0 writes
        out.mkdir(parents=True, exist_ok=True)
        write_json(result, out / "fm_vs_mle.json")
        (out / "fm_vs_mle.md").write_text(markdown_table(result))
        _plot(result, out / "fm_vs_mle.png")
    return result


def _summary(curves: dict) -> dict:
    """Per objective: best NLL, iterations, and the first time it reaches MLE's best NLL."""
    target = min(p["test_nll"] for p in curves["mle"])
    t_mle = next(p["seconds"] for p in curves["mle"] if p["test_nll"] <= target)
    summary = {}
    for objective, points in curves.items():
        t = next((p["seconds"] for p in points if p["test_nll"] <= target), None)
        summary[objective] = {
            "best_nll": min(p["test_nll"] for p in points),
            "iterations": points[-1]["iteration"],
            "seconds_to_mle_best": t,
            "time_ratio_over_mle": None if t is None else t / t_mle,
        }
    return summary


def markdown_table(result: dict) -> str:
    lines = [
        f"{result['budget_minutes']:g} CPU minutes of training per objective and dataset; test "
        "NLL (nats, 500 lines, exact divergence) of parameter snapshots.",
        "",
        "| dataset | objective | minutes | iterations | best test NLL "
        "| seconds to MLE's best (ratio) |",
        "|---|---|---|---|---|---|",
    ]
    for dataset, res in result["datasets"].items():
        for objective, s in res["summary"].items():
            t, r = s["seconds_to_mle_best"], s["time_ratio_over_mle"]
            reach = "not reached" if t is None else f"{t:.0f}" + (
                "" if objective == "mle" else f" ({r:.2f})")
            lines.append(f"| {dataset} | {objective.upper()} | {s['trained_minutes']:.2f} | "
                         f"{s['iterations']:,} | "
                         f"{s['best_nll']:.3f} | {reach} |")
    return "\n".join(lines) + "\n"


STYLES = {"mle": "C0o-", "fm": "C3s-", "fm-ot": "C2^-"}


def _plot(result: dict, path: Path) -> None:
    datasets = list(result["datasets"])
    fig = Figure(figsize=(3.2 * len(datasets), 3.2))
    axes = fig.subplots(1, len(datasets), squeeze=False)[0]
    for ax, dataset in zip(axes, datasets):
        for objective, pts in result["datasets"][dataset]["curves"].items():
            ax.errorbar([p["seconds"] / 60 for p in pts], [p["test_nll"] for p in pts],
                        yerr=[p["test_nll_sem"] for p in pts], fmt=STYLES.get(objective, "k.-"),
                        ms=3, capsize=2, label=objective.upper())
        ax.set_xscale("log")
        ax.set_xlabel("training CPU minutes")
        ax.set_title(f"{dataset} on Gr(1,3)", fontsize=10)
    axes[0].set_ylabel("test NLL (nats)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
