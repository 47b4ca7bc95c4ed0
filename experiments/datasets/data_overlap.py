"""How many test configurations also occur in training or validation: DW4, LJ13, QM9 positional.

DW4 and LJ13 are split as :data:`grassflow_paper.vs_enf.ENF_SPLITS` (the Klein et al.
2023 files in ``../shared/data/alt_klein2023_from_DEM``), loaded by ``load_enf_splits``;
QM9 positional is E-NF's split of the 19-atom molecules, centred, as
:func:`grassflow.data.qm9.load_qm9_positional` loads it. Two comparisons
(:mod:`grassflow.data.overlap`):

* verbatim: equal rows of the arrays as loaded (every value equal);
* up to symmetry: sorted interpoint distances equal within ``atol`` (rotation, reflection,
  translation and permutation of points; an upper bound on such repeats).

Writes ``results/data_overlap.json`` and ``results/data_overlap.md``::

    PYTHONPATH=src python experiments/datasets/data_overlap.py [--qm9-cache data] [--out results]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from grassflow.data.overlap import deduplicate, invariant_match_mask, overlap_report
from grassflow.data.particle_files import shared_data_dir
from grassflow.data.qm9 import load_qm9_positional
from grassflow_paper.provenance import command
from grassflow_paper.vs_enf import ENF_SPLITS, KLEIN_DIR, SHAPES, load_enf_splits

N_TRAIN = {"dw4": (1000, 10_000, 100_000), "lj13": (10, 100, 1000)}  # LJ13 adds its maximum
ATOLS = (1e-4, 1e-2)  # up-to-symmetry tolerances, in the units of the coordinates


def symmetric_counts(train, val, test, atol: float) -> dict[str, int]:
    """Test rows matching a train / val row up to symmetry, and those matching neither."""
    in_train = invariant_match_mask(test, train, atol=atol)
    in_val = invariant_match_mask(test, val, atol=atol)
    return {"test_in_train": int(in_train.sum()), "test_in_val": int(in_val.sum()),
            "novel_test": int((~(in_train | in_val)).sum())}  # fmt: skip


def split_row(system: str, n_train, splits: dict, rows: dict[str, str]) -> dict:
    """The verbatim report plus the up-to-symmetry counts for one split."""
    train, val, test = (np.asarray(splits[s]) for s in ("train", "val", "test"))
    row = {"system": system, "n_train_requested": n_train, "rows": rows,
           **overlap_report(train, val, test)}  # fmt: skip
    row["symmetric"] = {f"{a:g}": symmetric_counts(train, val, test, a) for a in ATOLS}
    return row


def file_summary(folder: Path) -> list[dict]:
    """Distinct rows and the largest multiplicity of each upstream file."""
    out = []
    for system in ENF_SPLITS:
        for name in sorted({name for name, _, _ in ENF_SPLITS[system].values()}):
            X = np.load(folder / name)
            _, counts = deduplicate(X)
            out.append({"file": name, "rows": len(X), "distinct": len(counts),
                        "max_multiplicity": int(counts.max())})  # fmt: skip
    return out


def klein_rows(system: str, folder: Path) -> list[dict]:
    """One report per n_train of ``system`` (LJ13 also at the most its train file allows)."""
    n_trains = list(N_TRAIN[system])
    if system == "lj13":
        n_max = len(np.load(folder / ENF_SPLITS["lj13"]["train"][0], mmap_mode="r"))
        n_trains.append(n_max)
    rows = {}
    for split, (name, start, end) in ENF_SPLITS[system].items():
        rows[split] = f"{name}[{start}:{'n_train' if end is None else end}]"
    out = []
    for n in n_trains:
        splits = {k: v.numpy() for k, v in load_enf_splits(system, n, folder).items()}
        out.append(split_row(system, n, splits, rows))
        print(f"{system} n_train {n}: done", file=sys.stderr)
    return out


def qm9_rows(cache_dir: str) -> list[dict]:
    """E-NF's QM9 positional split (train vs valid vs test), centred positions in Å."""
    q = load_qm9_positional(cache_dir, progress=False)
    splits = {"train": q["train"], "val": q["valid"], "test": q["test"]}
    rows = {s: f"qm9 {k}, 19-atom molecules, centred" for s, k in
            (("train", "train"), ("val", "valid"), ("test", "test"))}  # fmt: skip
    return [split_row("qm9", len(q["train"]), splits, rows)]


