"""Thermal conformer ensembles of small molecules, generated with RDKit's MMFF94 force field.

`conformer_ensemble` turns a SMILES string into ``N`` conformers (explicit hydrogens)
drawn from the Boltzmann distribution ``exp(-E / kT)`` of the MMFF94 energy ``E`` (kcal/mol):
ETKDGv3 embeddings from one seed per chain, each MMFF-optimised, start ``C`` Markov chains.
Every sweep is one MALA step in Cartesian coordinates (bond lengths and angles fluctuate) and,
every ``torsion_every`` sweeps, a Metropolis rotation of one rotatable bond's smaller side by
a uniform angle (torsions hop between minima, which small Cartesian steps would almost never
do). Both kernels leave the target invariant; MALA step sizes adapt during burn-in only.
`grassflow.data.mcmc.sample_mcmc` is not reused: its energies are torch functions and it
has no torsion moves. `save_ensemble` / `load_ensemble` cache an ensemble as an
``.npz`` that `load_point_clouds` reads too, bonds, orders and molblock included.

RDKit is optional: ``pip install "grassflow[molecules]"``.

References:
    Halgren. Merck molecular force field I-V. J. Comput. Chem. 17 (1996).
    Wang, Witek, Landrum, Riniker. Improving conformer generation for small rings and
    macrocycles based on distance geometry and experimental torsional-angle preferences
    (ETKDGv3). J. Chem. Inf. Model. 60 (2020).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .cloud_chemistry import PointClouds

__all__ = ["KB_KCAL", "ConformerEnsemble", "cached_ensemble", "conformer_ensemble",
           "load_ensemble", "minimized_ensemble", "save_ensemble"]  # fmt: skip

KB_KCAL = 0.0019872043  # Boltzmann's constant in kcal/(mol K): kT = 0.596 kcal/mol at 300 K


@dataclass
class ConformerEnsemble(PointClouds):
    """`PointClouds` of one molecule, with its graph.

    Attributes:
        bonds: ``(B, 2)`` int64 atom index pairs ``i < j`` of the covalent bonds.
        smiles: the SMILES string the molecule was built from.
        stats: how the ensemble was made (sampler settings, acceptance rates, CPU seconds).
    """

    bonds: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))
    smiles: str = ""
    stats: dict = field(default_factory=dict)


def _rdkit():
    try:
        from rdkit import Chem
        from rdkit.Chem import AllChem
        from rdkit.Geometry import Point3D
    except ImportError as e:
        raise ImportError(
            'conformer ensembles need RDKit: pip install "grassflow[molecules]"'
        ) from e
    return Chem, AllChem, Point3D


def _rotatable(mol) -> list[tuple[int, int, np.ndarray]]:
    """``(j, k, side)`` per rotatable bond: acyclic, single, both ends bonded elsewhere too;
    ``side`` is the atoms on k's side (the smaller one), which a torsion move rotates."""
    n = mol.GetNumAtoms()
    out = []
    for b in mol.GetBonds():
        j, k = b.GetBeginAtomIdx(), b.GetEndAtomIdx()
        if b.IsInRing() or str(b.GetBondType()) != "SINGLE":
            continue
        if min(mol.GetAtomWithIdx(j).GetDegree(), mol.GetAtomWithIdx(k).GetDegree()) < 2:
            continue
        side, stack = {k}, [k]
        while stack:  # atoms reachable from k without crossing the bond
            for nb in mol.GetAtomWithIdx(stack.pop()).GetNeighbors():
                a = nb.GetIdx()
                if a not in side and a != j:
                    side.add(a)
                    stack.append(a)
        if 2 * len(side) > n:
            j, k, side = k, j, set(range(n)) - side
        out.append((j, k, np.array(sorted(side))))
    return out


def _rotate(x: np.ndarray, j: int, k: int, side: np.ndarray, angle: float) -> np.ndarray:
    """``x: (n, 3)`` with ``side`` rotated by ``angle`` about the axis ``x_j -> x_k``."""
    u = x[k] - x[j]
    u = u / np.linalg.norm(u)
    p = x[side] - x[k]
    c, s = math.cos(angle), math.sin(angle)
    y = x.copy()  # Rodrigues' formula
    y[side] = x[k] + p * c + np.cross(u, p) * s + np.outer(p @ u, u) * (1 - c)
    return y


