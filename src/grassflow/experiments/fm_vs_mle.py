"""Test NLL against training wall-clock: maximum likelihood vs flow matching, in one run.

Each objective trains the same GrCNF (same preset, seed and data stream) for the same budget.
Snapshots of the parameters are taken at geometrically spaced times during training and
their test NLL is computed afterwards with the exact-divergence ODE, so evaluation time is not
counted as training time.

Each (dataset, objective) run writes ``curve.json`` into its run directory when it finishes;
a rerun reuses finished curves and restarts unfinished runs (at most one budget is lost).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import torch
from matplotlib.figure import Figure

from ..data.textures import texture_splits
from ..training import OBJECTIVES, PAPER_TEXTURES, train
from ..training import distributed as dd
from ..training.checkpoint import write_json
from .textures import TexturesExperiment, build_model, texture_stream

__all__ = ["compare", "markdown_table"]


def _snapshots(exp: TexturesExperiment, run_dir: Path, n_snapshots: int, progress: bool):
    """Train ``exp`` for its budget; return ``[(elapsed_s, iteration, state_dict)]``."""
    budget_s = 60 * exp.train.budget_minutes
    # geometric spacing from 1% of the budget: early times decide the time-to-NLL ratio
    marks = [budget_s * 0.01 ** (1 - i / (n_snapshots - 1)) for i in range(n_snapshots)]
    snaps = []
    model = build_model(exp)
    sampler = texture_stream(exp.dataset, getattr(torch, exp.train.dtype))

    def callback(iteration: int, model, record: dict) -> None:
        if marks and record["elapsed"] >= marks[0] * 0.98:
            snaps.append((record["elapsed"], iteration, copy.deepcopy(model.state_dict())))
            while marks and record["elapsed"] >= marks[0] * 0.98:
                marks.pop(0)

    train(model, sampler, exp.train, run_dir, objective=OBJECTIVES[exp.objective],
          progress=progress, callback=callback)
    return snaps


def _curve(exp: TexturesExperiment, run_dir: Path, n_snapshots: int, progress: bool) -> list:
    """Snapshot curve of one run: ``[{seconds, iteration, test_nll, test_nll_sem}]``."""
    done = run_dir / "curve.json"
    if done.exists():
        return json.loads(done.read_text())
    if run_dir.exists():  # unfinished: snapshots lived in memory, so start this run again
        if dd.is_main():
            shutil.rmtree(run_dir)
        dd.barrier()
    test = texture_splits(exp.dataset, dtype=getattr(torch, exp.train.dtype))["test"]
    points = []
    for elapsed, iteration, state in _snapshots(exp, run_dir, n_snapshots, progress):
        model = build_model(exp).to(test.dtype)
        model.load_state_dict(state)
        with torch.no_grad():
            nll = -model.eval().log_prob(test)
        points.append({"seconds": elapsed, "iteration": iteration,
                       "test_nll": nll.mean().item(),
                       "test_nll_sem": (nll.std() / len(nll) ** 0.5).item()})
    if dd.is_main():
        write_json(points, done)
    return points


def compare(
    out_dir: str | Path,
    runs_dir: str | Path = "runs/fm_vs_mle",
    datasets: tuple[str, ...] = ("2sines",),
    budget_minutes: float = 5.0,
    objectives: tuple[str, ...] = ("mle", "fm"),
    n_snapshots: int = 16,
    progress: bool = True,
) -> dict:
    """Run every objective on every dataset; write ``fm_vs_mle.{json,md,png}`` to ``out_dir``.

    The first objective (MLE by default) sets the reference NLL that the others must reach.
    """
    if "mle" not in objectives:
        raise ValueError("objectives must include 'mle', the reference")
    objectives = ("mle",) + tuple(o for o in objectives if o != "mle")
    out = Path(out_dir)
    train_cfg = PAPER_TEXTURES.replace(
        batch_size=200, iterations=10**7, lr_step=None, val_every=None, log_every=10,
        checkpoint_every=10**6, budget_minutes=budget_minutes,
    )
    results = {}
    for dataset in datasets:
        curves = {}
        for objective in objectives:
            exp = TexturesExperiment(dataset=dataset, objective=objective, train=train_cfg)
            run_dir = Path(runs_dir) / f"{dataset}-{objective}"
            curves[objective] = _curve(exp, run_dir, n_snapshots, progress)
        results[dataset] = {"curves": curves, "summary": _summary(curves)}
    result = {"budget_minutes": budget_minutes, "objectives": list(objectives),
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
        "| dataset | objective | iterations | best test NLL | seconds to MLE's best (ratio) |",
        "|---|---|---|---|---|",
    ]
    for dataset, res in result["datasets"].items():
        for objective, s in res["summary"].items():
            t, r = s["seconds_to_mle_best"], s["time_ratio_over_mle"]
            reach = "not reached" if t is None else f"{t:.0f}" + (
                "" if objective == "mle" else f" ({r:.2f})")
            lines.append(f"| {dataset} | {objective.upper()} | {s['iterations']:,} | "
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
        ax.set_xlabel("training minutes (2-core CPU)")
        ax.set_title(f"{dataset} on Gr(1,3)", fontsize=10)
    axes[0].set_ylabel("test NLL (nats)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
