"""Where the time goes: the network (field + divergence) vs the solver, per path.

Run: ``PYTHONPATH=src python benchmarks/profile_step.py [--k 3 --D 13 --batch 100]``.

1. Log-likelihood of one batch (no grad): the wall time inside the field's
   ``field_and_divergence`` (the potential network and its Laplace-Beltrami divergence) vs the
   whole solve; the rest is the solver's own work (stages, error control, Cayley map or
   Kronecker Jacobians).
2. One MLE training iteration (forward + backward): total self CPU time and the top operators
   from ``torch.profiler``.

One thread, float64, one warm-up call before each measurement.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from grassflow.flows import GrCNF
from grassflow.manifolds import Grassmann
from grassflow.nn import GrassmannField, Potential, scale_init_


def step(model: GrCNF, Y: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    (-model.log_prob(Y).mean()).backward()


def network_share(model: GrCNF, Y: torch.Tensor, exact: bool) -> tuple[float, float]:
    """(seconds of the whole log_prob, seconds inside field_and_divergence), no grad."""
    inner = model.field.field_and_divergence
    spent = [0.0]

    def timed(*a, **kw):
        t0 = time.perf_counter()
        out = inner(*a, **kw)
        spent[0] += time.perf_counter() - t0
        return out

    model.eval()
    with torch.no_grad():
        model.log_prob(Y, exact=exact)  # warm-up
        model.field.field_and_divergence = timed
        try:
            t0 = time.perf_counter()
            model.log_prob(Y, exact=exact)
            total = time.perf_counter() - t0
        finally:
            del model.field.field_and_divergence
    model.train()
    return total, spent[0]


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--D", type=int, default=13)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--top", type=int, default=8)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    gr = Grassmann(args.k, args.D)
    print(f"Gr({args.k},{args.D}), batch {args.batch}, float64, one thread")
    for method in ("cayley_rkmk", "kronecker"):
        for divergence in ("exact", "hutchinson"):
            torch.manual_seed(0)
            field = scale_init_(GrassmannField(Potential(args.D, args.k, (32, 32, 32))), 2.0)
            model = GrCNF(gr, field, method=method, divergence=divergence).double().train()
            Y = gr.random(
                args.batch, generator=torch.Generator().manual_seed(1), dtype=torch.float64
            )
            total, net = network_share(model, Y, divergence == "exact")
            print(f"\n{method}, {divergence} divergence, log_prob of {args.batch}: {total:.3f} s, "
                  f"{100 * net / total:.0f}% in the network + divergence")  # fmt: skip
            step(model, Y)  # warm-up
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step(model, Y)
            events = prof.key_averages()
            total = sum(e.self_cpu_time_total for e in events)
            top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[: args.top]
            print(f"  training iteration: {total / 1e6:.3f} s self CPU, "
                  f"NFE {model.last_stats['nfe']}")  # fmt: skip
            for e in top:
                print(f"    {100 * e.self_cpu_time_total / total:5.1f}%  {e.key}")


if __name__ == "__main__":
    main()
