"""What the two-part ShapeFlow's Grassmann fields cost: a flow-matching step, an exact divergence.

Run: ``PYTHONPATH=src python experiments/two_part/shape_fields.py [--n 13 --d 3 --repeats 7]``.

For the graph potential's gradient (forward-Laplacian divergence) and the EGNN's horizontal
field (exact trace by k(n - 1 - k) forward-mode products), on Gr(d, n - 1) at initialization:
the CPU milliseconds of one flow-matching step (batch 64, forward and backward) and of one
field evaluation with its exact divergence (batch 16, per cloud), on one thread. Medians over
``--repeats``; the ratios are the numbers to quote, since both run in the same process.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from grassflow.ode import divergence_exact
from grassflow.training.flow_matching import flow_matching_losses
from grassflow_paper.two_part import TwoPartShapeFlow, preset_field_options

FIELDS = {"graph 32 x 2": ("graph", 32, 2), "EGNN 32 x 3": ("egnn", 32, 3)}


def cpu_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        times.append(1e3 * (time.process_time() - t))
    return statistics.median(times)


def measure(model: TwoPartShapeFlow, repeats: int) -> tuple[float, float]:
    """(CPU ms of a flow-matching step, CPU ms per cloud of the field with its divergence)."""
    flow, gr = model.flow, model.manifold
    Y0, Y1, s = gr.random(64), gr.random(64), torch.rand(64)
    Y, t, field = gr.random(16), torch.tensor(0.5), flow.field

    def train_step():
        flow.zero_grad(set_to_none=True)
        flow_matching_losses(flow, Y0, Y1, s).mean().backward()

    def divergence():
        with torch.no_grad():
            if hasattr(field, "field_and_divergence"):
                field.field_and_divergence(t, Y, None, create_graph=False)
            else:
                divergence_exact(lambda Z: field(t, Z), Y)

    return cpu_ms(train_step, repeats), cpu_ms(divergence, repeats) / len(Y)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=13)
    p.add_argument("--d", type=int, default=3)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = {}
    for name, (potential, hidden, layers) in FIELDS.items():
        torch.manual_seed(0)
        model = TwoPartShapeFlow(args.n, args.d, potential,
                                 field_options=preset_field_options(potential, hidden, layers))
        rows[name] = measure(model, args.repeats)
    base = rows["graph 32 x 2"]
    print(f"Gr({args.d}, {args.n - 1}), one thread, medians of {args.repeats}")
    print("| field | FM step, batch 64 (CPU ms) | field + exact divergence, per cloud (CPU ms) |")
    print("|---|---|---|")
    for name, (step, div) in rows.items():
        print(f"| {name} | {step:.1f} ({step / base[0]:.2f}x) | {div:.2f} ({div / base[1]:.2f}x) |")


if __name__ == "__main__":
    main()