def markdown(result: dict) -> str:
    a0, a1 = (f"{a:g}" for a in ATOLS)
    lines = [
        "# Test configurations that also occur in training or validation",
        "",
        f"Made by: `{result['command']}` (from the repository root)",
        "",
        "Splits: DW4 and LJ13 as `ENF_SPLITS` in `grassflow_paper.vs_enf` (Klein et al. "
        "2023 files, `../shared/data/alt_klein2023_from_DEM`); QM9 positional as "
        "`grassflow.data.qm9.load_qm9_positional` (E-NF's split, 19-atom molecules, centred "
        "positions; equal raw positions give equal centred ones, so no centred repeat means no "
        "raw repeat either). Counts are rows (a test row repeated within the test set counts each "
        "time); `distinct` counts each configuration once. Verbatim = every value equal "
        "(`grassflow.data.overlap`). Rows used:",
        "",
    ]
    for system in ("dw4", "lj13", "qm9"):
        r = next(x for x in result["rows"] if x["system"] == system)["rows"]
        lines.append(f"* {system}: train `{r['train']}`, val `{r['val']}`, test `{r['test']}`")
    lines += [
        "",
        "## Verbatim repeats",
        "",
        "| system | n_train | distinct train | distinct val | distinct test | test in train "
        "| test in val | test in either | novel test (distinct) | val in train |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in result["rows"]:
        lines.append(
            f"| {x['system']} | {x['n_train']:,} | {x['distinct_train']:,} "
            f"| {x['distinct_val']:,} / {x['n_val']:,} | {x['distinct_test']:,} / "
            f"{x['n_test']:,} | {x['test_in_train']:,} | {x['test_in_val']:,} "
            f"| {x['test_in_either']:,} | {x['novel_test']:,} ({x['distinct_novel_test']:,}) "
            f"| {x['val_in_train']:,} |"
        )
    lines += [
        "",
        "## Up to rotation, reflection, translation and permutation",
        "",
        "Sorted interpoint distances equal within `atol` (coordinate units; Å for QM9). A "
        "match is necessary for a repeat up to these symmetries but not sufficient, so these "
        "counts bound such repeats from above; the verbatim counts bound them from below.",
        "",
        f"| system | n_train | test ≈ train ({a0}) | test ≈ val ({a0}) | novel test ({a0}) "
        f"| test ≈ train ({a1}) | test ≈ val ({a1}) | novel test ({a1}) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in result["rows"]:
        s0, s1 = x["symmetric"][a0], x["symmetric"][a1]
        lines.append(
            f"| {x['system']} | {x['n_train']:,} | {s0['test_in_train']:,} "
            f"| {s0['test_in_val']:,} | {s0['novel_test']:,} | {s1['test_in_train']:,} "
            f"| {s1['test_in_val']:,} | {s1['novel_test']:,} |"
        )
    lines += [
        "",
        "## Whole upstream files",
        "",
        "| file | rows | distinct | largest multiplicity |",
        "|---|---:|---:|---:|",
    ]
    for f in result["files"]:
        lines.append(
            f"| `{f['file']}` | {f['rows']:,} | {f['distinct']:,} | {f['max_multiplicity']} |"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-dir",
        default=None,
        help=f"folder of the Klein files (default ../shared/data/{KLEIN_DIR})",
    )
    parser.add_argument("--qm9-cache", default="data", help="QM9 positional cache folder")
    parser.add_argument("--out", default="results", help="folder for data_overlap.{json,md}")
    args = parser.parse_args()
    shared = shared_data_dir()
    if args.data_dir is None and shared is None:
        parser.error("no ../shared/data folder: pass --data-dir")
    folder = Path(args.data_dir) if args.data_dir else shared / KLEIN_DIR
    t0 = time.perf_counter()
    rows = klein_rows("dw4", folder) + klein_rows("lj13", folder) + qm9_rows(args.qm9_cache)
    result = {"command": command(), "atol": list(ATOLS), "shapes": SHAPES, "rows": rows,
              "files": file_summary(folder), "seconds": time.perf_counter() - t0}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_overlap.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (out / "data_overlap.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
