"""Which Lennard-Jones convention generated the LJ13 reference files of Klein et al. (2023)?

Two conventions are in use for ``lj13_energy`` (:mod:`grassflow.data.particles`): the LJ
term summed over ordered pairs ``i != j`` (every pair twice, ``pairs="ordered"``) or over
``i < j`` once (``pairs="unique"``, bgflow's ``LennardJonesPotential``); the harmonic term
is the same. This script samples LJ13 under each convention with the project's MALA
(:func:`grassflow.data.mcmc.make_dataset`, same seed, same initial states) and compares
both sample sets with ``test_split_LJ13-1000.npy`` (10,000 rows) on

* the energy, evaluated under one fixed convention for every set (both are reported),
* all 78 pair distances of every configuration,
* the virial ``x . grad U``, whose mean is ``(n - 1) d = 36`` for samples of ``exp(-U)``
  (equipartition for a translation-invariant ``U``) under the sampled convention only,

with the energy W1 (:func:`grassflow.metrics.energy_w1`), two-sample KS statistics and the
means; the noise floor is the same comparison between the two halves of the reference (5k
vs 5k) and between its test and val files (10k vs 10k). Writes
``results/lj_convention.{json,md,png}``::

    PYTHONPATH=src python experiments/datasets/lj_convention.py [--n 10000] [--burn-in 6000]
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from scipy.stats import ks_2samp

from grassflow.data.mcmc import make_dataset
from grassflow.data.particle_files import shared_data_dir
from grassflow.data.particles import PAIR_CONVENTIONS, lj13_energy, pair_distances
from grassflow.metrics import energy_w1, finite_energies
from grassflow.viz import draw_histograms
from grassflow_paper.provenance import command

KLEIN = "alt_klein2023_from_DEM"
DOF = 36  # (n - 1) d for 13 particles in 3-D


def observables(x: np.ndarray) -> dict[str, np.ndarray]:
    """Energies and virials under both conventions and all pair distances.

    Args:
        x: ``(N, 39)`` flattened configurations.

    Returns:
        ``energy_<conv>`` and ``virial_<conv>``: ``(N,)``; ``pair_distance``: ``(N * 78,)``.
    """
    xt = torch.from_numpy(np.asarray(x, dtype=np.float64)).view(-1, 13, 3)
    xt = (xt - xt.mean(1, keepdim=True)).requires_grad_(True)
    out = {"pair_distance": pair_distances(xt.detach()).ravel().numpy()}
    for conv in PAIR_CONVENTIONS:
        u = lj13_energy(xt, pairs=conv)
        (g,) = torch.autograd.grad(u.sum(), xt)
        out[f"energy_{conv}"] = u.detach().numpy()
        out[f"virial_{conv}"] = (xt * g).sum((1, 2)).detach().numpy()
    return out


def compare(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, float]:
    """W1 of the energies, KS of every observable (``a`` vs ``b``)."""
    row = {}
    for conv in PAIR_CONVENTIONS:
        key = f"energy_{conv}"
        (ua, _), (ub, _) = finite_energies(a[key]), finite_energies(b[key])
        row[f"w1_{key}"] = energy_w1(ua, ub)
    for key in a:
        row[f"ks_{key}"] = float(ks_2samp(a[key], b[key]).statistic)
    return row


def means(obs: dict[str, np.ndarray]) -> dict[str, float]:
    return {key: float(np.mean(v)) for key, v in obs.items()}


def conclude(best: dict, worst: dict, floor: dict, better: str, other: str, data: dict) -> str:
    """The conclusion paragraph, worded from the numbers (within the noise floor or not)."""
    keys = ("w1_energy_ordered", "ks_energy_ordered", "ks_pair_distance")
    within = all(best[k] <= 1.5 * floor[k] for k in keys)

    def trio(row):
        return ", ".join(f"{row[k]:.3g}" for k in keys)

    return (
        f"Conclusion: the reference files follow the **{better}** convention. Against them, "
        f"MCMC under that convention gives (energy W1, energy KS, pair-distance KS) = "
        f"({trio(best)}), {'within' if within else 'above'} the data-vs-data floor "
        f"({trio(floor)}, val vs test split); the {other} convention gives ({trio(worst)}). "
        f"Equipartition says the same without sampling: the reference's mean virial "
        f"x . grad U is {data['virial_ordered']:.1f} under the ordered and "
        f"{data['virial_unique']:.1f} under the unique convention, and {DOF} = (n-1)d is "
        f"expected under the generating one (our chains: {best['means']['virial_' + better]:.1f}"
        f" and {worst['means']['virial_' + other]:.1f} under their own conventions)."
    )


def figure(sets: dict[str, dict[str, np.ndarray]], path: Path) -> None:
    fig = Figure(figsize=(10.0, 6.5))
    panels = [
        ("energy_ordered", "energy, ordered pairs (LJ x2)"),
        ("energy_unique", "energy, unique pairs (LJ x1)"),
        ("pair_distance", "pair distance"),
        ("virial_ordered", "virial x . grad U (ordered)"),
    ]
    for i, (key, xlabel) in enumerate(panels):
        ax = fig.add_subplot(2, 2, i + 1)
        draw_histograms(ax, {name: obs[key] for name, obs in sets.items()}, bins=80,
                        xlabel=xlabel)  # fmt: skip
    fig.suptitle("LJ13: MALA under each pair convention vs Klein et al. (2023) test split")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def markdown(res: dict) -> str:
    lines = [
        "# LJ13: which Lennard-Jones convention generated the Klein et al. (2023) files",
        "",
        f"Made by: `{res['command']}` (from the repository root)",
        "",
        f"Reference: `{KLEIN}/test_split_LJ13-1000.npy` ({res['n_data']} rows, centred). "
        f"MCMC: `make_dataset('lj13', {res['n']}, seed={res['seed']}, burn_in="
        f"{res['burn_in']}, energy=partial(lj13_energy, pairs=...))` (MALA, "
        f"{res['mcmc']['ordered']['n_chains']} chains, thin {res['mcmc']['ordered']['thin']}). "
        "`ordered`: LJ summed over i != j (each pair twice); `unique`: over i < j once; "
        "the harmonic term is the same. Energies E_ord / E_uni are evaluated under the "
        "named convention for every set. Virial mean should be 36 = (n-1)d under the "
        "convention that generated the samples.",
        "",
        "| set vs reference | W1 E_ord | W1 E_uni | KS E_ord | KS pair dist | KS virial_ord "
        "| mean E_ord | mean E_uni | mean virial_ord | mean virial_uni |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in res["rows"].items():
        m = row["means"]
        lines.append(
            f"| {name} | {row['w1_energy_ordered']:.3f} | {row['w1_energy_unique']:.3f} "
            f"| {row['ks_energy_ordered']:.3f} | {row['ks_pair_distance']:.4f} "
            f"| {row['ks_virial_ordered']:.3f} | {m['energy_ordered']:.2f} "
            f"| {m['energy_unique']:.2f} | {m['virial_ordered']:.2f} | {m['virial_unique']:.2f} |"
        )
    lines += ["", res["conclusion"], ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="MCMC samples per convention")
    parser.add_argument("--burn-in", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = shared_data_dir()
    if folder is None:
        raise SystemExit("no ../shared/data folder found (set GRASSFLOW_SHARED_DATA)")
    test = np.load(folder / KLEIN / "test_split_LJ13-1000.npy")
    val = np.load(folder / KLEIN / "val_split_LJ13-1000.npy")

    sets, mcmc = {}, {}
    for conv in PAIR_CONVENTIONS:
        t0 = time.perf_counter()
        x, stats = make_dataset(
            "lj13", args.n, seed=args.seed, burn_in=args.burn_in, progress=False,
            energy=functools.partial(lj13_energy, pairs=conv),
        )  # fmt: skip
        stats["seconds"] = round(time.perf_counter() - t0, 1)
        mcmc[conv] = stats
        sets[f"MCMC {conv}"] = observables(x)
        print(f"{conv}: {stats}", flush=True)
    data = observables(test)
    half = len(test) // 2
    first, second = observables(test[:half]), observables(test[half:])

    rows = {name: {**compare(obs, data), "means": means(obs)} for name, obs in sets.items()}
    rows["data: test half 1 vs half 2 (floor, 5k vs 5k)"] = {
        **compare(first, second), "means": means(first)}  # fmt: skip
    val_obs = observables(val)
    rows["data: val vs test (floor, 10k vs 10k)"] = {
        **compare(val_obs, data), "means": means(val_obs)}  # fmt: skip
    rows["data: test split (with itself; means)"] = {**compare(data, data), "means": means(data)}

    floor = rows["data: val vs test (floor, 10k vs 10k)"]
    better = min(PAIR_CONVENTIONS, key=lambda c: rows[f"MCMC {c}"]["w1_energy_ordered"])
    other = next(c for c in PAIR_CONVENTIONS if c != better)
    conclusion = conclude(rows[f"MCMC {better}"], rows[f"MCMC {other}"], floor, better, other,
                          means(data))  # fmt: skip
    res = {
        "command": command(), "n": args.n, "burn_in": args.burn_in, "seed": args.seed,
        "n_data": len(test), "mcmc": mcmc, "rows": rows, "best_convention": better,
        "conclusion": conclusion,
    }  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lj_convention.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "lj_convention.md").write_text(markdown(res))
    figure({**sets, "data (test split)": data}, out / "lj_convention.png")
    print(markdown(res))


if __name__ == "__main__":
    main()
