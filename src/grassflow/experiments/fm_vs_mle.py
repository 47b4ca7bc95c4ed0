"""Test NLL against training wall-clock: maximum likelihood vs flow matching, in one run.

Both objectives train the same GrCNF (same preset, seed and data stream) for the same budget.
Snapshots of the parameters are taken at geometrically spaced times during training and
their test NLL is computed afterwards with the exact-divergence ODE, so evaluation time is not
counted as training time.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import torch
from matplotlib.figure import Figure

from ..data.textures import texture_splits
from ..training import PAPER_TEXTURES, train
from ..training.checkpoint import write_json
from .textures import OBJECTIVES, TexturesExperiment, build_model, texture_stream

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


def compare(
    out_dir: str | Path,
    runs_dir: str | Path = "runs/fm_vs_mle",
    dataset: str = "2sines",
    budget_minutes: float = 5.0,
    n_snapshots: int = 16,
    progress: bool = True,
) -> dict:
    """Run both objectives; write ``fm_vs_mle.json``, ``fm_vs_mle.md`` and ``fm_vs_mle.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = TexturesExperiment(
        dataset=dataset,
        train=PAPER_TEXTURES.replace(
            batch_size=200, iterations=10**7, lr_step=None, val_every=None, log_every=10,
            checkpoint_every=10**6, budget_minutes=budget_minutes,
        ),
    )
    test = texture_splits(dataset, dtype=getattr(torch, base.train.dtype))["test"]
    curves = {}
    for objective in ("mle", "fm"):
        exp = dataclasses.replace(base, objective=objective)
        run_dir = Path(runs_dir) / f"{dataset}-{objective}"
        if (run_dir / "last.pt").exists():
            raise FileExistsError(f"{run_dir} exists; delete it to rerun the comparison")
        points = []
        for elapsed, iteration, state in _snapshots(exp, run_dir, n_snapshots, progress):
            model = build_model(exp).to(test.dtype)
            model.load_state_dict(state)
            with torch.no_grad():
                nll = -model.eval().log_prob(test)
            points.append({"seconds": elapsed, "iteration": iteration,
                           "test_nll": nll.mean().item(),
                           "test_nll_sem": (nll.std() / len(nll) ** 0.5).item()})
        curves[objective] = points
    result = {"dataset": dataset, "budget_minutes": budget_minutes, "curves": curves}
    result["summary"] = _summary(curves)
    write_json(result, out / "fm_vs_mle.json")
    (out / "fm_vs_mle.md").write_text(markdown_table(result))
    _plot(result, out / "fm_vs_mle.png")
    return result


def _summary(curves: dict) -> dict:
    """Best MLE NLL and the first time each objective reaches it (None if never)."""
    target = min(p["test_nll"] for p in curves["mle"])

    def first(points):
        return next((p["seconds"] for p in points if p["test_nll"] <= target), None)

    t_mle, t_fm = first(curves["mle"]), first(curves["fm"])
    return {
        "mle_best_nll": target,
        "fm_best_nll": min(p["test_nll"] for p in curves["fm"]),
        "mle_seconds_to_best": t_mle,
        "fm_seconds_to_mle_best": t_fm,
        "time_ratio_fm_over_mle": None if t_fm is None else t_fm / t_mle,
    }


def markdown_table(result: dict) -> str:
    s = result["summary"]
    ratio = s["time_ratio_fm_over_mle"]
    lines = [
        f"Dataset {result['dataset']}, {result['budget_minutes']:g} CPU minutes of training per "
        "objective; test NLL (nats, 500 lines, exact divergence) of parameter snapshots.",
        "",
        "| objective | best test NLL | seconds to reach the best MLE NLL |",
        "|---|---|---|",
        f"| MLE | {s['mle_best_nll']:.3f} | {s['mle_seconds_to_best']:.0f} |",
        f"| FM | {s['fm_best_nll']:.3f} | "
        + ("not reached" if s["fm_seconds_to_mle_best"] is None
           else f"{s['fm_seconds_to_mle_best']:.0f} (ratio {ratio:.2f})") + " |",
    ]
    return "\n".join(lines) + "\n"


def _plot(result: dict, path: Path) -> None:
    fig = Figure(figsize=(5, 3.5))
    ax = fig.add_subplot()
    for objective, style in (("mle", "C0o-"), ("fm", "C3s-")):
        pts = result["curves"][objective]
        ax.errorbar([p["seconds"] / 60 for p in pts], [p["test_nll"] for p in pts],
                    yerr=[p["test_nll_sem"] for p in pts], fmt=style, ms=4, capsize=2,
                    label=objective.upper())
    ax.set_xlabel("training wall-clock (min, 2-core CPU)")
    ax.set_ylabel("test NLL (nats)")
    ax.set_title(f"{result['dataset']} on Gr(1,3): MLE vs flow matching", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
