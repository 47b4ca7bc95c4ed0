"""Does ``torch.compile`` speed up the forward-Laplacian field (issue 15)? One run, one thread.

    PYTHONPATH=src python experiments/torch_compile/compile_check.py

Times ``GrassmannField._forward_laplacian`` eager and compiled (``dynamic=False``): field and
divergence without grad, and with a backward pass (one MLE-style step of the field alone), for
the MLP potential at Gr(3, 13) (batch 100) and the graph potential at Gr(3, 18) (batch 16).
Medians of 5 (no grad) and 3 (backward) calls after the compiling call.
"""

from __future__ import annotations

import statistics
import time

import torch

from grassflow.manifolds import Grassmann
from grassflow.nn import GraphPotential, GrassmannField, Potential


def _median(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cases = [("mlp Gr(3,13)", 13, 3, Potential(13, 3, (32, 32, 32)), 100),
             ("graph Gr(3,18)", 18, 3, GraphPotential(19, 3, 32, 2), 16)]  # fmt: skip
    for name, D, k, pot, B in cases:
        field = GrassmannField(pot.double(), "forward")
        Y, t = Grassmann(k, D).random(B, dtype=torch.float64), torch.tensor(0.3).double()
        t0 = time.perf_counter()
        compiled = torch.compile(field._forward_laplacian, dynamic=False)
        with torch.no_grad():
            compiled(t, Y, None)
        compile_s = time.perf_counter() - t0
        row = [f"{name}: compile {compile_s:.1f} s"]
        for label, fn in (("eager", field._forward_laplacian), ("compiled", compiled)):

            def no_grad(fn=fn, t=t, Y=Y):
                with torch.no_grad():
                    fn(t, Y, None)

            def backward(fn=fn, t=t, Y=Y):
                X, div = fn(t, Y.clone().requires_grad_(), None)
                (X.square().sum() + div.sum()).backward()

            row.append(f"{label} {_median(no_grad, 5) * 1e3:.1f} ms / "
                       f"{_median(backward, 3) * 1e3:.1f} ms with backward")  # fmt: skip
        print("; ".join(row), flush=True)


if __name__ == "__main__":
    main()
