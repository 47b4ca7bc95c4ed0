"""Boltzmann reweighting of a molecule run's samples: MMFF94 importance weights and their ESS.

A run of ``grassflow train --data molecule.npz`` models the conformers of one molecule with
a density ``q`` that it evaluates exactly on the ``(n - 1) 3`` centre-of-mass-free
coordinates (`sample_with_log_prob`). Data made by ``grassflow data conformers`` are Boltzmann
samples of the MMFF94 energy ``E`` at a temperature ``T`` (saved in the ensemble's
``stats``), so each sample ``x_n`` gets the self-normalized weight
``w_n ~ exp(-E(x_n) / kT) / q(x_n)`` (`grassflow.metrics.boltzmann.boltzmann_weights`;
``E`` is invariant to translations, so the CoM-free density is the right one), and weighted
averages over the samples estimate averages over the Boltzmann distribution. The Kish ESS
fraction says how many of the ``n`` samples that is worth.

``grassflow sample RUN --n N --reweight mmff [--temperature K]`` lands here (`reweight`).
RDKit is needed: ``pip install "grassflow[molecules]"``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from ..data.conformers import KB_KCAL
from ..data.molecule_files import molblock_charges
from ..metrics.boltzmann import boltzmann_weights, ess_fraction
from ..metrics.chemistry import mmff_energies, template_from_molblock, torsion_quads
from ..training.progress import Progress
from .registry import kind_of
from .shape_runs import MOLBLOCK, load_clouds, load_run, model_name, save_sampled_clouds

__all__ = ["ENERGIES", "data_temperature", "reweight", "reweight_line"]

ENERGIES = ("mmff",)
"""The energies `reweight` weighs samples by: MMFF94 (RDKit)."""


def data_temperature(data: str | Path) -> float | None:
    """The temperature (K) of the Boltzmann samples in ``data``: an ``.npz`` written by
    `grassflow.data.conformers.save_ensemble` keeps it in its ``stats`` (JSON); None for any
    other file, or one without it."""
    path = Path(data)
    if path.suffix != ".npz" or not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as z:
        if "stats" not in z.files:
            return None
        stats = json.loads(str(z["stats"]))
    T = stats.get("temperature") if isinstance(stats, dict) else None
    return None if T is None else float(T)


def _template(run_dir: Path, labels):
    """The RDKit molecule of the run's ``molecule.mol``, checked against its labels."""
    path = run_dir / MOLBLOCK
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: MMFF94 reweighting needs the molecule's mol block, which "
            "`grassflow train --data` saves there when the data have one (an .sdf, or an "
            ".npz from `grassflow data conformers`)")  # fmt: skip
    try:
        import rdkit  # noqa: F401  (the optional dependency: say which, before any work)
    except ImportError as e:
        raise ImportError('MMFF94 reweighting needs RDKit: pip install "grassflow[molecules]"'
                          ) from e  # fmt: skip
    mol = template_from_molblock(path.read_text())
    z = [a.GetAtomicNum() for a in mol.GetAtoms()]
    if labels is not None and tuple(z) != tuple(labels):
        raise ValueError(f"{path}: its atoms {z} are not the run's labels {list(labels)}")
    return mol


def _energies(mol, X: np.ndarray) -> np.ndarray:
    """MMFF94 energies ``(N,)`` of ``X: (N, n, 3)``; NaN for a cloud with non-finite
    coordinates (which `mmff_energies` refuses), so that it gets weight 0, not an error."""
    ok = np.isfinite(X).all(axis=(1, 2))
    E = np.full(len(X), np.nan)
    if ok.any():
        E[ok] = mmff_energies(mol, X[ok])
    return E


