"""``grassflow data make`` and ``data compare``: DW4/LJ13/LJ55 datasets by MCMC, and their check
against reference files."""

from __future__ import annotations

from pathlib import Path

from .options import PARTICLE_SYSTEMS

__all__ = ["DATA_SIZES", "add_commands"]


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


# file sizes that `data make` writes by default: the largest paper training set + 2,000 held out
DATA_SIZES = {"dw4": 102_000, "lj13": 12_000, "lj55": 2_000}


def add_commands(sub) -> None:
    """Add ``data make`` and ``data compare`` to ``sub`` (an `options.Subcommands`)."""
    data = sub.add_subparsers(
        sub.add_parser("data", help="make or check DW4/LJ13/LJ55 datasets"),
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
