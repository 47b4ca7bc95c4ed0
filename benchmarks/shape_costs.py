"""CPU cost of one exact likelihood and of one sample of trained shape models (issue 34).

Run: ``PYTHONPATH=src python benchmarks/shape_costs.py RUN_DIR [RUN_DIR ...]
[--n 20] [--out results/benchmarks]`` on run directories of ``grassflow reproduce vs-enf
--model equivariant-cnf`` (any system and geometry), one thread.

For each run: the best checkpoint in its evaluation dtype and tolerance; ``--n`` test
configurations scored one at a time by the exact likelihood (dopri5 with the exact
divergence), and ``--n`` samples drawn one at a time (dopri5 without the divergence). Per
configuration it reports the median NFE and the median CPU seconds. Writes
``shape_costs.json`` and ``shape_costs.md``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from grassflow_paper import efm


def costs(run_dir: Path, n: int) -> dict:
    exp, model = efm.load_run(run_dir)
    test = efm.load_splits(exp.system, exp.n_train, exp.data_dir)["test"][:n].to(model.dtype)
    rows = {"likelihood": ([], []), "sample": ([], [])}
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for i in range(n):
            start = time.process_time()
            model.log_prob(test[i : i + 1])
            rows["likelihood"][0].append(time.process_time() - start)
            rows["likelihood"][1].append(model.last_stats["nfe"])
            start = time.process_time()
            model.sample(1, g)
            rows["sample"][0].append(time.process_time() - start)
            rows["sample"][1].append(model.last_stats["nfe"])
    out = {"run": run_dir.name, "system": exp.system, "geometry": exp.geometry, "n": n,
           "params": sum(p.numel() for p in model.parameters())}  # fmt: skip
    for what, (seconds, nfe) in rows.items():
        out[f"{what}_cpu_s"] = statistics.median(seconds)
        out[f"{what}_nfe"] = statistics.median(nfe)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--out", default="results/benchmarks")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for run in args.runs:
        rows.append(costs(run, args.n))
        print(rows[-1], flush=True)
    command = "PYTHONPATH=src python benchmarks/shape_costs.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "shape_costs.json").write_text(json.dumps({"command": command, "rows": rows},
                                                     indent=2) + "\n")  # fmt: skip
    lines = [f"`{command}`", "", "Medians per configuration, one CPU thread.", "",
             "| system | geometry | params | exact likelihood: NFE | CPU s | sample: NFE "
             "| CPU s |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['system']} | {r['geometry']} | {r['params']:,} | "
                     f"{r['likelihood_nfe']:.0f} | {r['likelihood_cpu_s']:.3g} | "
                     f"{r['sample_nfe']:.0f} | {r['sample_cpu_s']:.3g} |")  # fmt: skip
    (out / "shape_costs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
