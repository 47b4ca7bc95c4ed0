"""Pictures of the shape-model comparison (`vs_enf`, `efm`): learning curves.

* `plot_validation_curves`: each run's exact validation NLL against its training CPU
  minutes (log axis), from the runs' ``metrics.jsonl``;
* `plot_test_nll`: the test NLL of each model against its CPU budget, mean over seeds
  with the seed SE, from the rows of ``results/vs_enf.json``, beside the anchors.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from matplotlib.figure import Figure

from grassflow.training import read_metrics

__all__ = ["plot_test_nll", "plot_validation_curves"]


def plot_validation_curves(runs: dict[str, str | Path], path: str | Path,
                           title: str = "") -> Path:  # fmt: skip
    """``runs``: label -> a training directory (with ``metrics.jsonl``). The x axis is the
    training CPU minutes of that part (validation apart); the y axis its validation NLL."""
    fig = Figure(figsize=(5.0, 3.5))
    ax = fig.add_subplot(1, 1, 1)
    for k, (label, run_dir) in enumerate(runs.items()):
        pts = [(r.get("cpu_s", r["elapsed"]) / 60, r["val_nll"])
               for r in read_metrics(Path(run_dir) / "metrics.jsonl")
               if r.get("val_nll") is not None]  # fmt: skip
        if pts:
            ax.plot(*zip(*pts), "o-", ms=3, color=f"C{k}", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("training CPU minutes")
    ax.set_ylabel("validation NLL (nats)")
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)


def plot_test_nll(rows: list[dict], system: str, path: str | Path,
                  models: dict[str, str] | None = None) -> Path:  # fmt: skip
    """Test NLL against CPU budget for ``models`` (row model name -> label; default every
    trained model of ``system`` at n_train 1,000), and the anchors with a budget as points."""
    rows = [r for r in rows if r["system"] == system and r.get("n_train") in (1000, 13832)]
    trained = [r for r in rows if r.get("seed") is not None and "train_cpu_minutes" in r]
    models = models or {m: m for m in dict.fromkeys(r["model"] for r in trained)}
    fig = Figure(figsize=(5.0, 3.5))
    ax = fig.add_subplot(1, 1, 1)
    for k, (model, label) in enumerate(models.items()):
        by_budget: dict[float, list[float]] = {}
        for r in trained:
            if r["model"] == model:
                by_budget.setdefault(float(r["budget_minutes"]), []).append(r["test_nll"])
        if not by_budget:
            continue
        xs = sorted(by_budget)
        ys = [statistics.mean(by_budget[x]) for x in xs]
        es = [statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else 0.0
              for v in (by_budget[x] for x in xs)]  # fmt: skip
        ax.errorbar(xs, ys, yerr=es, fmt="o-", ms=4, capsize=2, color=f"C{k}", label=label)
    for r in rows:
        if r.get("source") == "issue 14" and r.get("budget_minutes"):
            ax.plot(r["budget_minutes"], r["test_nll"], "k^", ms=5)
            ax.annotate(r["model"], (r["budget_minutes"], r["test_nll"]), fontsize=6)
        elif r.get("source") == "issue 14" and r["model"].startswith("EFM"):
            ax.axhline(r["test_nll"], color="k", ls=":", lw=1, label=f"{r['model']} (GPU)")
    ax.set_xscale("log")
    ax.set_xlabel("training budget (CPU minutes)")
    ax.set_ylabel("test NLL (nats)")
    ax.set_title(f"{system.upper()}: exact test NLL against CPU budget", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)