def _embed(Chem, AllChem, mol, n_chains: int, seed: int) -> np.ndarray:
    """``(C, n, 3)`` MMFF-optimised ETKDGv3 embeddings, one random seed per chain."""
    starts = []
    for c in range(n_chains):
        params = AllChem.ETKDGv3()
        params.randomSeed = (seed * 7919 + c) % 2**31
        params.numThreads = 1
        m = Chem.Mol(mol)
        if AllChem.EmbedMolecule(m, params) != 0:
            continue
        AllChem.MMFFOptimizeMolecule(m, maxIters=2000)
        starts.append(m.GetConformer().GetPositions())
    if not starts:
        raise ValueError(f"RDKit could not embed {Chem.MolToSmiles(mol)!r} in 3-D")
    return np.stack([starts[c % len(starts)] for c in range(n_chains)])


def conformer_ensemble(
    smiles: str,
    n: int,
    *,
    seed: int = 0,
    temperature: float = 300.0,
    n_chains: int = 16,
    burn_in: int = 2000,
    thin: int = 100,
    torsion_every: int = 1,
    step: float = 2e-5,
) -> ConformerEnsemble:
    """``n`` thermal conformers of ``smiles`` (hydrogens explicit) at ``temperature``.

    The target is ``exp(-E(x) / kT)`` with ``E`` the MMFF94 energy (kcal/mol) and
    ``kT = KB_KCAL * temperature``. A sweep of each of the ``n_chains`` chains is one MALA
    step ``y = x - h grad U(x) + sqrt(2 h) xi`` on ``U = E / kT`` (``h`` in Å², adapted per
    chain towards acceptance 0.574 during ``burn_in``, then frozen) and, every
    ``torsion_every`` sweeps, a Metropolis torsion move. After burn-in every ``thin``-th state
    of every chain is kept. Deterministic given ``seed``. Measured with the defaults, one
    core: 3,000 conformers of alanine dipeptide (22 atoms) in 34-43 CPU s (MALA acceptance
    0.57, torsion moves 0.28, mostly methyl rotations; 0-22 sign changes of psi per chain);
    n-butane's C-C-C-C torsion is anti in 68 % of the states, ~55 anti/gauche changes per
    chain. Mean bond lengths stay at the MMFF minimum's, with ~0.03 Å thermal spread.

    What the chains cannot do at 300 K: invert a stereocentre or flip an amide. A SMILES
    without stereo marks gets each chain's enantiomer from its embedding (alanine dipeptide:
    about half L, half D), a racemic ensemble; the shape models are reflection invariant, so
    they see one shape either way. Slow torsions (the peptide's psi) mix over many sweeps, so
    their populations rest on the number of chains as much as on their length.

    Args:
        smiles: the molecule; one connected, neutral or charged species that MMFF94 types.
        n: conformers to return (>= 1).
        seed: seed of the embeddings and the chains.
        temperature: in K (> 0).
        n_chains: independent chains (>= 1).
        burn_in: sweeps before the first kept state (>= 0).
        thin: keep every ``thin``-th state after burn-in (>= 1).
        torsion_every: sweeps between torsion moves (>= 1).
        step: initial MALA step ``h`` in Å².

    Returns:
        `ConformerEnsemble`: positions ``(n, n_atoms, 3)`` Å (rows ordered by time,
        then chain), labels ``(n, n_atoms)`` atomic numbers, the bonds and ``stats`` with
        ``acceptance`` (MALA), ``torsion_acceptance``, ``step`` (mean final ``h``),
        ``rotatable_bonds``, ``mean_energy`` (kcal/mol, kept states) and ``cpu_seconds``.

    Raises:
        ImportError: RDKit is not installed.
        ValueError: bad settings, an unparsable SMILES, or a molecule MMFF94 cannot type.
    """
    for name, v, lo in (("n", n, 1), ("n_chains", n_chains, 1), ("burn_in", burn_in, 0),
                        ("thin", thin, 1), ("torsion_every", torsion_every, 1)):  # fmt: skip
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    if not (temperature > 0 and math.isfinite(temperature) and step > 0 and math.isfinite(step)):
        raise ValueError(f"temperature and step must be finite and > 0, got {temperature!r}, "
                         f"{step!r}")  # fmt: skip
    Chem, AllChem, Point3D = _rdkit()
    cpu0 = time.process_time()
    mol, props = _molecule(Chem, AllChem, smiles)
    rng = np.random.default_rng(seed)
    x = _embed(Chem, AllChem, mol, n_chains, seed)  # (C, n_atoms, 3)
    conf = Chem.Conformer(mol.GetNumAtoms())  # any geometry: the force field takes positions
    for i, p in enumerate(x[0]):
        conf.SetAtomPosition(i, Point3D(*p))
    mol.AddConformer(conf)
    ff = AllChem.MMFFGetMoleculeForceField(mol, props)
    beta = 1.0 / (KB_KCAL * temperature)
    U = lambda y: beta * ff.CalcEnergy(y.ravel().tolist())
    dU = lambda y: beta * np.asarray(ff.CalcGrad(y.ravel().tolist())).reshape(y.shape)
    torsions = _rotatable(mol)

    C = n_chains
    u = np.array([U(xc) for xc in x])
    g = np.stack([dU(xc) for xc in x])
    log_h = np.full(C, math.log(step))
    n_keep = -(-n // C)
    kept = np.empty((n_keep, *x.shape))
    energies = np.empty((n_keep, C))
    accepted, torsion_tried, torsion_accepted = 0, 0, 0
    for t in range(burn_in + n_keep * thin):
        h = np.exp(log_h)[:, None, None]
        xi = rng.standard_normal(x.shape)
        y = x - h * g + np.sqrt(2 * h) * xi
        u_y = np.array([U(yc) for yc in y])
        g_y = np.stack([dU(yc) for yc in y])
        # log q(x | y) - log q(y | x); the forward residual is sqrt(2 h) xi
        back = ((x - y + h * g_y) ** 2).sum((1, 2)) / (4 * h[:, 0, 0])
        log_ratio = u - u_y - back + 0.5 * (xi**2).sum((1, 2))
        log_ratio = np.where(np.isfinite(log_ratio), log_ratio, -np.inf)
        accept = np.log(rng.random(C)) < log_ratio
        x[accept], u[accept], g[accept] = y[accept], u_y[accept], g_y[accept]
        if t < burn_in:  # Robbins-Monro on log h, as in grassflow.data.mcmc
            log_h += (t + 1.0) ** -0.6 * (np.exp(np.minimum(log_ratio, 0.0)) - 0.574)
        else:
            accepted += int(accept.sum())
        if torsions and t % torsion_every == 0:
            which = rng.integers(len(torsions), size=C)
            angles = rng.uniform(-math.pi, math.pi, size=C)  # symmetric: plain Metropolis
            log_u = np.log(rng.random(C))
            for c in range(C):
                yc = _rotate(x[c], *torsions[which[c]], angles[c])
                uc = U(yc)
                ok = math.isfinite(uc) and log_u[c] < u[c] - uc
                if ok:
                    x[c], u[c], g[c] = yc, uc, dU(yc)
                if t >= burn_in:
                    torsion_tried += 1
                    torsion_accepted += ok
        if t >= burn_in and (t - burn_in + 1) % thin == 0:
            k = (t - burn_in + 1) // thin - 1
            kept[k], energies[k] = x, u / beta

    positions = kept.reshape(-1, *x.shape[1:])[:n]
    stats = {
        "smiles": smiles, "n": n, "seed": seed, "temperature": temperature,
        "n_chains": C, "burn_in": burn_in, "thin": thin, "torsion_every": torsion_every,
        "initial_step": step, "step": float(np.exp(log_h).mean()),
        "acceptance": accepted / (n_keep * thin * C),
        "torsion_acceptance": float(torsion_accepted / max(torsion_tried, 1)),
        "rotatable_bonds": len(torsions), "mean_energy": float(energies.mean()),
        "cpu_seconds": time.process_time() - cpu0,
    }  # fmt: skip
    sources = [f"{smiles}#chain{i % C}.state{i // C}" for i in range(len(positions))]
    return _ensemble(mol, smiles, positions, sources, stats)


def _molecule(Chem, AllChem, smiles: str):
    """The molecule of ``smiles`` with explicit hydrogens, and its MMFF94 properties."""
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"RDKit cannot parse the SMILES {smiles!r}")
    mol = Chem.AddHs(mol)
    props = AllChem.MMFFGetMoleculeProperties(mol)
    if props is None:
        raise ValueError(f"MMFF94 has no parameters for {smiles!r}")
    return mol, props


