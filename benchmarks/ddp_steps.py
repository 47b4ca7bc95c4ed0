"""Data-parallel overhead: training steps per second under 1 and N torchrun processes.

Run: ``python benchmarks/ddp_steps.py`` (defaults: 1 and 2 processes, MLE and FM objectives,
the textures model on CPU with one thread per process). For each case it launches
``torchrun --standalone --nproc_per_node N benchmarks/ddp_steps.py --worker ...``, prints that
command, the steps per second after a warm-up, and the ratio to one process. The global
batch is the same for every N, so a ratio above 1 is a speed-up; on a machine with fewer
cores than processes, expect none: the number is there to catch overhead regressions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def worker(args) -> None:
    import torch

    from grassflow.tasks.texture_runs import (
        PAPER_TEXTURES,
        TexturesExperiment,
        build_model,
        texture_stream,
    )
    from grassflow.training import OBJECTIVES, train
    from grassflow.training import distributed as dd

    torch.set_num_threads(1)
    dd.init()
    times = []

    def callback(iteration, model, record):
        times.append((iteration, time.perf_counter()))

    total = args.warmup + args.steps
    cfg = PAPER_TEXTURES.replace(
        batch_size=args.batch_size, iterations=total, lr_step=None, val_every=None,
        log_every=args.warmup, checkpoint_every=10**9, device=args.device,
    )  # fmt: skip
    exp = TexturesExperiment(objective=args.objective, train=cfg)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run" if dd.is_main() else Path(tmp) / "unused"
        train(build_model(exp), texture_stream(exp.dataset, torch.float32), cfg, run_dir,
              objective=OBJECTIVES[args.objective], progress=False, callback=callback)  # fmt: skip
    (i0, t0), (i1, t1) = times[0], times[-1]
    if dd.is_main():
        print(json.dumps({"steps_per_s": (i1 - i0) / (t1 - t0), "world": dd.world()}))
    dd.shutdown()


def launch(nprocs: int, objective: str, args) -> tuple[str, float]:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    cmd = [torchrun, "--standalone", "--nproc_per_node", str(nprocs), __file__, "--worker",
           "--objective", objective, "--steps", str(args.steps[objective]),
           "--warmup", str(args.warmup), "--batch-size", str(args.batch_size),
           "--device", args.device]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    line = [x for x in out.stdout.splitlines() if x.startswith("{")][-1]
    return " ".join(cmd), json.loads(line)["steps_per_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--nprocs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--objective", nargs="+", default=["mle", "fm"])
    p.add_argument("--steps", type=int, help="timed steps (default: 20 MLE, 300 FM)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64, help="global batch")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    if args.worker:
        args.objective = args.objective[0]
        return worker(args)
    args.steps = {o: args.steps or (20 if o == "mle" else 300) for o in args.objective}
    print(f"textures model, global batch {args.batch_size}, {args.device}, "
          f"{os.cpu_count()} CPUs, OMP_NUM_THREADS=1 per process")  # fmt: skip
    for objective in args.objective:
        base = None
        for n in args.nprocs:
            cmd, rate = launch(n, objective, args)
            base = base or rate
            print(f"$ {cmd}")
            print(f"  {objective}: {n} process(es): {rate:8.2f} steps/s  "
                  f"(ratio to {args.nprocs[0]}: {rate / base:.2f})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
