"""CPU cost of a molecule's ShapeFlow training step and exact NLL, float64 against float32.

The model of ``train --data FILE --geometry cartesian`` (``train --data``'s default for a
molecule until issue 41): a flow-matching step (batch 128) and the exact NLL per conformer of
an untrained model, alternating dtypes, on one thread. Issue 35 chose float32 training from
it::

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/shape_dtype.py FILE.npz

(FILE: e.g. the cyclohexanol ensemble that ``experiments/molecules/real_molecules.py`` caches.)
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from grassflow.tasks import shape_runs as shapes
from grassflow.training.shape_matching import cfm_objective


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    exp = shapes.ShapeExperiment(data=args.data)
    splits = shapes.load_clouds(exp)
    n, d = splits["train"].shape[1:]
    exp = dataclasses.replace(exp, n_points=n, dim=d, labels=splits["labels"], efm_labels=True,
                              geometry="cartesian",
                              bonds=splits["bonds"], bond_orders=splits["bond_orders"],
                              use_bonds=True, harmonic_prior=bool(splits["bonds"]))  # fmt: skip
    torch.manual_seed(0)
    costs: dict[str, list[tuple[float, float]]] = {"float64": [], "float32": []}
    for _ in range(args.repeats):
        for name in costs:
            dtype = getattr(torch, name)
            model = shapes.build_model(exp).to(dtype)
            model.fit_prior(splits["train"])
            opt = torch.optim.Adam(model.parameters(), 1e-3)
            X = splits["train"].to(dtype)
            t0 = time.process_time()
            for _ in range(args.steps):
                loss, _ = cfm_objective(model, X[torch.randint(len(X), (128,))])
                opt.zero_grad()
                loss.backward()
                opt.step()
            step = (time.process_time() - t0) / args.steps
            t0 = time.process_time()
            with torch.no_grad():
                model.log_prob(splits["val"][:16].to(dtype))
            costs[name].append((step, (time.process_time() - t0) / 16))
    for name, c in costs.items():
        print(f"{name}: step {statistics.median(a for a, _ in c):.3f} CPU s, exact NLL "
              f"{statistics.median(b for _, b in c):.2f} CPU s per conformer")  # fmt: skip
    ratio = statistics.median(a for a, _ in costs["float64"]) / statistics.median(
        a for a, _ in costs["float32"])  # fmt: skip
    print(f"steps per CPU second, float32 / float64: {ratio:.2f}")


if __name__ == "__main__":
    main()
