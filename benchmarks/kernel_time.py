"""Kernel (system) time against user time of the shape models, under two malloc settings.

The settings: glibc's allocator as it comes and as ``import grassflow`` sets it (issue 33,
"Remove the kernel overhead").

Run: ``PYTHONPATH=src python benchmarks/kernel_time.py [--out results/benchmarks]``
(about 3 CPU minutes; ``--quick`` for a smoke run).

Each workload runs in a fresh process, one torch thread, float64, twice: ``before`` with
``GRASSFLOW_MALLOC=default`` (glibc's defaults: a dynamic mmap threshold of at most 32 MiB and
a trim threshold of twice the largest freed mmapped block), ``after`` with grassflow's
``mallopt`` setting (`grassflow._malloc`). Workloads, on random twelve-point clouds in R^3:

- ``shapeflow_log_prob``: exact ``log_prob`` of 16 clouds by the default two-part
  ``TwoPartShapeFlow(12, 3)`` (the paper's model, `grassflow_paper.two_part`, out of the
  library since issue 34; graph potential, forward-Laplacian jets), eval mode, no grad;
- ``shapeflow_egnn_log_prob``: the same with ``field="egnn"`` (what ``grassflow train`` built
  up to issue 34; exact divergence by ``vmap``-ed Jacobian-vector products through the EGNN);
- ``baseline_log_prob``: exact ``log_prob`` of 16 clouds by ``ShapeFlow(12, 3)``;
- ``shapeflow_train``, ``shapeflow_egnn_train``: flow-matching steps of the two-part model's flow
  (batch 128, Adam), after one warm-up step;
- ``baseline_train``: ``cfm_objective`` steps of the baseline (batch 128, Adam), after one
  warm-up step.

Per run it reads user and system time and minor page faults twice: around the workload in
the worker (``getrusage(RUSAGE_SELF)`` deltas, without the imports and the warm-up), and for
the whole worker process from ``os.wait4``. The goal is system < 10 % of user time in the
workload. Both runs of a workload must give identical numbers (``torch.equal`` on the
log-likelihoods, the losses and the trained parameters); the table says so.
Writes ``kernel_time.json`` and ``kernel_time.md`` with the command at the top.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOADS = ("shapeflow_log_prob", "shapeflow_egnn_log_prob", "baseline_log_prob",
             "shapeflow_train", "shapeflow_egnn_train", "baseline_train")  # fmt: skip
SETTINGS = {"before": "default", "after": "tuned"}  # -> $GRASSFLOW_MALLOC
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
               "MALLOC_MMAP_MAX_", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES")  # fmt: skip


def _usage() -> tuple[float, float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_minflt


def _worker(name: str, args: argparse.Namespace, out_file: str) -> dict:
    import torch

    torch.set_num_threads(1)
    import grassflow
    from grassflow import _malloc
    from grassflow.training import OBJECTIVES, cfm_objective
    from grassflow_paper.two_part import TwoPartShapeFlow

    torch.manual_seed(0)
    n, d = args.n_points, args.dim
    P = torch.randn(max(args.batch, args.clouds), n, d, dtype=torch.float64)
    if name.startswith("shapeflow"):
        field = "egnn" if "egnn" in name else "graph"
        model = TwoPartShapeFlow(n, d, field=field).double()
    else:
        model = grassflow.ShapeFlow(n, d).double()
    stats: dict = {}
    if name.endswith("log_prob"):
        model.eval()
        u0 = _usage()
        with torch.no_grad():
            result = {"log_prob": model.log_prob(P[: args.clouds])}
        u1 = _usage()
        stats = dict(model.flow.last_stats if name.startswith("shapeflow") else model.last_stats)
        stats.pop("divergence_path", None)
    else:
        if name.startswith("shapeflow"):
            trained, batch = model.flow, model.factor(P[: args.batch])[0]
            objective = OBJECTIVES["fm"]
        else:
            trained, batch, objective = model, P[: args.batch], cfm_objective
        optimizer = torch.optim.Adam(trained.parameters(), lr=1e-3)
        losses = []

        def step() -> None:
            optimizer.zero_grad()
            loss, _ = objective(trained, batch)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())

        step()  # warm-up, outside the measurement
        u0 = _usage()
        for _ in range(args.steps):
            step()
        u1 = _usage()
        stats = {"steps": args.steps}
        result = {"losses": torch.stack(losses),
                  **{k: v.detach() for k, v in trained.state_dict().items()}}  # fmt: skip
    torch.save(result, out_file)
    user, system, faults = (b - a for a, b in zip(u0, u1))
    return {"user_s": user, "system_s": system, "minor_faults": faults, **stats,
            "malloc": dict(_malloc.STATE)}  # fmt: skip


def _run(name: str, setting: str, args: argparse.Namespace, tmp: Path) -> dict:
    out_file = tmp / f"{name}-{setting}.pt"
    cmd = [sys.executable, __file__, "--worker", name, "--out-file", str(out_file),
           "--n-points", str(args.n_points), "--dim", str(args.dim), "--clouds",
           str(args.clouds), "--batch", str(args.batch), "--steps", str(args.steps)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in _MALLOC_ENV}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", GRASSFLOW_MALLOC=SETTINGS[setting])
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    w0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} ({setting}) failed with exit code {proc.returncode}")
    row = json.loads(stdout.strip().splitlines()[-1])
    row.update(workload=name, setting=setting, wall_s=time.monotonic() - w0,
               process={"user_s": usage.ru_utime, "system_s": usage.ru_stime,
                        "minor_faults": usage.ru_minflt,
                        "max_rss_mb": usage.ru_maxrss / 1024})  # fmt: skip
    return row


def _identical(tmp: Path, name: str) -> bool:
    import torch

    a, b = (torch.load(tmp / f"{name}-{s}.pt") for s in SETTINGS)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/benchmarks")
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    p.add_argument("--n-points", type=int, default=12)
    p.add_argument("--dim", type=int, default=3)
    p.add_argument("--clouds", type=int, default=16, help="clouds per exact log_prob")
    p.add_argument("--batch", type=int, default=128, help="clouds per training step")
    p.add_argument("--steps", type=int, default=30, help="measured training steps")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 clouds, 3 steps")
    p.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    p.add_argument("--out-file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args, args.out_file)))
        return
    env = [f"{k}={shlex.quote(os.environ[k])}" for k in ("PYTHONPATH", "OMP_NUM_THREADS")
           if k in os.environ]  # fmt: skip
    command = " ".join([*env, shlex.join(["python", *sys.argv])])
    if args.quick:
        args.clouds, args.batch, args.steps = 2, 16, 3
    rows, same = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.workloads:
            for setting in SETTINGS:  # before and after, back to back (same machine load)
                row = _run(name, setting, args, Path(tmp))
                rows.append(row)
                print(f"{name:24s} {setting:6s} user {row['user_s']:6.2f} s  system "
                      f"{row['system_s']:5.2f} s  ({row['system_s'] / row['user_s']:5.1%})  "
                      f"minor faults {row['minor_faults']:>9,}", flush=True)  # fmt: skip
            same[name] = _identical(Path(tmp), name)
    import torch

    meta = {"command": command, "python": platform.python_version(), "torch": torch.__version__,
            "libc": " ".join(platform.libc_ver()), "cpus": os.cpu_count(),
            "n_points": args.n_points, "dim": args.dim, "clouds": args.clouds,
            "batch": args.batch, "steps": args.steps,
            "load_average": os.getloadavg()}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel_time.json").write_text(
        json.dumps({"meta": meta, "identical": same, "runs": rows}, indent=1) + "\n"
    )
    text = markdown(meta, rows, same)
    (out / "kernel_time.md").write_text(text)
    print(text)


def markdown(meta: dict, rows: list[dict], same: dict) -> str:
    def cell(r: dict) -> str:
        return f"{r['user_s']:.2f} / {r['system_s']:.2f} / {r['minor_faults'] / 1e3:,.0f}k"

    def proc(r: dict) -> str:
        q = r["process"]
        return f"{q['user_s']:.2f} / {q['system_s']:.2f} / {q['minor_faults'] / 1e3:,.0f}k"

    lines = [
        f"Command: `{meta['command']}` (one run; {meta['cpus']} cores, load average "
        f"{meta['load_average'][0]:.1f} at the end; torch {meta['torch']}, "
        f"{meta['libc']}, one torch thread, float64).",
        "",
        f"Workloads on random {meta['n_points']}-point clouds in R^{meta['dim']}: exact "
        f"`log_prob` of {meta['clouds']} clouds; {meta['steps']} training steps of batch "
        f"{meta['batch']} after one warm-up step. *before*: `GRASSFLOW_MALLOC=default` (glibc's "
        "allocator as it comes); *after*: grassflow's `mallopt` setting (`grassflow/_malloc.py`)."
        " Cells: user s / system s / minor page faults, in the workload (`getrusage` in the "
        "worker); the whole worker process (imports, model, warm-up; `os.wait4`) in the last "
        "two columns.",
        "",
        "| workload | before | after | system ÷ user, before → after | identical numbers "
        "| process before | process after |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["workload"] for r in rows):
        b, a = (next(r for r in rows if (r["workload"], r["setting"]) == (name, s))
                for s in SETTINGS)  # fmt: skip
        ratio = f"{b['system_s'] / b['user_s']:.0%} → **{a['system_s'] / a['user_s']:.0%}**"
        lines.append(f"| {name} | {cell(b)} | {cell(a)} | {ratio} | "
                     f"{'yes' if same[name] else '**no**'} | {proc(b)} | {proc(a)} |")  # fmt: skip
    nfe = {r["workload"]: r["nfe"] for r in rows if "nfe" in r and r["setting"] == "after"}
    if nfe:
        lines += ["", "Function evaluations per `log_prob`: "
                  + ", ".join(f"{k} {v}" for k, v in nfe.items()) + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
