"""Time and peak memory of one exact log-likelihood chunk of the two-part ShapeFlow (the
paper's, `grassflow_paper.two_part`), forward Laplacian vs Hessian-vector products (issues
13 and 15). One thread, float64, untrained graph potential.

    PYTHONPATH=src python experiments/two_part/shape_eval_cost.py

Each (system, chunk, path) runs in a fresh process, so ``ru_maxrss`` growth is its own (an
upper bound on what the tensors need: it includes allocator caching).
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import time

import torch

CASES = [("LJ13", 13, 3, 16), ("LJ13", 13, 3, 64), ("QM9", 19, 3, 16)]


def measure(n: int, d: int, chunk: int, path: str, out) -> None:
    from grassflow_paper.two_part import TwoPartShapeFlow

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TwoPartShapeFlow(n, d, "graph", chunk_size=chunk).double().eval()
    model.flow.field.laplacian = path
    P = torch.randn(chunk, n, d, dtype=torch.float64)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    with torch.no_grad():
        model.log_prob(P)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss0
    out.send((seconds, peak, model.flow.last_stats["nfe"]))


def main() -> None:
    ctx = mp.get_context("fork")
    print("| system | chunk | path | seconds per cloud | peak MB | NFE |")
    print("|---|---|---|---|---|---|")
    for name, n, d, chunk in CASES:
        for path in ("forward", "hvp"):
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=measure, args=(n, d, chunk, path, send))
            proc.start()
            seconds, peak, nfe = recv.recv()
            proc.join()
            print(f"| {name} | {chunk} | {path} | {seconds / chunk:.3f} | {peak:.0f} | {nfe} |",
                  flush=True)


if __name__ == "__main__":
    main()
