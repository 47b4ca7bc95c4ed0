"""Does this tree give the same numbers as an older commit? Short runs of every model kind.

Each case trains a fixed number of iterations (no time budget, one thread, fixed seeds) through
the command line, once with the older commit's code (a git worktree on ``PYTHONPATH``) and once
with this tree's, then evaluates the run and compares every number of ``eval.json`` except
timings. A refactor that claims to change no behaviour must give identical numbers::

    python tools/same_numbers.py --old fd2ba90 --out runs/same_numbers

Only spellings both command lines accept are used (old flags stay as hidden aliases). The
verdict and the compared values go to ``OUT/same_numbers.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KLEIN = ROOT.parent / "shared" / "data" / "alt_klein2023_from_DEM"  # reference copies
TIMING = ("minutes", "seconds", "_s", "threads", "clock", "run_dir", "path")

CASES = {  # name: train arguments (the run directory is appended)
    "textures-fm": ["--dataset", "2spirals", "--iterations", "300", "--seed", "1"],
    "textures-mle": ["--dataset", "swissroll", "--preset", "paper", "--iterations", "40"],
    "particles-dw4": ["--dataset", "dw4", "--n-train", "100", "--iterations", "200",
                      "--source", "klein", "--data-dir", "{klein}"],
    # (the two-part ShapeFlow's cases, shapes-egnn-distance and shapes-graph-wishart, left
    # with it in issue 34: `train --data` now trains the one flow on the cloud alone)
    "equivariant-cnf": ["--data", "{clouds}", "--model", "equivariant-cnf", "--iterations", "60"],
    "molecule-internal": ["--data", "{butane}", "--iterations", "60"],  # InternalFlow's default
}  # fmt: skip


def clouds(path: Path) -> Path:
    """240 noisy pentagons in the plane, randomly rotated and shifted: ``(240, 5, 2)``."""
    rng = np.random.default_rng(0)
    angle = 2 * np.pi * np.arange(5) / 5
    base = np.stack([np.cos(angle), np.sin(angle)], -1)
    X = base + 0.1 * rng.standard_normal((240, 5, 2))
    t = rng.uniform(0, 2 * np.pi, 240)
    R = np.stack([np.cos(t), -np.sin(t), np.sin(t), np.cos(t)], -1).reshape(-1, 2, 2)
    np.save(path, X @ R + rng.standard_normal((240, 1, 2)))
    return path


def butane(path: Path) -> Path:
    """300 MMFF94 conformers of butane (RDKit), made once with this tree's code."""
    if not path.exists():
        run(ROOT / "src", ["data", "conformers", "CCCC", "--n", "300", "--chains", "4",
                           "--burn-in", "200", "--thin", "10", "--out", str(path),
                           "--no-progress"], path.with_suffix(".log"))  # fmt: skip
    return path


def run(src: Path, args: list[str], log: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "grassflow.cli", *args]
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, check=True)


def numbers(d: dict, prefix: str = "") -> dict[str, float]:
    """The numeric leaves of ``d`` that are not timings, by dotted key."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if any(t in k for t in TIMING):
            continue
        if isinstance(v, dict):
            out |= numbers(v, key + ".")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = float(v)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="the older commit")
    p.add_argument("--out", default="runs/same_numbers")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = p.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tree = out / "old-tree"
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree),
                        args.old], check=True)  # fmt: skip
    data = clouds(out / "pentagons.npy")
    molecule = butane(out / "butane.npz") if "molecule-internal" in args.cases else None
    sources = {"old": tree / "src", "new": ROOT / "src"}
    rows = []
    for case in args.cases:
        if "{klein}" in CASES[case] and not KLEIN.exists():
            print(f"{case}: skipped, {KLEIN} is missing", flush=True)
            continue
        evals = {}
        for which, src in sources.items():
            run_dir = out / which / case
            if not (run_dir / "eval.json").exists():
                train = [a.format(clouds=data, klein=KLEIN, butane=molecule) for a in CASES[case]]
                run(src, ["train", *train, "--run-dir", str(run_dir), "--no-progress"],
                    out / f"{which}.log")  # fmt: skip
                run(src, ["eval", str(run_dir), "--n-samples", "100"], out / f"{which}.log")
            evals[which] = numbers(json.loads((run_dir / "eval.json").read_text()))
        old, new = evals["old"], evals["new"]
        keys = sorted(set(old) | set(new))
        differ = [
            k
            for k in keys
            if not (
                k in old
                and k in new
                and (old[k] == new[k] or math.isnan(old[k]) and math.isnan(new[k]))
            )
        ]
        rows.append({"case": case, "compared": len(keys), "differ": differ,
                     "old": old, "new": new})  # fmt: skip
        print(f"{case}: {len(keys)} numbers, {len(differ)} differ {differ}", flush=True)
    head = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    report = {"old": args.old, "new": head, "rows": rows}
    (out / "same_numbers.json").write_text(json.dumps(report, indent=1))
    lines = [f"Fixed-iteration runs, `{args.old}` against `{head}` (eval.json, timings "
             "excluded).", "", "| case | numbers compared | differ | test NLL (old / new) |",
             "|---|---|---|---|"]  # fmt: skip
    for r in rows:
        nll = " / ".join(f"{r[w].get('test_nll', math.nan):.6f}" for w in ("old", "new"))
        lines.append(
            f"| {r['case']} | {r['compared']} | {', '.join(r['differ']) or 'none'} | {nll} |"
        )
    (out / "same_numbers.md").write_text("\n".join(lines) + "\n")
    sys.exit(1 if any(r["differ"] for r in rows) else 0)


if __name__ == "__main__":
    main()
