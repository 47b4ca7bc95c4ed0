"""``grassflow demo``, ``train``, ``eval``, ``sample`` and ``plot``."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from .options import (
    PARTICLE_SYSTEMS,
    add_particle_data_options,
    add_texture_preset,
    add_train_options,
    apply_overrides,
)

__all__ = ["add_commands"]


def cmd_demo(args) -> None:
    import torch

    from ..tasks import texture_runs as tx

    base = tx.DEMO_PAPER if args.preset == "paper" else tx.DEMO
    exp = apply_overrides(dataclasses.replace(base, dataset=args.dataset), args)
    exp.train = exp.train.replace(charge_validation=True)
    out = Path(args.out)
    resume = (out / "last.pt").exists()
    if resume:
        print(f"resuming the demo run in {out} (delete it to start over)")
    print(f"method: GrCNF, {tx.describe(exp)}")
    budget = exp.train.budget_minutes or exp.train.total_budget_minutes
    limit = "" if budget is None else f" or {budget:g} {exp.train.clock} min, whichever first"
    print(f"training GrCNF on '{exp.dataset}' (Gr(1,3)) for {exp.train.iterations:,} iterations"
          f"{limit}, {torch.get_num_threads()} thread(s); run directory {out}")
    tx.run(exp, out, resume=resume, progress=not args.no_progress)
    result = tx.evaluate(out)
    paths = tx.plot_run(out)
    paths.append(tx.plot_prior(out / "prior.png"))
    print(tx.eval_summary(result))
    print(f"[{result['dataset']}] trained with {exp.objective} ({tx.describe(exp)})")
    print("pictures:", ", ".join(str(p) for p in paths))


def _particle_experiment(args):
    from ..tasks import particle_runs as px

    if args.prior == "harmonic":
        raise ValueError("--prior harmonic needs a molecule's bond graph: it is for --data "
                         "(DW4 / LJ13 take gaussian or uniform)")
    exp = px.ParticleExperiment(
        system=args.dataset, protocol=args.protocol, n_train=args.n_train, source=args.source,
        data_dir=args.data_dir, objective=args.objective or "mle", prior=args.prior or "gaussian",
    )
    return apply_overrides(exp, args)


def _shape_experiment(args):
    from ..tasks import shape_runs as shapes

    if args.objective is not None:  # of the GrCNF runs (and of the removed two-part ShapeFlow)
        raise ValueError("--objective does not apply to --data: its models train by their "
                         "own objective, InternalFlow (a molecule's default) by maximum "
                         "likelihood, ShapeFlow (--geometry cartesian or grassmann) by flow "
                         "matching (the two-part ShapeFlow that took --objective was removed "
                         "in issue 34; the last commit that has it is 3531f93)")  # fmt: skip
    if args.prior == "uniform":
        raise ValueError("--prior uniform is of the DW4 / LJ13 GrCNF runs; --data takes "
                         "gaussian or harmonic (the bond graph's, the default for a molecule)")
    flow = {"total_budget_minutes": args.minutes, "budget_minutes": args.session_minutes,
            "iterations": args.iterations, "clock": args.clock, "batch_size": args.batch_size,
            "lr": args.lr, "grad_clip": args.grad_clip, "seed": args.seed,
            "device": args.device, "ema_decay": args.ema, "dtype": args.dtype}  # fmt: skip
    exp = shapes.ShapeExperiment(
        data=args.data, key=args.key, model=args.model, geometry=args.geometry,
        use_bonds=False if args.no_bonds else None,
        harmonic_prior=None if args.prior is None else args.prior == "harmonic",
        torus=args.torsions == "circle")  # fmt: skip
    if args.split is not None:  # (val, test) fractions; the default stays the preset's
        exp = dataclasses.replace(exp, val_fraction=args.split[0], test_fraction=args.split[1])
    changes = {k: getattr(args, k) for k in ("atol", "rtol") if getattr(args, k) is not None}
    exp = dataclasses.replace(exp, **changes)
    exp.flow = exp.flow.replace(**{k: v for k, v in flow.items() if v is not None})
    if args.n_val is not None:
        exp = dataclasses.replace(exp, n_val_flow=args.n_val)
    exp.flow = exp.flow.replace(**_validation_fields(args))
    return exp


def _validation_fields(args) -> dict:
    """What ``train`` sets in every configuration it trains: budgets charge validation (so
    ``--minutes`` bounds the whole command), and ``--val-every``'s schedule if given."""
    return {"charge_validation": True, **(args.val_every or {})}


