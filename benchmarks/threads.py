"""Training steps per wall second and per CPU second against intra-op threads and load.

Run: ``PYTHONPATH=src python benchmarks/threads.py [--seconds 10] [--out results/threads]``.

For each model (the demo's texture flow, the two-part ShapeFlow's flow on LJ13
(`grassflow_paper.vs_enf`), QM9's flow; each one training step of its default objective and
batch) and each thread setting (1 thread; 2 threads with OpenMP's default wait policy, what
plain torch gets; 2 threads with ``OMP_WAIT_POLICY=PASSIVE``, what ``grassflow --threads 2``
gets; ``--threads auto``), a fresh process trains for ``--seconds`` of wall time, with 0, 1
and 2 other CPU-bound processes (busy loops) on the machine. It reports steps per wall second
and per CPU second (``time.process_time``, all threads), medians of ``--repeats`` runs, and
writes ``threads.json`` and ``threads.md``.

Per CPU second is what a CPU-time budget buys; a setting "collapses" under load when it falls
well below one thread's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODELS = ("demo", "lj13", "qm9")
SETTINGS = {  # name -> (threads argument, OMP_WAIT_POLICY; None: OpenMP's default)
    "1 thread": ("1", None),
    "2 threads, OpenMP default wait": ("2", None),
    "2 threads, passive wait (grassflow's)": ("2", "PASSIVE"),
    "auto": ("auto", "PASSIVE"),
}


def _worker(model_name: str, threads: str, seconds: float) -> dict:
    import torch  # before grassflow, which would otherwise set OMP_WAIT_POLICY

    from grassflow.training import OBJECTIVES
    from grassflow.training.threads import set_threads

    n = set_threads(threads)
    torch.manual_seed(0)
    if model_name == "demo":
        from grassflow.data.textures import sample_texture
        from grassflow.tasks import texture_runs as tx

        exp = tx.DEMO
        model = tx.build_model(exp)
        batch = sample_texture(exp.dataset, exp.train.batch_size, seed=0)
    else:
        from grassflow_paper import qm9_runs as qm9
        from grassflow_paper import vs_enf

        if model_name == "lj13":
            shape = vs_enf.build_model(vs_enf.ENFExperiment(system="lj13"))
            size = vs_enf.ENFExperiment().batch_size
        else:
            shape = qm9._models(qm9.QM9Experiment()).shape
            size = 128
        model = shape.flow
        batch = model.manifold.random(size, dtype=torch.float64)
    objective = OBJECTIVES[getattr(exp, "objective", "fm") if model_name == "demo" else "fm"]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad()
        loss, _ = objective(model, batch)
        loss.backward()
        optimizer.step()

    step()  # warm-up
    steps, w0, c0 = 0, time.monotonic(), time.process_time()
    while time.monotonic() - w0 < seconds:
        step()
        steps += 1
    wall, cpu = time.monotonic() - w0, time.process_time() - c0
    return {"threads": n, "steps": steps, "per_wall_s": steps / wall, "per_cpu_s": steps / cpu}


def _busy(k: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]


def _measure(model: str, setting: str, seconds: float) -> dict:
    threads, policy = SETTINGS[setting]
    cmd = [sys.executable, __file__, "--worker", model, threads, str(seconds)]
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        print(json.dumps(_worker(sys.argv[2], sys.argv[3], float(sys.argv[4]))))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--loads", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--out", default="results/threads")
    args = p.parse_args()
    rows = []
    for load in args.loads:
        busy = _busy(load)
        try:
            for model in args.models:
                for setting in SETTINGS:
                    runs = [_measure(model, setting, args.seconds) for _ in range(args.repeats)]
                    row = {"model": model, "setting": setting, "load": load,
                           "threads": runs[0]["threads"],
                           **{k: statistics.median(r[k] for r in runs)
                              for k in ("per_wall_s", "per_cpu_s")}}  # fmt: skip
                    rows.append(row)
                    print(f"load {load} | {model:5s} | {setting:20s} | {row['threads']} | "
                          f"{row['per_wall_s']:8.2f} steps/s | {row['per_cpu_s']:8.2f} "
                          "steps/CPU-s", flush=True)  # fmt: skip
        finally:
            for proc in busy:
                proc.kill()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "threads.json").write_text(json.dumps(rows, indent=1))
    (out / "threads.md").write_text(markdown(rows, args))
    print(markdown(rows, args))


def markdown(rows: list[dict], args) -> str:
    loads = sorted({r["load"] for r in rows})
    head = " | ".join(f"{load} busy: steps/s, /CPU-s" for load in loads)
    lines = [
        f"Training steps per wall second and per CPU second, {os.cpu_count()} cores, median of "
        f"{args.repeats} run(s) of {args.seconds:g} s each; 'busy' counts other CPU-bound "
        "processes. Made by `PYTHONPATH=src python benchmarks/threads.py`.", "",
        f"| model | threads | {head} |", "|---|---|" + "---|" * len(loads),
    ]  # fmt: skip
    for model in dict.fromkeys(r["model"] for r in rows):
        for setting in SETTINGS:
            cells = []
            for load in loads:
                r = next((r for r in rows if (r["model"], r["setting"], r["load"])
                          == (model, setting, load)), None)  # fmt: skip
                cells.append("–" if r is None else f"{r['per_wall_s']:.1f}, {r['per_cpu_s']:.1f}")
            threads = next(r["threads"] for r in rows if r["model"] == model
                           and r["setting"] == setting)  # fmt: skip
            lines.append(f"| {model} | {setting} ({threads}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