def _ensemble(mol, smiles: str, positions: np.ndarray, sources: list[str], stats: dict
              ) -> ConformerEnsemble:  # fmt: skip
    labels = np.array([a.GetAtomicNum() for a in mol.GetAtoms()], dtype=np.int64)
    bonds = np.array(sorted(tuple(sorted((b.GetBeginAtomIdx(), b.GetEndAtomIdx())))
                            for b in mol.GetBonds()), dtype=np.int64)  # fmt: skip
    return ConformerEnsemble(positions, np.broadcast_to(labels, positions.shape[:2]).copy(),
                             sources, [], bonds=bonds, smiles=smiles, stats=stats)  # fmt: skip


def minimized_ensemble(smiles: str, n: int, *, seed: int = 0, max_iters: int = 2000
                       ) -> ConformerEnsemble:  # fmt: skip
    """``n`` ETKDGv3 embeddings of ``smiles`` (hydrogens explicit), each MMFF94-minimized:
    the conformers a conformer search gives, or a user's SDF holds (local minima, several
    copies of each, both hands of a molecule without stereo marks), not a Boltzmann sample.

    Every embedding is kept (no RMSD pruning); those that fail to embed or whose
    minimization does not converge in ``max_iters`` steps are dropped and counted in
    ``stats`` (``embedded``, ``converged``, ``mean_energy``, ``min_energy`` in kcal/mol,
    ``cpu_seconds``). Deterministic given ``seed``. RDKit's embedder treats every
    ``randomSeed`` 0 alike and returns one conformer ``n`` times, so seed ``s`` is passed as
    ``s + 1``.

    Raises:
        ImportError: RDKit is not installed.
        ValueError: bad settings, an unparsable SMILES, a molecule MMFF94 cannot type, or
            no conformer that embedded and converged.
    """
    for name, v in (("n", n), ("max_iters", max_iters)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    Chem, AllChem, _ = _rdkit()
    cpu0 = time.process_time()
    mol, _ = _molecule(Chem, AllChem, smiles)
    params = AllChem.ETKDGv3()
    params.randomSeed = seed + 1
    params.pruneRmsThresh = -1.0
    params.numThreads = 1
    ids = list(AllChem.EmbedMultipleConfs(mol, n, params))
    results = AllChem.MMFFOptimizeMoleculeConfs(mol, numThreads=1, maxIters=max_iters)
    keep = [(i, e) for i, (status, e) in zip(ids, results) if status == 0]
    if not keep:
        raise ValueError(f"no conformer of {smiles!r} embedded and converged "
                         f"({len(ids)} of {n} embedded)")  # fmt: skip
    positions = np.stack([mol.GetConformer(i).GetPositions() for i, _ in keep])
    energies = np.array([e for _, e in keep])
    stats = {"smiles": smiles, "n": n, "seed": seed, "minimized": True, "max_iters": max_iters,
             "embedded": len(ids), "converged": len(keep), "mean_energy": float(energies.mean()),
             "min_energy": float(energies.min()), "cpu_seconds": time.process_time() - cpu0}
    sources = [f"{smiles}#embedding{i}" for i, _ in keep]
    return _ensemble(mol, smiles, positions, sources, stats)


def save_ensemble(path: str | os.PathLike, ens: ConformerEnsemble) -> Path:
    """Write ``ens`` as an ``.npz``: ``positions (N, n, 3)``, ``labels (n,)`` and the same
    ``atomic_numbers (n,)``, ``bonds (B, 2)``, ``bond_orders (B,)``, ``smiles``, ``molblock``
    (of the first conformer) and ``stats`` (JSON); parent folders are made. Orders and
    molblock missing from ``ens`` are made from its SMILES (RDKit), or left out of the file
    without SMILES. The file is also a valid input of ``grassflow train --data``."""
    from .molecule_files import bond_table, ensemble_chemistry

    path = Path(path)
    if path.suffix != ".npz":
        raise ValueError(f"{path}: an ensemble is saved as .npz")
    bonds, orders = bond_table(ens.bonds, ens.positions.shape[1], str(path), ens.bond_orders)
    molblock, chem = ens.molblock, {}
    if (orders is None or molblock is None) and ens.smiles:
        try:  # orders in the canonical order of `bonds`
            made = ensemble_chemistry(ens.smiles, ens.positions[0], ens.labels[0], bonds)
            orders, molblock = made[0] if orders is None else orders, molblock or made[1]
        except ImportError:  # without RDKit the file keeps the graph, not the orders
            pass
    if orders is not None:
        chem["bond_orders"] = np.asarray(orders, dtype=np.float64)
    if molblock is not None:
        chem["molblock"] = np.array(molblock)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")  # no half-written cache if interrupted
    np.savez(tmp, positions=ens.positions, labels=ens.labels[0], atomic_numbers=ens.labels[0],
             bonds=bonds, smiles=np.array(ens.smiles),
             stats=np.array(json.dumps(ens.stats)), **chem)  # fmt: skip
    tmp.replace(path)
    return path


def load_ensemble(path: str | os.PathLike) -> ConformerEnsemble:
    """The ensemble written by `save_ensemble` (files of earlier versions, without
    ``bond_orders`` and ``molblock``, load with those None)."""
    path = Path(path)
    with np.load(path, allow_pickle=False) as z:
        missing = {"positions", "labels", "bonds", "smiles"} - set(z.files)
        if missing:
            raise ValueError(f"{path}: not a conformer ensemble, missing {sorted(missing)}")
        P, labels, bonds = z["positions"], z["labels"], z["bonds"].astype(np.int64)
        smiles = str(z["smiles"])
        stats = json.loads(str(z["stats"])) if "stats" in z.files else {}
        orders = z["bond_orders"].astype(np.float64) if "bond_orders" in z.files else None
        molblock = str(z["molblock"]) if "molblock" in z.files else None
    if P.ndim != 3 or labels.shape != P.shape[1:2] or bonds.ndim != 2 or bonds.shape[1] != 2:
        raise ValueError(f"{path}: positions {P.shape}, labels {labels.shape} and bonds "
                         f"{bonds.shape} do not fit (N, n, 3), (n,), (B, 2)")  # fmt: skip
    return ConformerEnsemble(P, np.broadcast_to(labels, P.shape[:2]).copy(),
                             [f"{path.name}[{i}]" for i in range(len(P))], [], bonds=bonds,
                             smiles=smiles, stats=stats, labels_from=f"{path}:labels",
                             bond_orders=orders, molblock=molblock)  # fmt: skip


def cached_ensemble(path: str | os.PathLike, smiles: str, n: int, **kwargs) -> ConformerEnsemble:
    """`conformer_ensemble` ``(smiles, n, **kwargs)``, read from ``path`` (``.npz``) if
    it was saved there before, else generated and saved there.

    Raises:
        ValueError: ``path`` holds an ensemble made with other arguments (it is not replaced).
    """
    path = Path(path)
    if not path.exists():
        ens = conformer_ensemble(smiles, n, **kwargs)
        save_ensemble(path, ens)
        return ens
    ens = load_ensemble(path)
    asked = {"smiles": smiles, "n": n, **kwargs}
    diff = {k: (ens.stats.get(k), v) for k, v in asked.items() if ens.stats.get(k) != v}
    if diff:
        raise ValueError(f"{path} holds another ensemble (saved, asked: {diff}); delete it or "
                         "use another path")
    return ens

