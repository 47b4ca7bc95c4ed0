"""The two geometries' conditional paths on real data (issue 34, "why the winner wins").

Run: ``PYTHONPATH=src python experiments/vs_enf/shape_geometry.py [--systems dw4 lj13]
[--out results]`` (under a CPU minute per system, one thread).

For minibatches of training clouds, paired with prior clouds exactly as training pairs them
(equivariant OT: the assignment by the Procrustes cost, then x1 relabelled and rotated to
x0; `grassflow.manifolds.alignment`), it measures per pair and geometry
(`grassflow.manifolds.shape_paths`):

- ``length``: the Euclidean length ``int_0^1 |u_t| dt`` of the horizontal path in the
  CoM-free coordinates (the straight line's is the aligned distance |x1 - x0|, the least);
- ``bend``: ``int_0^1 |u_t - mean_t u|^2 dt``, how far the regression target moves along
  the path (0 on a straight line); a solver needs more steps where targets bend;
- ``cpu_ms``: CPU time of computing x_t and u_t for one batch (64 pairs, one t each).

Integrals by the trapezoid rule on 65 times. Medians (and means) over all pairs. Writes
``shape_geometry.json`` and ``shape_geometry.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from grassflow.manifolds.alignment import align_pairs, assignment, orthogonal_cost
from grassflow.manifolds.shape_paths import GEOMETRIES, shape_path
from grassflow.manifolds.shape_space import helmert_basis
from grassflow_paper import provenance
from grassflow_paper.enf_protocol import load_enf_splits


def pairs(train: torch.Tensor, batches: int, B: int, seed: int) -> tuple[torch.Tensor, ...]:
    """``batches`` minibatches of (x0, aligned x1), as `cfm_objective` forms them."""
    g = torch.Generator().manual_seed(seed)
    x = train - train.mean(-2, keepdim=True)
    n, d = x.shape[-2:]
    H = helmert_basis(n, x.dtype)
    sigma = (H.mT @ x).square().mean().sqrt()
    out0, out1 = [], []
    for _ in range(batches):
        x1 = x[torch.randint(0, len(x), (B,), generator=g)]
        x0 = H @ (sigma * torch.randn(B, n - 1, d, generator=g, dtype=x.dtype))
        x0 = x0[assignment(orthogonal_cost(x0, x1)).argsort()]
        out0.append(x0)
        out1.append(align_pairs(x0, x1))
    return torch.cat(out0), torch.cat(out1)


def measure(x0: torch.Tensor, x1: torch.Tensor, geometry: str, B: int) -> dict:
    ts = torch.linspace(0, 1, 65, dtype=x0.dtype)
    us = torch.stack([shape_path(geometry, x0, x1, t.expand(len(x0)))[1] for t in ts])
    w = torch.full((65,), 1 / 64, dtype=x0.dtype)
    w[0] = w[-1] = 1 / 128
    speed = us.flatten(2).norm(dim=-1)  # (T, N)
    length = (w[:, None] * speed).sum(0)
    mean_u = (w[:, None, None, None] * us).sum(0)
    bend = (w[:, None] * (us - mean_u).flatten(2).square().sum(-1)).sum(0)
    t = torch.rand(B, dtype=x0.dtype, generator=torch.Generator().manual_seed(0))
    reps, start = min(20, len(x0) // B), time.process_time()  # batches of the pairs
    for r in range(reps):
        shape_path(geometry, x0[r * B : (r + 1) * B], x1[r * B : (r + 1) * B], t)
    cpu_ms = 1e3 * (time.process_time() - start) / reps
    stat = lambda v: {"median": v.median().item(), "mean": v.mean().item()}  # noqa: E731
    return {"length": stat(length), "bend": stat(bend), "cpu_ms": cpu_ms}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", nargs="+", default=["dw4", "lj13"])
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--out", default="results")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for system in args.systems:
        x0, x1 = pairs(load_enf_splits(system, 1000)["train"], args.batches, 64, seed=0)
        for geometry in GEOMETRIES:
            rows.append({"system": system, "geometry": geometry, "pairs": len(x0),
                         **measure(x0, x1, geometry, 64)})  # fmt: skip
            print(rows[-1], flush=True)
    command = provenance.command(None if argv is None else [sys.argv[0], *argv])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "shape_geometry.json").write_text(json.dumps({"command": command, "rows": rows},
                                                        indent=2) + "\n")  # fmt: skip
    lines = [f"Made by: `{command}`", "",
             "| system | geometry | pairs | path length, median (mean) | bend, median (mean) "
             "| path + target CPU ms / batch of 64 |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['system']} | {r['geometry']} | {r['pairs']} | "
                     f"{r['length']['median']:.3f} ({r['length']['mean']:.3f}) | "
                     f"{r['bend']['median']:.4f} ({r['bend']['mean']:.4f}) | "
                     f"{r['cpu_ms']:.2f} |")  # fmt: skip
    (out / "shape_geometry.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