def _val_every(text: str) -> dict:
    """``--val-every``: ``N`` (every N iterations), ``Xmin`` (after X minutes of training) or
    ``end`` (only the final validation), as `TrainConfig` fields."""
    fields = {"val_every": None, "val_doubling_from": None, "val_every_minutes": None}
    spec = text.strip().lower()
    if spec == "end":
        return fields
    try:
        if spec.endswith("min") and float(spec[:-3]) > 0:
            return {**fields, "val_every_minutes": float(spec[:-3])}
        if int(spec) >= 1:
            return {**fields, "val_every": int(spec)}
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(
        f"expected N >= 1 (iterations), Xmin (X > 0 minutes of training) or end, got {text!r}")


def cmd_train(args) -> None:
    from ..tasks import particle_runs as px
    from ..tasks import shape_runs as shapes
    from ..tasks import texture_runs as tx
    from ..training.clock import Stopwatch
    from ..training.clock import read as read_clock

    # the process's CPU seconds so far (imports included) count as the command's
    setup = Stopwatch(cpu=read_clock("cpu")).start()
    if args.data is not None:
        exp = shapes.run(_shape_experiment(args), args.run_dir, resume=args.resume,
                         progress=not args.no_progress, final_eval=not args.no_eval,
                         setup=setup)  # fmt: skip
        print(f"trained {shapes.model_name(exp)} of {exp.n_points} points in {exp.dim}-D in "
              f"{args.run_dir}")
        if args.no_eval:
            print(f"`grassflow eval {args.run_dir}` for the test NLL")
        return
    unused = [f"--{k.replace('_', '-')}" for k in ("ema", "no_bonds", "n_val")
              if getattr(args, k) not in (None, False)]  # fmt: skip
    if unused:
        raise ValueError(f"{', '.join(unused)}: options of --data (your own clouds)")
    if args.dataset in px.SIZES:
        exp, module = _particle_experiment(args), px
    else:
        exp = tx.preset(args.preset, args.dataset)
        if args.preset != "paper":  # its budget-bound iteration cap: the paper's count instead
            exp.train = exp.train.replace(iterations=tx.PRESETS["paper"].train.iterations)
        exp, module = apply_overrides(exp, args), tx
    exp.train = exp.train.replace(**_validation_fields(args))
    result = module.run(exp, args.run_dir, resume=args.resume, progress=not args.no_progress,
                        setup=setup)  # fmt: skip
    print(result.message or f"stopped: {result.stopped} after {result.iterations} iterations")


def _run_kind(run_dir: str):
    from ..tasks import registry

    kind = registry.kind_of(run_dir)
    return kind, registry.get(kind)


def _warn_if_unfinished(run_dir: str) -> None:
    import sys

    from ..tasks.run_dir import unfinished_warning

    line = unfinished_warning(run_dir)
    if line is not None:
        print(line, file=sys.stderr)


def cmd_eval(args) -> None:
    _warn_if_unfinished(args.run_dir)
    if args.data is not None:  # a user's held-out file, beside eval.json (which stays)
        from ..tasks.registry import evaluate_on_data

        print(evaluate_on_data(args.run_dir, args.data, args.key, args.n_samples, args.seed))
        return
    _, run_kind = _run_kind(args.run_dir)
    print(run_kind.evaluate(Path(args.run_dir), args.n_samples, args.seed))
    print(f"wrote {Path(args.run_dir) / 'eval.json'}")


