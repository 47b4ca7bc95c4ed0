"""How far apart the flow-matching pairs of QM9 are, with and without atom types: the mean
squared distance between prior clouds and their equivariant-OT-aligned molecules, when the
relabelling may swap any two atoms (the positional model) or only atoms of one element (the
model conditioned on atom types, ``reproduce vs-enf --atom-types``)::

    OMP_NUM_THREADS=1 PYTHONPATH=src python experiments/vs_enf/qm9_coupling.py [--cache data]
"""

from __future__ import annotations

import argparse

import torch

from grassflow.flows import ShapeFlow
from grassflow.manifolds.alignment import align_pairs, assignment, orthogonal_cost
from grassflow.metrics import mean_sem
from grassflow_paper import efm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default="data", help="the QM9 cache folder")
    p.add_argument("--batches", type=int, default=8, help="of 64 pairs")
    args = p.parse_args()
    torch.manual_seed(0)
    data = efm.load_splits("qm9", 13832, args.cache, atom_types=True)["train"]
    X, L = data[..., :3], data[..., 3].long()
    model = ShapeFlow(19, 3).double()
    model.fit_prior(X)
    sq = {"any two atoms": [], "within elements": []}
    for _ in range(args.batches):
        pick = torch.randint(len(X), (64,))
        x0 = model.sample_prior(64)
        x0 = x0[assignment(orthogonal_cost(x0, X[pick])).argsort()]
        for key, labels in zip(sq, (None, L[pick])):
            y = align_pairs(x0, X[pick], labels=labels)
            sq[key].append((y - x0).square().sum((-2, -1)))
    for key, v in sq.items():
        r = mean_sem("d2", torch.cat(v))
        print(f"relabelling {key}: mean squared pair distance {r['d2']:.2f} ± {r['d2_sem']:.2f} Å²")


if __name__ == "__main__":
    main()
