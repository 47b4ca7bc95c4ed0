"""A shape model of your own point clouds (.xyz files), trained with the task API.

By default it first writes a synthetic ensemble: noisy copies of a 6-atom molecule (methanol,
CH3OH), each randomly rotated and translated, one ``.xyz`` file per copy, with
``grassflow.data.point_clouds.write_xyz``. Pass ``--data FOLDER`` to use your own folder of
``.xyz`` files instead (or an ``(N, n, 3)`` ``.npy``). It then trains the library's shape
model, one E(n)-equivariant flow on the whole cloud (``grassflow.flows.ShapeFlow``: a
density on clouds, invariant to translation, rotation, reflection and relabelling the atoms
of one element) with ``grassflow.tasks.shape_runs``: ``run`` trains it by flow matching on a
small CPU budget, ``evaluate`` prints the exact test NLL, and ``sample`` writes generated
molecules as ``.xyz``.

    python examples/shapes_from_xyz.py                     # ~2 CPU minutes of training
    python examples/shapes_from_xyz.py --data my_xyz_dir --out runs/mine
    python examples/shapes_from_xyz.py --tiny              # seconds (CI)

The same from the command line:

    grassflow train --data FOLDER --run-dir runs/mine --minutes 2
    grassflow eval runs/mine
    grassflow sample runs/mine --n 100 --out samples
"""

import argparse
from pathlib import Path

import numpy as np

from grassflow.data.point_clouds import write_xyz
from grassflow.tasks import shape_runs

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--tiny", action="store_true", help="a few training steps (CI)")
parser.add_argument("--data", help="a folder of .xyz files (default: write a synthetic one)")
parser.add_argument("--out", help="run directory (default runs/shapes_xyz[-tiny])")
parser.add_argument("--minutes", type=float, default=2.0, help="CPU minutes of training")
parser.add_argument("--n-samples", type=int, default=100)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
args.out = args.out or f"runs/shapes_xyz{'-tiny' if args.tiny else ''}"
out = Path(args.out)

# methanol: C, O, 3 H on C, 1 H on O (Angstrom); not planar, as a cloud needs rank 3
ATOMS = np.array([6, 8, 1, 1, 1, 1])
XYZ = np.array([[0.0, 0.0, 0.0], [1.43, 0.0, 0.0], [-0.36, 1.03, 0.0], [-0.36, -0.51, 0.89],
                [-0.36, -0.51, -0.89], [1.75, 0.90, 0.0]])  # fmt: skip
if args.data is None:
    rng = np.random.default_rng(args.seed)
    args.data = str(out / "xyz")
    for i in range(60 if args.tiny else 600):
        R, _ = np.linalg.qr(rng.standard_normal((3, 3)))
        R[:, 0] *= np.sign(np.linalg.det(R))  # a proper rotation: keep the molecule's hand
        cloud = (XYZ + 0.05 * rng.standard_normal(XYZ.shape)) @ R.T + 3 * rng.standard_normal(3)
        write_xyz(f"{args.data}/conf_{i:04d}.xyz", cloud, ATOMS, f"noisy methanol {i}")

exp = shape_runs.ShapeExperiment(data=args.data, n_val_flow=20 if args.tiny else 50)
if args.tiny:  # a fixed number of steps, not a budget: the same run on any machine
    exp.flow = exp.flow.replace(iterations=200, batch_size=32, seed=args.seed)
else:
    exp.flow = exp.flow.replace(budget_minutes=args.minutes, clock="cpu", seed=args.seed)
exp = shape_runs.run(exp, out, resume=True, progress=not args.tiny)  # a rerun continues
print(f"trained a shape model ({exp.model}) of {exp.n_points} points in {exp.dim}-D in {out}")

r = shape_runs.evaluate(out, n_samples=args.n_samples, seed=args.seed)  # writes eval.json
print("test NLL", shape_runs.nll_summary(r))
print(f"pair-distance JSD of samples vs test clouds: {r['distance_jsd']:.4f}")

X = shape_runs.sample(out, args.n_samples, seed=args.seed)  # also writes samples.npy
print(f"wrote {len(X)} generated clouds {X.shape} to {out / 'samples.xyz'}")