def _split_fractions(text: str) -> tuple[float, float]:
    """``--split VAL,TEST``: two fractions in (0, 1) with a sum < 1, e.g. ``0.1,0.1``."""
    parts = text.replace(" ", "").split(",")
    try:
        val, test = (float(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected VAL,TEST: two fractions such as 0.1,0.1, got {text!r}") from None
    if not (0 < val < 1 and 0 < test < 1 and val + test < 1):
        raise argparse.ArgumentTypeError(
            f"VAL and TEST must each be in (0, 1) with a sum < 1 (the rest trains), got {text!r}")
    return val, test


def cmd_sample(args) -> None:
    _warn_if_unfinished(args.run_dir)
    kind, run_kind = _run_kind(args.run_dir)
    if args.reweight is None and args.temperature is not None:
        raise ValueError("--temperature is the target's, for --reweight mmff")
    if args.reweight is not None:  # refuses runs of other kinds than 'shapes'
        from ..tasks.reweight import reweight, reweight_line

        r = reweight(args.run_dir, args.n, args.seed, args.temperature, args.out, progress=True)
        print(r["written"])
        print("wrote", ", ".join(r["files"]))
        print(reweight_line(r))
        return
    if run_kind.sample is None:
        raise ValueError(f"{args.run_dir} is a run of kind {kind!r}, which `grassflow sample` "
                         "cannot sample")  # fmt: skip
    line = run_kind.sample(Path(args.run_dir), args.n, args.seed, Path(args.out))
    if line is not None:  # None: a torchrun rank that wrote nothing
        print(line)


def cmd_plot(args) -> None:
    from ..tasks.texture_runs import plot_prior

    if not (args.prior or args.run_dir):
        raise SystemExit("grassflow plot: give a RUN_DIR and/or --prior OUT.png")
    if args.prior:
        print("wrote", plot_prior(args.prior, sigma2=args.sigma2))
    if args.run_dir:
        kind, run_kind = _run_kind(args.run_dir)
        if run_kind.plot is None:
            raise ValueError(f"{args.run_dir} is a run of kind {kind!r}, which has no pictures")
        print("wrote", ", ".join(str(p) for p in run_kind.plot(Path(args.run_dir))))


def add_commands(sub) -> None:
    """Add demo, train, eval, sample and plot to ``sub`` (an `options.Subcommands`)."""
    from ..data.textures import TEXTURES

    p = sub.add_parser("demo", help="train on a texture (25,000 iterations, ~3 CPU minutes), "
                                    "plot, print NLLs")
    p.add_argument("--dataset", default="2spirals", choices=TEXTURES)
    p.add_argument("--out", default="runs/demo", help="run directory")
    p.add_argument("--preset", default="fourier", choices=("fourier", "paper"),
                   help="fourier (default): flow matching with Fourier HorP features, the best "
                        "picture in ~3 minutes; paper: the paper's model trained by MLE")
    add_train_options(p, minutes_what="CPU minutes of training and validation (the test "
                                     "NLL and the pictures come after)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="train a GrCNF on a texture or DW4/LJ13 (resumable)")
    p.add_argument("--dataset", default="2spirals", choices=TEXTURES + PARTICLE_SYSTEMS)
    p.add_argument("--run-dir", required=True)
    add_texture_preset(p)
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/last.pt")
    p.add_argument("--val-every", type=_val_every, metavar="N|Xmin|end",
                   help="validate every N iterations, after every X minutes of training, or "
                        "only at the end (default: the preset's schedule). Validation counts "
                        "against --minutes, and one that would leave less training time than "
                        "it takes is skipped")  # fmt: skip
    g = p.add_argument_group("your own point clouds (one E(n)-equivariant flow on the whole "
                             "cloud; --dataset is then ignored)")
    g.add_argument("--data", help="an (N, n, d) .npy (labels, e.g. atomic numbers, from "
                                  "NAME_Z.npy beside it: (n,) shared or (N, n)), an .npz "
                                  "('positions', optional 'labels' or 'atomic_numbers', "
                                  "'bonds', 'bond_orders'), an .sdf of one molecule's "
                                  "conformers (RDKit), or a folder of .xyz files (labels from "
                                  "their element symbols)")  # fmt: skip
    g.add_argument("--ema", type=float, metavar="DECAY",
                   help="validate, keep and sample the moving average of the parameters "
                        "with this decay, e.g. 0.999 (default: the parameters themselves)")
    g.add_argument("--no-bonds", action="store_true",
                   help="ignore the data's bond table (by default a molecule's bonds are the "
                        "field's edge features and give the harmonic prior)")  # fmt: skip
    g.add_argument("--split", type=_split_fractions, metavar="VAL,TEST",
                   help="fractions of the clouds held out for validation and for test (what "
                        "`eval` scores), at random (seed 0); default 0.1,0.1")  # fmt: skip
    g.add_argument("--key", help="the array's name in an .npz")
    g.add_argument("--n-val", type=int,
                   help="validation clouds scored exactly at each validation (default 50); "
                        "fewer make validations cheaper")  # fmt: skip
    g.add_argument("--no-eval", action="store_true",
                   help="skip the final test evaluation (by default it runs within --minutes, "
                        "announced with its estimated cost)")  # fmt: skip
    g.add_argument("--geometry", choices=("internal", "cartesian", "grassmann"),
                   help="internal: InternalFlow, a spline flow in bonds, angles and torsions "
                        "(the default for a molecule with a bond graph); cartesian: ShapeFlow "
                        "on straight flow-matching paths (the default otherwise) or grassmann: "
                        "on the Grassmann bundle's; docs/experiments/shapes.md")
    g.add_argument("--torsions", choices=("cut", "circle"), default="cut",
                   help="InternalFlow's torsions: cut open, an autoregressive flow from a "
                        "Gaussian mixture (the default; keeps rings closed on thermal data) or "
                        "on the circle, a coupling flow (learns longer on minimized conformers, "
                        "samples in one pass; breaks rings on thermal data: issue 46)")  # fmt: skip
    g.add_argument("--model", default="equivariant-cnf", choices=("equivariant-cnf",),
                   help="the preset's model identifier, equivariant-cnf (the only one) for "
                        "every --data run: --geometry picks InternalFlow or ShapeFlow, which "
                        "eval and sample name; the two-part 'shapeflow' was removed in issue "
                        "34 (last in commit 3531f93)")  # fmt: skip
    g = p.add_argument_group("DW4 / LJ13 data")
    add_particle_data_options(g)
    g.add_argument("--protocol", default="com-free", choices=("com-free", "paper"))
    g.add_argument("--n-train", type=int, default=1000, help="training configurations")
    g.add_argument("--prior", choices=("gaussian", "uniform", "harmonic"),
                   help="base distribution. DW4 / LJ13: gaussian (default, the paper's, sigma "
                        "0.3) or uniform (permutation invariant). --data: gaussian (isotropic) "
                        "or harmonic (from the bond graph; the default when the data has "
                        "bonds)")  # fmt: skip
    add_train_options(p, minutes_what="CPU minutes of the whole command: training, validation "
                      "and, with --data, the final test evaluation")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="test NLL and MMD of a trained run")
    p.add_argument("run_dir")
    p.add_argument("--data", help="score the clouds of this file (as `train --data` reads) "
                                  "instead of the run's test split; writes eval_NAME.json, "
                                  "not eval.json (runs of `train --data` only)")  # fmt: skip
    p.add_argument("--key", help="the array's name in an .npz given to --data")
    p.add_argument("--n-samples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("sample", help="draw samples and their log-densities to a .npz file "
                                      "(runs of `train --data`: .npy, and .xyz with element "
                                      "symbols for 3-D clouds)")  # fmt: skip
    p.add_argument("run_dir")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--out", default="samples.npz")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reweight", choices=("mmff",),
                   help="also weigh the samples to the Boltzmann distribution of this energy "
                        "(mmff: MMFF94, RDKit) by importance weights w ~ exp(-E/kT) / q, "
                        "written to OUT_weights.npy (and .npz with the energies and log q); "
                        "prints the effective sample size. Molecule runs of `train --data`")
    p.add_argument("--temperature", type=float, metavar="K",
                   help="the target's temperature for --reweight (default: the data's, which "
                        "`grassflow data conformers` records)")  # fmt: skip
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("plot", help="pictures of a run and/or of the prior")
    p.add_argument("run_dir", nargs="?")
    p.add_argument("--prior", help="write the paper's prior-density figure to this PNG")
    p.add_argument("--sigma2", type=float, default=0.5, help="prior variance for --prior")
    p.set_defaults(func=cmd_plot)
