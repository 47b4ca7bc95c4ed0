"""Time and memory of the likelihood and an MLE step: forward Laplacian, HVP, paper's baseline.

The benchmark suite of issues 6 and 15: the forward-Laplacian fast path against the
Hessian-vector-product path and the paper's Kronecker baseline, measured in one run.

Run: ``PYTHONPATH=src python benchmarks/suite.py [--quick] [--out results/benchmarks]``.

Paths (all with the same DOPRI5 controller and tolerances):

* ``forward``: the low-rank Cayley RKMK solver with the divergence from one forward pass of a
  :class:`~grassflow.nn.jet.Jet` (``GrassmannField(laplacian="forward")``), float64;
* ``hvp``: the same solver with k(D - k) Hessian-vector products by double backward (the fast
  path before issue 15), float64;
* ``kronecker``: the paper-faithful baseline: DOPRI5 in re-centred Cayley charts with explicit
  Dk x Dk Kronecker Jacobians (``method="kronecker"``) and the divergence as the paper's
  RCNF-based implementation takes it, one ``torch.autograd.grad`` per ambient coordinate of
  the field (``laplacian="loop"``), float64;
* ``forward_f32``: ``forward`` in float32.

Each case Gr(k, D) has a potential: the paper's MLP (hidden (32, 32, 32), weights scaled by
``--gain``) or, for the ``graph`` cases, :class:`~grassflow.nn.graph.GraphPotential` (width 32,
two layers) on clouds of D + 1 points. Tasks, all with an untrained potential:

* ``train``: seconds per MLE iteration with the exact divergence (forward + backward of
  ``-log_prob(Y).mean()`` on a batch of 100, 16 for the graph potential, in ``train()`` mode),
  the forward solve's NFE and peak memory;
* ``train_hutch``: the same with the Hutchinson divergence (one probe);
* ``ll``: seconds for the exact log-likelihood of 1,000 points (``eval()``, no grad, batches of
  100), the mean NFE per batch and peak memory;
* ``agree``: log p of the same few points (one batch) from every path at the same tolerances.

Times are medians over ``--repeats`` runs after a warm-up run. Peak memory is the growth of
the resident set: ``ru_maxrss`` of a freshly forked worker (one per case, path and task) minus
its RSS just before the workload. It includes allocator caching, so it is an upper bound on
what the tensors need, with about 1 MB resolution. Workers also run under an address-space
limit (``--mem-gb``) and a time limit (``--timeout``); a case that exceeds one is recorded as
skipped with the reason. The Kronecker baseline forms (Dk)^2 matrices per point and stage and
keeps them for backward, so it only runs where ``D k <= --kron-max-dk`` (training: the
smaller ``--kron-max-dk-train``). Results are written to JSON after every measurement and
finished entries are skipped on a rerun, so the suite resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from grassflow.flows import GrCNF
from grassflow.manifolds import Grassmann
from grassflow.nn import GraphPotential, GrassmannField, Potential, scale_init_

# name: (solver, dtype, divergence path of GrassmannField)
PATHS = {
    "forward": ("cayley_rkmk", torch.float64, "forward"),
    "hvp": ("cayley_rkmk", torch.float64, "hvp"),
    "kronecker": ("kronecker", torch.float64, "loop"),
    "forward_f32": ("cayley_rkmk", torch.float32, "forward"),
}
TASKS = ("train", "train_hutch", "ll", "agree")


@dataclass(frozen=True)
class Settings:
    batch: int = 100
    graph_train_batch: int = 16  # backprop through the ODE keeps every stage's pair features
    n_points: int = 1000
    ll_batch: int = 100
    n_agree: int = 20
    repeats: int = 3
    warmup: int = 1
    hidden: tuple[int, ...] = (32, 32, 32)
    gain: float = 2.0
    atol: float = 1e-5  # the paper's tolerances, for every path
    rtol: float = 1e-5
    agree_tol: float = 1e-8  # atol = rtol for the agreement check
    threads: int = 1
    kron_max_dk: int = 256
    kron_max_dk_train: int = 64
    mem_gb: float = 8.0
    timeout: float = 1800.0


QUICK = Settings(batch=10, n_points=20, ll_batch=20, n_agree=4, repeats=1, warmup=0,
                 hidden=(16, 16), gain=1.0, agree_tol=1e-7, timeout=60.0)  # fmt: skip


def cases(quick: bool) -> list[tuple[str, int, int, str]]:
    """``(name, k, D, series)``: the paper's manifolds, the graph potential's (series
    ``"graph"``), then the scaling series."""
    named = [(1, 3), (2, 4)] if quick else [(1, 3), (2, 4), (3, 13), (3, 19)]
    graph = [(2, 4)] if quick else [(3, 12), (3, 18)]
    grid = (
        [(1, 6), (1, 12), (2, 12)]
        if quick
        else [(k, D) for D in (8, 16, 32, 64) for k in (1, 3, 8) if k < D]
    )
    out = [(f"Gr({k},{D})", k, D, "named") for k, D in named]
    out += [(f"graph Gr({k},{D})", k, D, "graph") for k, D in graph]
    return out + [(f"Gr({k},{D})", k, D, "scaling") for k, D in grid if (k, D) not in named]


def potential(k: int, D: int, series: str, s: Settings) -> torch.nn.Module:
    if series == "graph":
        return GraphPotential(D + 1, k, 32, 2)
    return scale_init_(Potential(D, k, s.hidden), s.gain)


# ------------------------------------------------------------------------------- worker
def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _median_time(fn, s: Settings) -> tuple[float, float]:
    for _ in range(s.warmup):
        fn()
    times = []
    for _ in range(s.repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _prime(model: GrCNF, Y: torch.Tensor, backward: bool) -> None:
    """Touch the code paths once (library pages, lazy init) so RSS growth measures tensors."""
    Y = Y.clone().requires_grad_(backward)
    X, div = model.field.field_and_divergence(model.T.to(Y), Y, create_graph=backward)
    if backward:
        (X.sum() + div.sum()).backward()
    eye = torch.eye(2 * Y.shape[-1], dtype=Y.dtype)
    torch.linalg.solve(eye, eye), torch.linalg.inv(eye)
    model.zero_grad(set_to_none=True)


def run_task(task: str, k: int, D: int, series: str, path: str, s: Settings) -> dict:
    """One measurement in the current process (see the module docstring)."""
    torch.set_num_threads(s.threads)
    method, dtype, laplacian = PATHS[path]
    torch.manual_seed(0)  # the same field and points in every worker
    gr = Grassmann(k, D)
    field = GrassmannField(potential(k, D, series, s), laplacian)
    model = GrCNF(gr, field, method=method, atol=s.atol, rtol=s.rtol).to(dtype)
    gen = torch.Generator().manual_seed(1)
    batch = s.graph_train_batch if series == "graph" else s.batch
    n = {"train": batch, "train_hutch": batch, "ll": s.n_points, "agree": s.n_agree}[task]
    Y = gr.random(n, generator=gen, dtype=torch.float64).to(dtype)
    if task == "agree":
        with torch.no_grad():
            out = {"log_p": model.eval().log_prob(Y).double().tolist()}
            if dtype == torch.float64:
                model.atol = model.rtol = s.agree_tol
                out["log_p_tight"] = model.log_prob(Y).tolist()
        return out
    training = task.startswith("train")
    _prime(model, Y[:1], training)
    rss0 = _rss_mb()
    if training:
        model.train()
        model.divergence = "hutchinson" if task == "train_hutch" else "exact"

        def fn():
            model.zero_grad(set_to_none=True)
            (-model.log_prob(Y).mean()).backward()
            return model.last_stats["nfe"]
    else:
        model.eval()

        def fn():
            with torch.no_grad():
                nfe = [(model.log_prob(c), model.last_stats["nfe"])[1] for c in Y.split(s.ll_batch)]
            return sum(nfe) / len(nfe)

    seconds, nfe = _median_time(fn, s)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss0
    return {"seconds": seconds, "nfe": nfe, "peak_mb": round(peak, 1)}


def _worker(conn, job: dict, s: Settings) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:  # address-space limit on top of what is mapped now
        vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (vm + int(s.mem_gb * 2**30), hard))
    try:
        conn.send(run_task(job["task"], job["k"], job["D"], job["series"], job["path"], s))
    except (MemoryError, RuntimeError) as err:
        msg = str(err)
        oom = isinstance(err, MemoryError) or "alloc" in msg.lower()
        conn.send({"skipped": f"out of memory (> {s.mem_gb:g} GB)" if oom else msg[:200]})


def run_isolated(job: dict, s: Settings) -> dict:
    """``run_task`` in a forked child, so that its peak RSS is its own (and it can be stopped)."""
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_worker, args=(send, job, s))
    proc.start()
    send.close()
    if recv.poll(s.timeout):
        try:
            out = recv.recv()
        except EOFError:
            out = {"skipped": "worker died (probably out of memory)"}
    else:
        proc.kill()
        out = {"skipped": f"timeout (> {s.timeout:g} s)"}
    proc.join()
    return out


# ------------------------------------------------------------------------------- report
def _get(res: dict, case: str, path: str, task: str, key: str):
    return res["cases"].get(case, {}).get(path, {}).get(task, {}).get(key)


def _fmt(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _max_gap(values: list) -> float | None:
    arrays = [np.array(v) for v in values if v is not None]
    if len(arrays) < 2:
        return None
    return float(max(np.abs(a - b).max() for a in arrays for b in arrays))


def agreement(res: dict, case: str) -> tuple[float | None, float | None, float | None]:
    """Max |log p| disagreement between float64 paths at ``agree_tol`` and at the benchmark
    tolerance, and between float32 and float64 fast at the benchmark tolerance."""
    f64 = [p for p in PATHS if p != "forward_f32"]
    return (
        _max_gap([_get(res, case, p, "agree", "log_p_tight") for p in f64]),
        _max_gap([_get(res, case, p, "agree", "log_p") for p in f64]),
        _max_gap([_get(res, case, p, "agree", "log_p") for p in ("forward", "forward_f32")]),
    )


def _ratio(res: dict, case: str, path: str, task: str, ref: str):
    t, r = (_get(res, case, p, task, "seconds") for p in (path, ref))
    return r / t if t and r else None


def table(res: dict) -> str:
    lines = [
        "| case | path | train s/iter | × vs kron | × vs hvp | NFE | train peak MB "
        "| Hutchinson train s/iter | × vs kron | log-lik s | × vs kron | × vs hvp | ll peak MB "
        "| max abs Δ log p: tight, bench tol | f32 vs f64 abs Δ log p |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {"named": 0, "graph": 1, "scaling": 2}
    for case in sorted(res["cases"], key=lambda c: order[res["cases"][c]["series"]]):
        tight, loose, f32 = agreement(res, case)
        for path in PATHS:
            timed = ("train", "train_hutch", "ll")
            tr, th, ll = (_get(res, case, path, t, "seconds") for t in timed)
            skip = [_get(res, case, path, t, "skipped") for t in timed]
            note = "; ".join(f"{t}: {r}" for t, r in zip(timed, skip) if r)
            cells = [
                case,
                path + (f" ({note})" if note else ""),
                _fmt(tr, ".3g"),
                _fmt(_ratio(res, case, path, "train", "kronecker"), ".1f"),
                _fmt(_ratio(res, case, path, "train", "hvp"), ".1f"),
                _fmt(_get(res, case, path, "train", "nfe"), ".0f"),
                _fmt(_get(res, case, path, "train", "peak_mb"), ".0f"),
                _fmt(th, ".3g"),
                _fmt(_ratio(res, case, path, "train_hutch", "kronecker"), ".1f"),
                _fmt(ll, ".3g"),
                _fmt(_ratio(res, case, path, "ll", "kronecker"), ".1f"),
                _fmt(_ratio(res, case, path, "ll", "hvp"), ".1f"),
                _fmt(_get(res, case, path, "ll", "peak_mb"), ".0f"),
                f"{_fmt(tight, '.1e')}, {_fmt(loose, '.1e')}" if path == "forward" else "",
                _fmt(f32, ".1e") if path == "forward_f32" else "",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fits(res: dict) -> list[str]:
    """Least squares ``log t = log c + a log D + b log k`` over the scaling series, per path."""
    out = []
    for path in PATHS:
        for task, key in (("train", "seconds"), ("train_hutch", "seconds"), ("ll", "seconds"),
                          ("ll", "per_nfe")):  # fmt: skip
            rows = []
            for case, entry in res["cases"].items():
                t = _get(res, case, path, task, "seconds")
                if entry["series"] != "scaling" or t is None:
                    continue
                if key == "per_nfe":
                    t = t / _get(res, case, path, task, "nfe")
                rows.append((math.log(entry["D"]), math.log(entry["k"]), math.log(t)))
            if len({r[0] for r in rows}) < 2 or len({r[1] for r in rows}) < 2:
                continue
            A = np.array([[1.0, d, k] for d, k, _ in rows])
            coef = np.linalg.lstsq(A, np.array([r[2] for r in rows]), rcond=None)[0]
            what = {"seconds": f"{task} time", "per_nfe": "ll time per NFE"}[key]
            out.append(
                f"{path:10s} {what:16s} ~ D^{coef[1]:.2f} k^{coef[2]:.2f}  ({len(rows)} cases)"
            )
    return out


def plot(res: dict, path_png: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    colors = {"forward": "C0", "hvp": "C2", "kronecker": "C3", "forward_f32": "C1"}
    styles = ["-", "--", ":", "-."]
    ks = sorted({e["k"] for e in res["cases"].values() if e["series"] == "scaling"})
    for ax, task, title in zip(
        axes, ("train", "ll"), ("training iteration (exact divergence)", "log-likelihood")
    ):
        for path in PATHS:
            for i, k in enumerate(ks):
                pts = sorted(
                    (e["D"], _get(res, c, path, task, "seconds"))
                    for c, e in res["cases"].items()
                    if e["series"] == "scaling" and e["k"] == k
                )
                pts = [(d, t) for d, t in pts if t is not None]
                if pts:
                    d, t = zip(*pts)
                    ax.plot(d, t, styles[i % 4], marker="o", color=colors[path],
                            label=f"{path}, k={k}")  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel="D", ylabel="seconds", title=title)
    axes[0].legend(fontsize=7, ncol=2)
    fig.savefig(path_png, dpi=120)


# --------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny cases, 1 repeat (< 1 min)")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--budget", type=float, default=None, help="wall-clock minutes")
    for name, default in asdict(QUICK if "--quick" in (argv or sys.argv) else Settings()).items():
        if not isinstance(default, tuple):
            parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    args = parser.parse_args(argv)
    base = asdict(QUICK if args.quick else Settings())
    s = Settings(**{k: getattr(args, k, v) for k, v in base.items()})
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "suite_quick" if args.quick else "suite"
    json_path = args.out / f"{stem}.json"
    meta = {"settings": asdict(s), "torch": torch.__version__, "cpu": platform.processor(),
            "cpus": os.cpu_count()}  # fmt: skip
    res = json.loads(json_path.read_text()) if json_path.exists() else {"meta": meta, "cases": {}}
    # limits decide what is skipped, not what is measured, so a resume may change them
    limits = ("timeout", "mem_gb")
    old = {k: v for k, v in res["meta"]["settings"].items() if k not in limits}
    if json.dumps(old) != json.dumps({k: v for k, v in asdict(s).items() if k not in limits}):
        sys.exit(f"{json_path} was made with other settings; use another --out or delete it")
    start = time.monotonic()
    print(f"settings: {asdict(s)}", flush=True)
    for name, k, D, series in cases(args.quick):
        if args.budget is not None and time.monotonic() - start > 60 * args.budget:
            print(f"budget of {args.budget} min spent; rerun to resume", flush=True)
            break
        entry = res["cases"].setdefault(name, {"k": k, "D": D, "series": series})
        for path in PATHS:
            for task in TASKS:
                if task in entry.setdefault(path, {}):
                    continue
                cap = s.kron_max_dk_train if task.startswith("train") else s.kron_max_dk
                if path == "kronecker" and D * k > cap:
                    out = {"skipped": f"D*k={D * k} > {cap}"}
                else:
                    job = {"task": task, "k": k, "D": D, "series": series, "path": path}
                    out = run_isolated(job, s)
                entry[path][task] = out
                json_path.write_text(json.dumps(res, indent=1))
                shown = {k_: v for k_, v in out.items() if k_ != "log_p"}
                print(f"{name:10s} {path:9s} {task:11s} {shown}", flush=True)
    md = table(res)
    lines = ["", md, "", "Growth fits (time ~ c D^a k^b, scaling series):", *fits(res)]
    for i, tol in enumerate((s.agree_tol, s.atol)):
        gaps = [agreement(res, c)[i] for c in res["cases"]]
        worst = max((g for g in gaps if g is not None), default=None)
        ok = "within" if worst is not None and worst < 1e-4 else "NOT within"
        lines.append(f"max |Δ log p| between float64 paths at atol=rtol={tol:g}, all cases: "
                     f"{_fmt(worst, '.2e')} ({ok} 1e-4 nats)")  # fmt: skip
    print("\n".join(lines))
    cmd = "PYTHONPATH=src python benchmarks/suite.py" + (" --quick" if args.quick else "")
    header = f"`{cmd}` (threads={s.threads})\n"
    (args.out / f"{stem}.md").write_text(header + "\n".join(lines) + "\n")
    plot(res, args.out / f"{stem}.png")


if __name__ == "__main__":
    main()
