"""``grassflow data make`` and ``data compare``: DW4/LJ13/LJ55 datasets by MCMC, and their check
against reference files; ``data conformers``: thermal (or minimized) conformers of a molecule
(RDKit)."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

from .options import PARTICLE_SYSTEMS

__all__ = ["DATA_SIZES", "add_commands", "conformers_path"]


def cmd_data_make(args) -> None:
    from ..data import mcmc
    from ..data.particle_files import SOURCE_FILES

    n = args.n or DATA_SIZES[args.system]
    # LJ55 has no paper protocol (`particle_files`): its file is read by vs-enf's splits
    name = SOURCE_FILES.get(("generated", args.system), (f"{args.system}.npy",))[0]
    path = Path(args.out) / name
    if path.exists() and not args.overwrite:
        raise FileExistsError(f"{path} exists; pass --overwrite to replace it")
    X, stats = mcmc.make_dataset(
        args.system, n, seed=args.seed, n_chains=args.chains, burn_in=args.burn_in,
        thin=args.thin, progress=not args.no_progress,
    )
    mcmc.save_dataset(X, path, overwrite=args.overwrite)
    print(f"wrote {path}: {X.shape[0]:,} {args.system.upper()} configurations "
          f"(MCMC acceptance {stats['acceptance']:.2f})")


def cmd_data_compare(args) -> None:
    from ..data import sampler_check

    result = sampler_check.compare(args.data_dir, args.reference, args.out, systems=args.system)
    print(sampler_check.markdown_table(result))


def conformers_path(smiles: str, minimized: bool = False) -> Path:
    """Where ``data conformers`` writes by default: ``data/<smiles>.npz``, the SMILES cut to
    letters, digits and ``_`` (``CC(=O)O`` -> ``CC_O_O``; ``molecule`` if nothing is left),
    long ones cut to 32 characters plus a hash of the whole; ``-minimized`` before the
    suffix for ``--minimized``."""
    name = re.sub(r"[^A-Za-z0-9]+", "_", smiles).strip("_") or "molecule"
    if len(name) > 40:
        name = f"{name[:32]}_{hashlib.sha1(smiles.encode()).hexdigest()[:8]}"
    return Path("data") / f"{name}{'-minimized' if minimized else ''}.npz"


def cmd_data_conformers(args) -> None:
    from ..data import conformers
    from ..data.molecule_files import ensemble_chemistry, molblock_charges, write_sdf

    out = Path(args.out) if args.out else conformers_path(args.smiles, args.minimized)
    if out.suffix.lower() not in (".npz", ".sdf"):
        raise ValueError(f"--out {out}: expected a .npz or .sdf file")
    given = {"temperature": args.temperature, "n_chains": args.chains,
             "burn_in": args.burn_in, "thin": args.thin}  # fmt: skip
    settings = {k: v for k, v in given.items() if v is not None}  # else the sampler's defaults
    if args.minimized and settings:
        flags = ", ".join("--" + k.replace("n_chains", "chains").replace("_", "-")
                          for k in settings)  # fmt: skip
        raise ValueError(f"{flags}: settings of the MCMC sampler, which --minimized does not run")
    if out.exists() and not args.overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it, or --out")
    what = "MMFF94-minimized ETKDG embeddings" if args.minimized else "MMFF94 MCMC"
    if not args.no_progress:  # the sampler has no progress bar: say what the wait is for
        print(f"making {args.n:,} conformers of {args.smiles} ({what}) ...", file=sys.stderr,
              flush=True)  # fmt: skip
    ens = conformers.minimized_ensemble(args.smiles, args.n, seed=args.seed) if args.minimized \
        else conformers.conformer_ensemble(args.smiles, args.n, seed=args.seed, **settings)
    if out.suffix.lower() == ".npz":
        conformers.save_ensemble(out, ens)
    else:
        orders, molblock = ensemble_chemistry(ens.smiles, ens.positions[0], ens.labels[0],
                                              ens.bonds)  # fmt: skip
        write_sdf(out, ens.positions, ens.labels[0], ens.bonds, orders, titles=ens.sources,
                  charges=molblock_charges(molblock))  # fmt: skip
    n_atoms, st = ens.positions.shape[1], ens.stats
    print(f"wrote {out}: {len(ens.positions):,} conformers of {args.smiles} ({n_atoms} atoms, "
          f"{len(ens.bonds)} bonds; " + (f"minimized, {st['converged']} of {st['embedded']} "
                                          "converged" if args.minimized else
                                          f"MALA acceptance {st['acceptance']:.2f}") + ", "
          f"{st['cpu_seconds']:.0f} CPU s); train on it: grassflow train --data {out} "
          f"--run-dir runs/{out.stem}")


# file sizes that `data make` writes by default: the largest paper training set + 2,000 held out
DATA_SIZES = {"dw4": 102_000, "lj13": 12_000, "lj55": 2_000}


def add_commands(sub) -> None:
    """Add ``data make``, ``data compare`` and ``data conformers`` to ``sub`` (an
    `options.Subcommands`)."""
    data = sub.add_subparsers(
        sub.add_parser("data", help="make or check DW4/LJ13/LJ55 datasets, or make conformers "
                                    "of a molecule"),  # fmt: skip
        dest="data_command", required=True,
    )
    p = data.add_parser("make", help="sample DW4, LJ13 or LJ55 by MCMC into OUT/<system>.npy")
    p.add_argument("system", choices=(*PARTICLE_SYSTEMS, "lj55"))
    p.add_argument("--n", type=int, help=f"configurations (default {DATA_SIZES})")
    p.add_argument("--out", default="data", help="directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chains", type=int, help="parallel MCMC chains (default per system)")
    p.add_argument("--burn-in", type=int, help="MALA steps before the first kept state")
    p.add_argument("--thin", type=int, help="MALA steps between kept states")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_data_make)

    p = data.add_parser("compare", help="energy and pair-distance histograms vs reference data")
    p.add_argument("--system", nargs="+", default=list(PARTICLE_SYSTEMS), choices=PARTICLE_SYSTEMS)
    p.add_argument("--data-dir", default="data", help="where `data make` wrote the files")
    p.add_argument("--reference", help="Klein-layout directory (default: the shared copies)")
    p.add_argument("--out", default="results/data")
    p.set_defaults(func=cmd_data_compare)

    p = data.add_parser("conformers", help="thermal (or --minimized) MMFF94 conformers of a "
                                           "molecule (RDKit), for `grassflow train "
                                           "--data`")  # fmt: skip
    p.add_argument("smiles", help="the molecule, e.g. CCO; hydrogens are added")
    p.add_argument("--n", type=int, required=True, help="conformers to draw")
    p.add_argument("--out", help="a .npz (bonds, orders, molblock, SMILES kept) or .sdf file "
                                 "(default: data/<smiles>.npz; data/<smiles>-minimized.npz "
                                 "with --minimized)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minimized", action="store_true",
                   help="ETKDG embeddings, each MMFF94-minimized (what a conformer search or a "
                        "user's SDF holds), instead of thermal MCMC samples")  # fmt: skip
    p.add_argument("--temperature", type=float, help="in K (default 300)")
    p.add_argument("--chains", type=int, help="independent MCMC chains (default 16)")
    p.add_argument("--burn-in", type=int, help="sweeps before the first kept state "
                                               "(default 2000)")  # fmt: skip
    p.add_argument("--thin", type=int, help="sweeps between kept states (default 100)")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--no-progress", action="store_true", help="no line before sampling")
    p.set_defaults(func=cmd_data_conformers)
