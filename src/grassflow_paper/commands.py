"""``grassflow reproduce ...``: the paper's experiments and the comparisons with E-NF and the
EFM baseline. The library's CLI finds this command group through the entry point
``grassflow.commands: reproduce`` (``pyproject.toml``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from grassflow.cli.options import (
    OBJECTIVE_NAMES,
    PARTICLE_SYSTEMS,
    add_minutes_option,
    add_particle_data_options,
    add_texture_preset,
    add_train_options,
    apply_overrides,
)

__all__ = ["add_commands"]


def cmd_reproduce_textures(args) -> None:
    from grassflow.tasks import texture_runs as tx

    from . import textures_figures as fig

    base = tx.PRESETS[args.preset]
    if args.preset == "paper":
        base = dataclasses.replace(base, train=tx.PAPER_TEXTURES.replace(
            batch_size=200, val_every=500, checkpoint_every=250))  # fmt: skip
    base = apply_overrides(base, args)
    rows = fig.reproduce(
        args.out,
        args.runs,
        minutes=args.minutes,
        datasets=tuple(args.datasets),
        base=base,
        progress=not args.no_progress,
        force=args.force,
    )
    for row in rows:
        print(tx.eval_summary(row))
    print((Path(args.out) / "textures.md").read_text())


def cmd_reproduce_fm_vs_mle(args) -> None:
    from . import fm_vs_mle

    result = fm_vs_mle.compare(
        args.out, args.runs, tuple(args.datasets), args.minutes,
        objectives=tuple(args.objectives), progress=not args.no_progress, force=args.force,
    )
    print(fm_vs_mle.markdown_table(result))


def cmd_reproduce_table1(args) -> None:
    from . import table1

    sizes = None if args.sizes is None else {s: tuple(args.sizes) for s in args.system}
    result = table1.reproduce(
        args.out, args.runs, systems=tuple(args.system), protocols=tuple(args.protocol),
        sizes=sizes, seeds=tuple(args.seeds), minutes=args.minutes,
        objective=args.objective, prior=args.prior, source=args.source, data_dir=args.data_dir,
        progress=not args.no_progress, force=args.force,
    )
    print(table1.markdown_table(result))


def cmd_reproduce_table2(args) -> None:
    from . import qm9_report
    from . import qm9_runs as qm9

    exp = qm9.QM9Experiment(
        objective=args.objective, prior=args.prior, potential=args.potential,
        flow_minutes=args.minutes, scale_minutes=args.scale_minutes, cache_dir=args.cache_dir,
        gram=args.gram, gram_components=args.gram_components, layers=args.layers,
        n_val=args.n_val, val_every_minutes=args.val_every_minutes, n_test=args.n_test,
        atol=args.tol, rtol=args.tol,
    )  # fmt: skip
    result = qm9_report.reproduce(args.out, args.runs, exp, progress=not args.no_progress,
                                  force=args.force, summary_dir=args.summary or None)  # fmt: skip
    print(qm9_report.markdown_table(result))


_EFM_OPTIONS = ("hidden", "layers", "lr", "batch_size", "coupling", "geometry", "dtype",
                "n_val", "chunk_size", "atom_types")


def cmd_reproduce_vs_enf(args) -> None:
    from . import efm, vs_enf

    options = {k: getattr(args, k) for k in _EFM_OPTIONS if getattr(args, k) is not None}
    if args.model == "equivariant-cnf":
        if args.val_every_minutes is not None:  # inf: at the end only
            every = args.val_every_minutes
            options["val_every_minutes"] = None if every == float("inf") else every
        base = efm.EFMExperiment(tol=args.tol, data_dir=args.data_dir, **options)
    elif options:
        raise SystemExit(f"--{'/--'.join(k.replace('_', '-') for k in options)}: options of "
                         "--model equivariant-cnf")  # fmt: skip
    else:
        base = vs_enf.ENFExperiment(potential=args.potential, objective=args.objective,
                                    tol=args.tol, data_dir=args.data_dir,
                                    gram_components=args.gram_components, gram=args.gram,
                                    gram_fraction=args.gram_fraction,
                                    gram_max_minutes=args.gram_max_minutes,
                                    n_val_flow=args.n_val_flow,
                                    val_every_minutes=1.0 if args.val_every_minutes is None
                                    else args.val_every_minutes)  # fmt: skip
    vs_enf.sweep(
        tuple(args.systems), tuple(args.n_train), tuple(args.seeds), args.minutes, args.runs,
        args.out, base=base, progress=not args.no_progress,
        force=args.force, n_test=args.n_test,
    )  # fmt: skip
    for system in args.systems:
        print((Path(args.out) / "vs_enf" / f"{system}.md").read_text())


def add_commands(sub) -> None:
    """Add ``reproduce`` and its experiments to ``sub`` (a
    `grassflow.cli.options.Subcommands`)."""
    from grassflow.data.textures import TEXTURES

    from .two_part import GRAMS, POTENTIALS

    rep = sub.add_subparsers(
        sub.add_parser("reproduce", help="regenerate a paper experiment"),
        dest="experiment", required=True,
    )
    p = rep.add_parser("textures", help="paper §5.1: five textures, Figures 3-4, NLL table")
    p.add_argument("--out", default="results/textures", help="figures and tables")
    p.add_argument("--runs", default="runs/textures", help="run directories (checkpoints)")
    add_minutes_option(p, 10.0, old=("--budget-minutes-per-dataset",),
                       what="training CPU minutes of each dataset's run")
    p.add_argument("--datasets", nargs="+", default=list(TEXTURES), choices=TEXTURES)
    add_texture_preset(p)
    add_train_options(p, run_minutes=False)
    p.add_argument("--force", action="store_true",
                   help="retrain run directories that hold another preset or other data "
                        "(deletes them) instead of stopping with an error")
    p.set_defaults(func=cmd_reproduce_textures)

    p = rep.add_parser("fm-vs-mle", help="test NLL against training CPU time, MLE vs flow matching")
    p.add_argument("--out", default="results/fm_vs_mle")
    p.add_argument("--runs", default="runs/fm_vs_mle")
    add_minutes_option(p, 10.0, old=("--budget-minutes-per-dataset",),
                       what="training CPU minutes of each objective's and dataset's run")
    p.add_argument("--datasets", nargs="+", default=list(TEXTURES), choices=TEXTURES)
    p.add_argument("--objectives", nargs="+", default=["mle", "fm"], choices=OBJECTIVE_NAMES,
                   help="objectives to compare (MLE is always the reference)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--force", action="store_true",
                   help="retrain run directories that hold another preset or other data "
                        "(deletes them) instead of stopping with an error")
    p.set_defaults(func=cmd_reproduce_fm_vs_mle)

    p = rep.add_parser("table1", help="paper §5.2: DW4/LJ13 test NLL vs training size")
    p.add_argument("--system", nargs="+", default=list(PARTICLE_SYSTEMS), choices=PARTICLE_SYSTEMS)
    p.add_argument("--protocol", nargs="+", default=["com-free", "paper"],
                   choices=("com-free", "paper"))
    p.add_argument("--sizes", nargs="+", type=int, help="training sizes (default: the paper's)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    add_minutes_option(p, 1.0, old=("--budget",))
    p.add_argument("--objective", default="fm", choices=OBJECTIVE_NAMES)
    p.add_argument("--prior", default="uniform", choices=("gaussian", "uniform"),
                   help="base distribution (the paper's is gaussian; see the README)")
    add_particle_data_options(p)
    p.add_argument("--out", default="results/table1")
    p.add_argument("--runs", default="runs/table1")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--force", action="store_true",
                   help="retrain run directories that hold another preset or other data "
                        "(deletes them) instead of stopping with an error")
    p.set_defaults(func=cmd_reproduce_table1)

    p = rep.add_parser("table2", help="paper §5.3: QM9 positional, exact NLL and JSD")
    p.add_argument("--objective", default="fm", choices=OBJECTIVE_NAMES)
    p.add_argument("--prior", default="uniform", choices=("gaussian", "uniform"))
    p.add_argument("--potential", default="mlp", choices=POTENTIALS,
                   help="the GrCNF's: mlp (the paper's), graph (invariant to relabelling the "
                        "atoms) or egnn (an EGNN's velocity; both validate far slower)")
    p.add_argument("--gram", default="wishart", choices=tuple(GRAMS),
                   help="the two-part model's density of S given the span")
    p.add_argument("--gram-components", type=int, default=1)
    p.add_argument("--layers", type=int, help="the graph potential's or EGNN's layers")
    p.add_argument("--n-val", type=int, default=500,
                   help="validation molecules of the GrCNF's exact NLL")
    p.add_argument("--val-every-minutes", type=float, default=0.5)
    p.add_argument("--n-test", type=int,
                   help="score a seeded random N test molecules (default: all 1,813)")
    p.add_argument("--tol", type=float, default=1e-5,
                   help="ODE atol = rtol of the two-part model's training and evaluation")
    add_minutes_option(p, 5.0, old=("--budget",), what="the GrCNF's training CPU minutes")
    add_minutes_option(p, 1.0, old=("--scale-budget",), dest="scale_minutes",
                       flag="--scale-minutes", what="training CPU minutes of each of the Gram "
                       "density and the decoder")  # fmt: skip
    p.add_argument("--cache-dir", default="data", help="where the processed QM9 split is cached")
    p.add_argument("--out", default="results/table2")
    p.add_argument("--summary", default="results",
                   help="merge the exact model's row into SUMMARY/vs_enf.json and "
                        "SUMMARY/vs_enf/qm9.md ('' to skip)")  # fmt: skip
    p.add_argument("--runs", default="runs/table2")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--force", action="store_true",
                   help="retrain run directories that hold another preset or other data "
                        "(deletes them) instead of stopping with an error")
    p.set_defaults(func=cmd_reproduce_table2)

    p = rep.add_parser("vs-enf", help="DW4/LJ13 exact Cartesian NLL on E-NF's split and budget")
    p.add_argument("--systems", nargs="+", default=list(PARTICLE_SYSTEMS),
                   choices=(*PARTICLE_SYSTEMS, "qm9", "lj55"),
                   help="qm9, lj55: --model equivariant-cnf only (lj55 reads data/lj55.npy "
                        "from `grassflow data make lj55`; --data-dir to change)")
    p.add_argument("--n-train", nargs="+", type=int, default=[1000], help="training sizes")
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    add_minutes_option(p, 7.0, what="training CPU minutes of each run, both parts")
    p.add_argument("--model", default="shapeflow", choices=("shapeflow", "equivariant-cnf"),
                   help="the two-part model (grassflow_paper.two_part, the diagnosis rows), "
                        "or the library's shape model (grassflow.flows.ShapeFlow; with "
                        "--geometry cartesian, equivariant flow matching, EFM)")  # fmt: skip
    p.add_argument("--potential", default="graph", choices=POTENTIALS)
    p.add_argument("--objective", default="fm", choices=OBJECTIVE_NAMES)
    p.add_argument("--tol", type=float, default=1e-4,
                   help="ODE atol = rtol of validation and of the test NLL (E-NF's: 1e-4)")
    efm_group = p.add_argument_group("equivariant-cnf", "the baseline's settings (defaults: "
                                     "EGNN 32 x 3, lr 1e-3, batch 64, equivariant-ot, float32)")
    efm_group.add_argument("--hidden", type=int)
    efm_group.add_argument("--layers", type=int)
    efm_group.add_argument("--lr", type=float)
    efm_group.add_argument("--batch-size", type=int)
    efm_group.add_argument("--coupling", choices=("independent", "ot", "equivariant-ot"))
    efm_group.add_argument("--geometry", choices=("cartesian", "grassmann"),
                           help="of the flow-matching paths: straight lines between aligned "
                                "clouds (EFM's) or the Grassmann bundle (span x metric)")
    efm_group.add_argument("--dtype", choices=("float32", "float64"), help="of training")
    efm_group.add_argument("--atom-types", action="store_true", default=None,
                           help="QM9: each molecule's atom types as node features; the model "
                                "is then p(x | types), and the rows add a bound of the "
                                "positional NLL (grassflow_paper.efm)")  # fmt: skip
    efm_group.add_argument("--n-val", type=int,
                           help="validation configurations of the exact NLL (default 100; "
                                "LJ55: 1, since one costs ~26 CPU s)")  # fmt: skip
    efm_group.add_argument("--chunk-size", type=int,
                           help="configurations per exact-likelihood ODE solve (default 8; "
                                "LJ55: 1, about 7.5 GB each)")  # fmt: skip
    p.add_argument("--gram", default="wishart", choices=tuple(GRAMS),
                   help="density of S given the span (the two-part model's gram)")
    p.add_argument("--gram-components", type=int, default=1,
                   help="mixture components of the Gram density")
    p.add_argument("--gram-fraction", type=float, default=0.1,
                   help="share of --minutes for the Gram density (capped by the next)")
    p.add_argument("--gram-max-minutes", type=float, default=1.0)
    p.add_argument("--n-val-flow", type=int, default=200,
                   help="validation configurations of the flow's exact NLL (selects the best "
                        "checkpoint; not counted in the budget)")  # fmt: skip
    p.add_argument("--val-every-minutes", type=float,
                   help="training CPU minutes between validations (default: 1 for the "
                        "two-part model, 2 for equivariant-cnf; inf: at the end only)")
    p.add_argument("--data-dir", help="the Klein et al. files (default: "
                                      "../shared/data/alt_klein2023_from_DEM)")  # fmt: skip
    p.add_argument("--runs", default="runs/vs_enf")
    p.add_argument("--n-test", type=int, help="score a seeded random subset of this many test "
                   "rows (default all; the baseline's exact QM9 NLL costs ~2 CPU s a molecule)")
    p.add_argument("--out", default="results", help="writes vs_enf.json and vs_enf/<system>.md")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--force", action="store_true",
                   help="retrain run directories that hold another preset or other data "
                        "(deletes them) instead of stopping with an error")
    p.set_defaults(func=cmd_reproduce_vs_enf)
