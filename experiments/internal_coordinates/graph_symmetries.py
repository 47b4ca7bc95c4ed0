"""Ibuprofen before and after the symmetrization of equivalent sides (issue 46 item 4).

`grassflow train` with two switches, and the metrics of the issue on sampled molecules::

    grassflow data conformers 'CC(C)Cc1ccc(cc1)C(C)C(=O)O' --n 3000 --out /tmp/ibu.npz
    python experiments/internal_coordinates/graph_symmetries.py train [--old-sides] \\
        [--issue41] -- --data /tmp/ibu.npz --minutes 3 --run-dir /tmp/ibu_run
    grassflow sample /tmp/ibu_run --n 1000 --out /tmp/ibu.sdf
    python experiments/internal_coordinates/graph_symmetries.py metrics /tmp/ibu.npz \\
        /tmp/ibu.npy

``--old-sides``: the Z-matrix rule before it (``build_zmatrix(sides=False)``: only terminal
hydrogens are swapped); ``--issue41``: issue 41's model (``ShapeExperiment.torus=False``:
torsions cut open, NSF from a Gaussian mixture) instead of the current default. The metrics:
the share of samples that keep every bond within 10 % of its mean length in the data
(`grassflow.metrics.bonds_kept_fraction`; the samples keep the model's atom order), clashes (a
non-bonded pair nearer than 0.9 Å, `closest_pair_fraction`), the pairs that clash and the
bonds that break most.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from collections import Counter

import numpy as np
import torch


def train(argv: list[str], old_sides: bool, issue41: bool) -> int:
    import grassflow.manifolds.zmatrix as zmatrix
    import grassflow.tasks.shape_runs as shape_runs
    from grassflow.cli import main

    if old_sides:
        shape_runs.build_zmatrix = functools.partial(zmatrix.build_zmatrix, sides=False)
    if issue41:  # the dataclass's default for --data runs, as if it were still False
        init = shape_runs.ShapeExperiment.__init__
        names = [f.name for f in dataclasses.fields(shape_runs.ShapeExperiment) if f.init]
        defaults = list(init.__defaults__)
        defaults[names.index("torus") - (len(names) - len(defaults))] = False
        init.__defaults__ = tuple(defaults)
    return main(["train", *argv])


def metrics(data_file: str, samples_file: str) -> None:
    from grassflow.metrics import bonds_kept_fraction, closest_pair_fraction

    data = np.load(data_file, allow_pickle=True)
    X, P, bonds = np.load(samples_file), data["positions"], data["bonds"]
    Z = data["atomic_numbers"]
    name = [f"{ {1: 'H', 6: 'C', 7: 'N', 8: 'O'}.get(int(z), str(z))}{i}" for i, z in enumerate(Z)]
    ref = np.linalg.norm(P[:, bonds[:, 0]] - P[:, bonds[:, 1]], axis=-1).mean(0)
    kept = bonds_kept_fraction(torch.tensor(X), bonds, torch.tensor(ref), tol=0.1)
    clash = closest_pair_fraction(torch.tensor(X), 0.9, exclude=bonds)
    n = X.shape[1]
    bonded = np.zeros((n, n), bool)
    bonded[bonds[:, 0], bonds[:, 1]] = bonded[bonds[:, 1], bonds[:, 0]] = True
    iu = np.triu_indices(n, 1)
    close = (np.linalg.norm(X[:, iu[0]] - X[:, iu[1]], axis=-1) < 0.9) & ~bonded[iu]
    pairs = Counter(f"{name[iu[0][p]]}-{name[iu[1][p]]}" for p in np.nonzero(close)[1])
    L = np.linalg.norm(X[:, bonds[:, 0]] - X[:, bonds[:, 1]], axis=-1)
    broken = Counter({f"{name[i]}-{name[j]}": int(c) for (i, j), c in
                      zip(bonds, (np.abs(L / ref - 1) > 0.1).sum(0)) if c})  # fmt: skip
    print(f"{samples_file}: {len(X)} samples, bonds kept {100 * kept:.1f} %, clashes "
          f"{100 * clash:.1f} %")
    print("  clashing pairs (samples):", pairs.most_common(6))
    print("  broken bonds (samples):", broken.most_common(4))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("--old-sides", action="store_true")
    t.add_argument("--issue41", action="store_true")
    t.add_argument("rest", nargs=argparse.REMAINDER)
    m = sub.add_parser("metrics")
    m.add_argument("data")
    m.add_argument("samples")
    args = parser.parse_args()
    if args.command == "train":
        rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        sys.exit(train(rest, args.old_sides, args.issue41))
    metrics(args.data, args.samples)
