"""Figure 5 of QM9 positional runs side by side: generated molecules of each run, one column
each, bonds from distance and clashes (atoms closer than 0.9 Å) in red, and per run the
paper's Figure 5 proper (each sample beside its aligned nearest training molecule).

The runs are ``grassflow reproduce vs-enf --systems qm9`` run directories, whose evaluation
saved 1,000 samples as ``samples.npy`` (and, for runs with ``--atom-types``, their atom
types as ``sample_labels.npy``: those atoms are drawn by element)::

    PYTHONPATH=src python experiments/vs_enf/qm9_figure5.py grassmann=RUN_DIR \\
        --out results/vs_enf/qm9_figure5_geometries.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from grassflow.tasks.run_dir import read_preset
from grassflow.viz.molecules import plot_nearest, plot_side_by_side
from grassflow_paper.efm import QM9_TYPES, EFMExperiment, load_splits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR")
    p.add_argument("--out", required=True, help="the side-by-side PNG")
    p.add_argument("--n", type=int, default=4, help="molecules per column")
    args = p.parse_args()
    runs = dict(spec.split("=", 1) for spec in args.runs)
    samples = {name: np.load(Path(run) / "samples.npy") for name, run in runs.items()}
    charges = {name: np.asarray(QM9_TYPES)[np.load(Path(run) / "sample_labels.npy")]
               for name, run in runs.items() if (Path(run) / "sample_labels.npy").exists()}
    clashes = plot_side_by_side(samples, args.out, args.n, charges=charges)
    out = Path(args.out)
    nearest = {}
    for name, run in runs.items():
        exp = read_preset(Path(run), EFMExperiment.from_dict, "vs-enf")
        train = load_splits(exp.system, exp.n_train, exp.data_dir, exp.atom_types)["train"]
        z = np.asarray(QM9_TYPES)[train[..., 3].long().numpy()] if exp.atom_types else None
        path = out.with_name(f"{out.stem}_{name}_nearest.png")
        nearest[name] = plot_nearest(samples[name], train[..., :3].numpy(), path, args.n,
                                     charges=z, sample_charges=charges.get(name))[1]
        nearest[name] = nearest[name].round(3).tolist()
    print(json.dumps({"clash_fraction": clashes, "nearest_rmsd": nearest}))


if __name__ == "__main__":
    main()
