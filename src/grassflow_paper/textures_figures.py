"""Paper §5.1: Figures 3 and 4 and the NLL table over the five textures."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from grassflow.data.textures import TEXTURES, sample_texture
from grassflow.tasks.run_dir import TIMING_KEYS, training_status
from grassflow.tasks.texture_runs import (
    MMD_BANDWIDTH,
    PAPER_TEXTURES,
    TexturesExperiment,
    density_fn,
    evaluate,
    load_run,
    plot_prior,
    run,
)
from grassflow.training import distributed as dd
from grassflow.training.checkpoint import write_json
from grassflow.viz import SphereColumn, figure_antipodal, figure_textures

__all__ = ["markdown_table", "reproduce"]


def reproduce(
    out_dir: str | Path,
    runs_dir: str | Path = "runs/textures",
    minutes: float = 20.0,
    datasets: tuple[str, ...] = TEXTURES,
    base: TexturesExperiment | None = None,
    progress: bool = True,
    n_samples: int = 2000,
    force: bool = False,
) -> list[dict]:
    """Paper Figures 3 and 4 and the prior figure, with a table of test NLL and MMD.

    Each dataset trains in ``runs_dir/<dataset>`` until it has used ``minutes`` of
    training time in total; rerunning resumes unfinished runs and trains finished ones no
    further (a larger budget continues them). A run directory holding another preset stops
    with an error naming the difference, unless ``force`` (which retrains it).
    Writes ``figure3.png``, ``figure4.png``, ``prior.png``, ``textures.json`` and
    ``textures.md`` to ``out_dir``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = base or TexturesExperiment(
        train=PAPER_TEXTURES.replace(batch_size=200, val_every=500, checkpoint_every=250)
    )
    rows, columns, antipodal = [], [], {}
    for name in datasets:
        exp = dataclasses.replace(base, dataset=name)
        run_dir = Path(runs_dir) / name
        exp.train = exp.train.replace(total_budget_minutes=minutes)
        run(exp, run_dir, resume=True, progress=progress, force=force)
        status = training_status(run_dir)
        row = evaluate(run_dir)
        row["train_minutes"], row["iterations"] = status["trained_minutes"], status["iterations"]
        row.update({key: status[key] for key in TIMING_KEYS})
        rows.append(row)
        if not dd.is_main():  # under torchrun, rank 0 alone draws the pictures
            continue
        _, model = load_run(run_dir)
        gen = torch.Generator().manual_seed(0)
        Y0 = model.sample_prior(n_samples, gen)
        with torch.no_grad():
            generated, antipodal[name] = model.transport_forward(Y0), model.transport_forward(-Y0)
        data = sample_texture(name, n_samples, seed=0, dtype=Y0.dtype)
        columns.append(SphereColumn(name, data, generated, density_fn(model)))
    if not dd.is_main():
        return rows
    prior = model.prior()
    columns.insert(0, SphereColumn("Prior", Y0, None, prior.log_prob))
    figure_textures(columns, out / "figure3.png", dtype=Y0.dtype)
    figure_antipodal(-Y0, antipodal, out / "figure4.png")
    plot_prior(out / "prior.png")
    write_json(rows, out / "textures.json")
    (out / "textures.md").write_text(markdown_table(rows, minutes))
    return rows


def markdown_table(rows: list[dict], minutes: float) -> str:
    """The README table for `reproduce`."""
    lines = [
        f"Training budget: {minutes:g} CPU minutes per dataset (2 cores); the minutes "
        "column is what each run trained. "
        "NLL in nats on 500 held-out lines (mean ± s.e.); MMD² with a Gaussian kernel on the "
        f"chordal distance (h = {MMD_BANDWIDTH}) between 1000 samples and the test set.",
        "",
        "| dataset | minutes | iterations | test NLL | prior NLL | uniform NLL | MMD² model "
        "| MMD² prior | MMD² data (floor) | antipodal gap |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['train_minutes']:.2f} | {r['iterations']} "
            f"| {r['test_nll']:.3f} ± {r['test_nll_sem']:.3f}"
            f" | {r['prior_nll']:.3f} | {r['uniform_nll']:.3f} | {r['mmd2_model']:.4f}"
            f" | {r['mmd2_prior']:.4f} | {r['mmd2_data']:.4f} | {r['antipodal_max_dist']:.1e} |"
        )
    return "\n".join(lines) + "\n"
