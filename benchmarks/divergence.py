"""Speed of the exact divergence: Laplace-Beltrami (Hessian-vector products) vs torch.func jvp.

Run: ``python benchmarks/divergence.py``. Prints median milliseconds per call (forward, and
forward + backward) and the speed ratio, measured in one run on this machine.
"""

from __future__ import annotations

import statistics
import time

import torch

from grassflow.manifolds import Grassmann
from grassflow.nn import GrassmannField, Potential
from grassflow.ode import divergence_exact


def median_ms(fn, repeats: int = 21) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    torch.manual_seed(0)
    t = torch.tensor(0.5)
    print("case          batch  pass      torch.func (ms)  Laplace-Beltrami (ms)  ratio")
    for k, D, B in [(1, 3, 200), (2, 4, 100), (3, 13, 100)]:
        field = GrassmannField(Potential(D, k, (64, 64)))
        Y = Grassmann(k, D).random(B)

        def generic(backward: bool, Y=Y, field=field):
            Yg = Y.clone().requires_grad_(True)
            X, div = divergence_exact(lambda Z: field(t, Z), Yg)
            if backward:
                (X.sum() + div.sum()).backward()

        def fast(backward: bool, Y=Y, field=field):
            Yg = Y.clone().requires_grad_(True)
            X, div = field.field_and_divergence(t, Yg)
            if backward:
                (X.sum() + div.sum()).backward()

        for backward in (False, True):
            a = median_ms(lambda b=backward: generic(b))
            b = median_ms(lambda b=backward: fast(b))
            name = "fwd+bwd" if backward else "fwd"
            print(f"Gr({k},{D}){'':6} {B:5d}  {name:8}  {a:15.2f}  {b:21.2f}  {a / b:5.1f}x")


if __name__ == "__main__":
    main()
