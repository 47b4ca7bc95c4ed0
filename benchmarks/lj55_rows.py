"""LJ55 rows of the geometry comparison (issue 34): one geometry, 20 training CPU minutes.

Run: ``grassflow data make lj55 --out data`` (~10 CPU minutes), then
``PYTHONPATH=src python benchmarks/lj55_rows.py GEOMETRY [--minutes 20] [--n-test 40]
[--seed 0] [--data-dir data] [--runs runs/lj55] [--out results]`` (one thread).

The exact likelihood of one LJ55 configuration costs ~26 CPU s (162 forward-mode products
through a 55-point EGNN per function evaluation, ~40 evaluations), so the run validates on one
configuration at the end, solves one configuration at a time (the exact divergence of
more at once needs gigabytes), and scores a seeded ``--n-test`` of the 500 test
configurations. The row is merged into ``OUT/vs_enf.json`` and ``OUT/vs_enf/lj55.md``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from grassflow.tasks.run_dir import test_subset
from grassflow_paper import efm, vs_enf


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("geometry", choices=("cartesian", "grassmann"))
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--n-test", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default="data")
    p.add_argument("--runs", default="runs/lj55")
    p.add_argument("--out", default="results")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    exp = efm.EFMExperiment(system="lj55", n_train=1000, seed=args.seed, minutes=args.minutes,
                            geometry=args.geometry, n_val=1, val_every_minutes=None,
                            chunk_size=1, data_dir=args.data_dir)  # fmt: skip
    run_dir = Path(args.runs) / exp.run_name
    data = efm.load_splits("lj55", 1000, exp.data_dir)
    efm.run(exp, run_dir, data=data, progress=False)
    scored = {**data, "test": test_subset(data["test"], args.n_test)}
    command = "PYTHONPATH=src python benchmarks/lj55_rows.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    row = {**efm.evaluate(run_dir, scored), "budget_minutes": args.minutes,
           "run_dir": str(run_dir), "command": command}  # fmt: skip
    vs_enf.merge_rows([row], args.out)
    print((Path(args.out) / "vs_enf" / "lj55.md").read_text())


if __name__ == "__main__":
    main()