def reweight(
    run_dir: str | Path,
    n: int,
    seed: int = 0,
    temperature: float | None = None,
    out: str | Path | None = None,
    progress: bool = False,
) -> dict:
    """Draw ``n`` samples of a molecule run and weigh them to the MMFF94 Boltzmann target.

    The samples and their exact ``log_q`` come from the run's model (`load_run`,
    ``sample_with_log_prob``, seeded by ``seed``); their MMFF94 energies (kcal/mol, no
    optimisation) from the template in ``run_dir/molecule.mol``; ``kT = KB_KCAL * T``. Written:

    - the samples, as ``grassflow sample`` writes them (``<out>.npy``, ``<stem>_Z.npy``,
      ``.xyz``, ``.sdf`` with the bonds);
    - ``<stem>_weights.npy``: the normalized weights ``(n,)`` (0 for a failed energy);
    - ``<stem>_weights.npz``: ``weights``, ``energies`` (kcal/mol, ``+inf``/NaN where MMFF
      failed), ``log_q`` (nats), ``temperature`` (K) and ``kT`` (kcal/mol);
    - ``<stem>_energies.png`` and ``<stem>_torsions.png`` (when the molecule has rotatable
      bonds): raw and reweighted histograms beside the run's test conformers.

    Args:
        run_dir: a run of ``grassflow train --data`` (kind ``shapes``) with ``molecule.mol``.
        n: samples to draw, >= 2.
        seed: of the samples.
        temperature: K; default the data's (`data_temperature`). Given, it wins.
        out: the samples' ``.npy`` (another suffix is replaced); default
            ``run_dir/samples_reweighted.npy``.
        progress: show the sampling and the energies on a progress line.

    Returns:
        ``n``, ``seed``, ``temperature``, ``temperature_from`` (``"argument"`` or
        ``"data"``), ``data_temperature`` (the data's, or None), ``kT``, ``ess_fraction``
        (Kish, over all ``n``), ``ess`` (``n`` times it),
        ``n_zero_weight`` (failed energies), ``mean_energy_raw`` (over the finite energies),
        ``mean_energy_reweighted``, ``mean_energy_test`` and ``n_test`` (the test
        conformers'), ``max_weight``, ``written`` (what the samples' writer said) and
        ``files`` (the weights and pictures).

    Raises:
        ValueError: a run of another kind, ``n < 2``, no temperature, or atoms that are not
            the run's.
        FileNotFoundError: no ``molecule.mol`` in the run.
        ImportError: RDKit is missing.
    """
    run_dir = Path(run_dir)
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    kind = kind_of(run_dir)
    if kind != "shapes":
        raise ValueError(f"{run_dir} is a run of kind {kind!r}: --reweight weighs the "
                         "samples of molecule runs of `grassflow train --data` (kind "
                         "'shapes')")  # fmt: skip
    exp, model = load_run(run_dir)
    # the cheap checks first: no minutes of sampling before an error that needs none
    mol = _template(run_dir, exp.labels)
    found = data_temperature(exp.data)
    T = found if temperature is None else float(temperature)
    if T is None:
        raise ValueError(f"no temperature: {exp.data} does not record one (thermal ensembles "
                         "of `grassflow data conformers` do, --minimized ones do not); pass "
                         "--temperature K")  # fmt: skip
    if not (math.isfinite(T) and T > 0):
        raise ValueError(f"the temperature must be finite and > 0 K, got {T!r}")
    kT = KB_KCAL * T

    display = Progress(run_dir.name, enabled=progress)
    display.start(f"sampling {n} clouds with log q", 1)
    with torch.no_grad(), display.blocking("solving"):
        X, log_q = model.sample_with_log_prob(n, generator=torch.Generator().manual_seed(seed))
    X = X.detach().cpu().double().numpy()
    log_q = log_q.detach().cpu().double().numpy()
    with display.blocking(f"MMFF94 energies of {n} samples"):
        E = _energies(mol, X)
        test = load_clouds(exp)["test"].numpy()
        E_test = _energies(mol, test)
    display.close()
    w, n_zero = boltzmann_weights(E, log_q, kT)
    ok = np.isfinite(E)

    out = run_dir / "samples_reweighted.npy" if out is None else Path(out).with_suffix(".npy")
    out.parent.mkdir(parents=True, exist_ok=True)
    mol_path = run_dir / MOLBLOCK
    comment = f"grassflow {model_name(exp)} sample, seed {seed}, run {run_dir}"
    written = save_sampled_clouds(
        X, out, exp.labels, comment.replace("\n", " "), bonds=exp.bonds,
        bond_orders=exp.bond_orders, charges=molblock_charges(mol_path.read_text()))  # fmt: skip
    stem = out.with_suffix("")
    files = [Path(f"{stem}_weights.npy"), Path(f"{stem}_weights.npz")]
    np.save(files[0], w)
    np.savez(files[1], weights=w, energies=E, log_q=log_q, temperature=T, kT=kT)
    files += _pictures(stem, mol, X, E, w, test, E_test)
    ess = ess_fraction(w)
    finite_test = E_test[np.isfinite(E_test)]
    return {
        "n": n, "seed": seed, "temperature": T,
        "temperature_from": "data" if temperature is None else "argument",
        "data_temperature": found, "kT": kT,
        "ess_fraction": ess, "ess": ess * n, "n_zero_weight": n_zero,
        "mean_energy_raw": float(E[ok].mean()),
        "mean_energy_reweighted": float(np.dot(w[ok], E[ok])),
        "mean_energy_test": float(finite_test.mean()) if finite_test.size else math.nan,
        "n_test": len(test), "max_weight": float(w.max()), "written": written,
        "files": [str(f) for f in files],
    }  # fmt: skip


def _pictures(stem: Path, mol, X, E, w, test, E_test) -> list[Path]:
    """Energy and torsion histograms, raw and reweighted, beside the test conformers'."""
    from ..viz.conformer_plots import plot_conformer_energies, plot_torsions

    paths = []
    ref = np.isfinite(E_test)
    if ref.any():
        paths.append(plot_conformer_energies(E, E_test[ref], f"{stem}_energies.png",
                                             labels=("samples", "test conformers"),
                                             weights=w))  # fmt: skip
    quads = torsion_quads(mol)
    ok = np.isfinite(X).all(axis=(1, 2))  # dihedrals refuse NaN; such samples weigh 0
    if len(quads) and ok.any() and w[ok].sum() > 0:
        paths.append(plot_torsions(X[ok], test, quads, f"{stem}_torsions.png", weights=w[ok],
                                   labels=("samples", "test conformers")))  # fmt: skip
    return paths


def reweight_line(r: dict) -> str:
    """`reweight`'s result in one line: the ESS, the failed energies and the mean energies."""
    where = "the data's" if r["temperature_from"] == "data" else "--temperature"
    return (f"MMFF94 reweighting at {r['temperature']:g} K ({where}): ESS {r['ess']:.1f} of "
            f"{r['n']} samples ({100 * r['ess_fraction']:.2f} %), {r['n_zero_weight']} with "
            f"zero weight (failed energies); mean energy raw {r['mean_energy_raw']:.2f}, "
            f"reweighted {r['mean_energy_reweighted']:.2f}, test conformers "
            f"{r['mean_energy_test']:.2f} kcal/mol")  # fmt: skip
