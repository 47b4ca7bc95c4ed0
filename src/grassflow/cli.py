"""Command line: ``grassflow {demo,train,eval,sample,plot,reproduce,data}``."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
from pathlib import Path

__all__ = ["main"]

DEBUG_ENV = "GRASSFLOW_DEBUG"
"""Environment variable: set to anything but ``""`` or ``"0"`` to act as ``--debug``."""

USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, IsADirectoryError,
               NotADirectoryError, PermissionError)
"""Exceptions reported as a one-line error (exit code 2): bad arguments, input files or run
directories, and the library's validation ``ValueError``s. Anything else is a bug and keeps
its traceback. ``--debug`` (or ``$GRASSFLOW_DEBUG=1``) shows the traceback of these too."""


PARTICLE_SYSTEMS = ("dw4", "lj13")
OBJECTIVE_NAMES = ("mle", "fm", "fm-ot", "fm-relabel")


def _add_particle_data_options(g) -> None:
    g.add_argument("--source", default="generated", choices=("generated", "klein", "enf"),
                   help="file layout: `grassflow data make` output, Klein et al. or E-NF")
    g.add_argument("--data-dir", default="data", help="directory holding the source's files")


def _add_train_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("overrides of the preset (paper values by default)")
    g.add_argument(
        "--budget-minutes", type=float,
        help="training budget of this invocation, in CPU minutes of this process (--clock "
             "wall: wall-clock minutes); validation and evaluation are not charged to it. With "
             "--data it covers both parts: the Gram density gets 30%% of it, at most 3 min",
    )
    g.add_argument("--clock", choices=("cpu", "wall"),
                   help="what budgets count: CPU time (default; the same on a busy machine) or "
                        "wall-clock time")  # fmt: skip
    g.add_argument(
        "--iterations", type=int,
        help="total optimizer steps of the run (across resumes); training stops at this count "
             "or at the budget, whichever comes first. With a generous budget the amount of "
             "training, and the result, do not depend on the machine's speed",
    )
    g.add_argument("--batch-size", type=int)
    g.add_argument("--lr", type=float)
    g.add_argument("--grad-clip", type=float, help="clip the gradient norm to this value")
    g.add_argument("--seed", type=int)
    g.add_argument("--dtype", choices=("float32", "float64"))
    g.add_argument("--device", help="cpu, cuda, cuda:1 or auto")
    g.add_argument(
        "--objective", choices=OBJECTIVE_NAMES,
        help="maximum likelihood, flow matching, or flow matching with minibatch OT pairs",
    )
    g.add_argument("--divergence", choices=("exact", "hutchinson"))
    g.add_argument("--method", choices=("cayley_rkmk", "ambient"))
    g.add_argument("--atol", type=float)
    g.add_argument("--rtol", type=float)
    g.add_argument("--sigma", type=float, help="prior scale (U = sigma^2 I)")
    g.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _add_texture_preset(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="fourier", choices=("fourier", "paper"),
                   help="textures: fourier (default), Fourier HorP features trained by flow "
                        "matching, which resolve thin structure such as spiral arms; paper, the "
                        "paper's model and objective (maximum likelihood)")  # fmt: skip


MODEL_FIELDS = ("objective", "divergence", "method", "atol", "rtol", "sigma")


def _apply_overrides(exp, args):
    train_fields = {
        "budget_minutes": args.budget_minutes,
        "clock": args.clock,
        "iterations": args.iterations,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "grad_clip": args.grad_clip,
        "seed": args.seed,
        "dtype": args.dtype,
        "device": args.device,
    }
    changes = {k: getattr(args, k) for k in MODEL_FIELDS if getattr(args, k) is not None}
    exp = dataclasses.replace(exp, **changes)
    exp.train = exp.train.replace(**{k: v for k, v in train_fields.items() if v is not None})
    return exp


def _print_eval(result: dict) -> None:
    print(
        f"[{result['dataset']}] test NLL {result['test_nll']:.3f} ± {result['test_nll_sem']:.3f} "
        f"nats | prior {result['prior_nll']:.3f} | uniform {result['uniform_nll']:.3f} "
        f"(= log V_Gr(1,3))"
    )
    print(
        f"[{result['dataset']}] MMD² (h={result['mmd_bandwidth']}) model {result['mmd2_model']:.4f}"
        f" | prior {result['mmd2_prior']:.4f} | data-vs-data floor {result['mmd2_data']:.4f}"
    )


def cmd_demo(args) -> None:
    import torch

    from .experiments import textures as tx
    from .experiments import textures_figures as fig

    base = tx.DEMO_PAPER if args.preset == "paper" else tx.DEMO
    exp = _apply_overrides(dataclasses.replace(base, dataset=args.dataset), args)
    out = Path(args.out)
    resume = (out / "last.pt").exists()
    if resume:
        print(f"resuming the demo run in {out} (delete it to start over)")
    print(f"method: GrCNF, {tx.describe(exp)}")
    budget = exp.train.budget_minutes
    limit = "" if budget is None else f" or {budget:g} {exp.train.clock} min, whichever first"
    print(f"training GrCNF on '{exp.dataset}' (Gr(1,3)) for {exp.train.iterations:,} iterations"
          f"{limit}, {torch.get_num_threads()} thread(s); run directory {out}")
    tx.run(exp, out, resume=resume, progress=not args.no_progress)
    result = tx.evaluate(out)
    paths = fig.plot_run(out)
    paths.append(fig.plot_prior(out / "prior.png"))
    _print_eval(result)
    print(f"[{result['dataset']}] trained with {exp.objective} ({tx.describe(exp)})")
    print("pictures:", ", ".join(str(p) for p in paths))


def _particle_experiment(args):
    from .experiments import particles as px

    exp = px.ParticleExperiment(
        system=args.dataset, protocol=args.protocol, n_train=args.n_train, source=args.source,
        data_dir=args.data_dir, objective=args.objective or "mle", prior=args.prior or "gaussian",
    )
    return _apply_overrides(exp, args)


def _shape_experiment(args):
    from .experiments import shapes

    flow_minutes = gram_minutes = None
    if args.budget_minutes is not None and args.model == "equivariant-cnf":
        flow_minutes = args.budget_minutes  # one model: the whole budget
    elif args.budget_minutes is not None:  # the budget covers both parts
        flow_minutes, gram_minutes = shapes.split_budget(args.budget_minutes)
    flow = {"budget_minutes": flow_minutes, "iterations": args.iterations, "clock": args.clock,
            "batch_size": args.batch_size, "lr": args.lr, "grad_clip": args.grad_clip,
            "seed": args.seed, "device": args.device}  # fmt: skip
    exp = shapes.ShapeExperiment(data=args.data, key=args.key, model=args.model,
                                 potential=args.potential, gram_density=args.gram,
                                 gram_components=args.gram_components,
                                 prior=args.prior or "uniform",
                                 objective=args.objective or "fm")  # fmt: skip
    changes = {k: getattr(args, k) for k in ("atol", "rtol") if getattr(args, k) is not None}
    exp = dataclasses.replace(exp, **changes)
    exp.flow = exp.flow.replace(**{k: v for k, v in flow.items() if v is not None})
    gram = {"iterations": args.gram_iterations, "budget_minutes": gram_minutes,
            "clock": args.clock, "seed": args.seed, "device": args.device}  # fmt: skip
    exp.gram = exp.gram.replace(**{k: v for k, v in gram.items() if v is not None})
    return exp


def cmd_train(args) -> None:
    from .experiments import particles as px
    from .experiments import shapes
    from .experiments import textures as tx

    if args.data is not None:
        exp = shapes.run(_shape_experiment(args), args.run_dir, resume=args.resume,
                         progress=not args.no_progress)  # fmt: skip
        name = " ShapeFlow" if exp.model == "shapeflow" else "n equivariant CNF (EFM baseline)"
        print(f"trained a{name} of {exp.n_points} points in {exp.dim}-D in {args.run_dir}; "
              f"`grassflow eval {args.run_dir}` for the test NLL")
        return
    if args.dataset in px.SIZES:
        exp, module = _particle_experiment(args), px
    else:
        exp = tx.preset(args.preset, args.dataset)
        if args.preset != "paper":  # its budget-bound iteration cap: the paper's count instead
            exp.train = exp.train.replace(iterations=tx.PRESETS["paper"].train.iterations)
        exp, module = _apply_overrides(exp, args), tx
    result = module.run(exp, args.run_dir, resume=args.resume, progress=not args.no_progress)
    print(result.message or f"stopped: {result.stopped} after {result.iterations} iterations")


def _run_kind(run_dir: str):
    """The experiment module that wrote ``run_dir`` (textures, particles, vs-E-NF or shapes)."""
    import json

    from .experiments import efm, shapes, vs_enf
    from .experiments import particles as px
    from .experiments import textures as tx

    path = Path(run_dir) / "experiment.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a grassflow run directory?")
    preset = json.loads(path.read_text())
    if "system" in preset:
        return efm if "coupling" in preset else vs_enf if "tol" in preset else px
    return shapes if "n_points" in preset else tx


def _shape_nll(r: dict) -> str:
    """A ShapeFlow's test NLL and its parts (a baseline's alone), from an ``eval.json``."""
    if "test_nll_gram" not in r:
        return f"{r['test_nll']:.3f} ± {r['test_nll_sem']:.3f} nats per shape"
    return (f"{r['test_nll']:.3f} ± {r['test_nll_sem']:.3f} nats per shape = Grassmann "
            f"{r['test_nll_grassmann']:.3f} (uniform {r['uniform_nll_grassmann']:.3f}) + Gram "
            f"{r['test_nll_gram']:.3f} + Jacobian {r['test_nll_jacobian']:.3f}")  # fmt: skip


def cmd_eval(args) -> None:
    module = _run_kind(args.run_dir)
    if module.__name__.endswith("shapes"):
        r = module.evaluate(args.run_dir, n_samples=args.n_samples, seed=args.seed)
        what = f"{r['potential']} potential" if r.get("model", "shapeflow") == "shapeflow" \
            else r["model"]  # fmt: skip
        print(f"[{r['n_points']} points in {r['dim']}-D, {what}] test NLL "
              f"{_shape_nll(r)} | pair-distance JSD {r['distance_jsd']:.4f}")
    elif module.__name__.endswith("vs_enf"):
        r = module.evaluate(args.run_dir)
        print(f"[{r['system']}, {r['model']}, n_train {r['n_train']}, atol = rtol = "
              f"{r['atol']:g}] Cartesian test NLL {_shape_nll(r)}")
    elif module.__name__.endswith("efm"):
        r = module.evaluate(args.run_dir)
        print(f"[{r['system']}, {r['model']}, n_train {r['n_train']}, atol = rtol = "
              f"{r['atol']:g}] Cartesian test NLL {r['test_nll']:.3f} ± "
              f"{r['test_nll_sem']:.3f} nats")  # fmt: skip
    elif module.__name__.endswith("particles"):
        r = module.evaluate(args.run_dir)
        print(f"[{r['system']}, {r['protocol']}, {r['manifold']}] test NLL {r['test_nll']:.3f} "
              f"± {r['test_nll_sem']:.3f} nats | prior {r['prior_nll']:.3f} | uniform "
              f"{r['uniform_nll']:.3f}")
    else:
        _print_eval(module.evaluate(args.run_dir, n_samples=args.n_samples, seed=args.seed))
    print(f"wrote {Path(args.run_dir) / 'eval.json'}")


def cmd_sample(args) -> None:
    import numpy as np

    from .data.point_clouds import write_xyz
    from .training import distributed as dd
    from .training import distributed_sample

    module = _run_kind(args.run_dir)
    if module.__name__.endswith(("shapes", "vs_enf", "efm")):
        X = module.sample(args.run_dir, args.n, args.seed)
        out = Path(args.out).with_suffix(".npy")
        np.save(out, X)
        written = [out]
        if X.shape[-1] == 3:
            exp, _ = module.load_run(args.run_dir)
            labels = getattr(exp, "labels", None)
            labels = None if labels is None else np.broadcast_to(labels, X.shape[:2])
            write_xyz(out.with_suffix(".xyz"), X, labels, "grassflow ShapeFlow sample")
            written.append(out.with_suffix(".xyz"))
        print(f"wrote {args.n} clouds {tuple(X.shape)} to " + ", ".join(map(str, written)))
        return
    _, model = module.load_run(args.run_dir)
    # under torchrun each rank draws a share with its own seed, and rank 0 writes
    Y, logp = distributed_sample(model, args.n, args.seed)
    if not dd.is_main():
        return
    out = Path(args.out)
    np.savez(out, Y=Y.cpu().numpy(), log_prob=logp.cpu().numpy())
    print(f"wrote {args.n} samples (Y: {tuple(Y.shape)}, log_prob) to {out}")


def cmd_plot(args) -> None:
    from .experiments import textures_figures as fig

    if args.prior:
        print("wrote", fig.plot_prior(args.prior, sigma2=args.sigma2))
    if args.run_dir and _run_kind(args.run_dir).__name__.endswith("shapes"):
        from .experiments import shapes

        print("wrote", shapes.plot(args.run_dir))
    elif args.run_dir:
        print("wrote", ", ".join(str(p) for p in fig.plot_run(args.run_dir)))
    if not (args.prior or args.run_dir):
        raise SystemExit("grassflow plot: give a RUN_DIR and/or --prior OUT.png")


def cmd_reproduce_textures(args) -> None:
    from .experiments import textures as tx
    from .experiments import textures_figures as fig

    base = tx.PRESETS[args.preset]
    if args.preset == "paper":
        base = dataclasses.replace(base, train=tx.PAPER_TEXTURES.replace(
            batch_size=200, val_every=500, checkpoint_every=250))  # fmt: skip
    base = _apply_overrides(base, args)
    rows = fig.reproduce(
        args.out,
        args.runs,
        budget_minutes=args.budget_minutes_per_dataset,
        datasets=tuple(args.datasets),
        base=base,
        progress=not args.no_progress,
        force=args.force,
    )
    for row in rows:
        _print_eval(row)
    print((Path(args.out) / "textures.md").read_text())


def cmd_reproduce_fm_vs_mle(args) -> None:
    from .experiments import fm_vs_mle

    result = fm_vs_mle.compare(
        args.out, args.runs, tuple(args.datasets), args.budget_minutes_per_dataset,
        objectives=tuple(args.objectives), progress=not args.no_progress, force=args.force,
    )
    print(fm_vs_mle.markdown_table(result))


def cmd_reproduce_table1(args) -> None:
    from .experiments import table1

    sizes = None if args.sizes is None else {s: tuple(args.sizes) for s in args.system}
    result = table1.reproduce(
        args.out, args.runs, systems=tuple(args.system), protocols=tuple(args.protocol),
        sizes=sizes, seeds=tuple(args.seeds), budget_minutes=args.budget,
        objective=args.objective, prior=args.prior, source=args.source, data_dir=args.data_dir,
        progress=not args.no_progress, force=args.force,
    )
    print(table1.markdown_table(result))


def cmd_reproduce_table2(args) -> None:
    from .experiments import qm9, qm9_report

    exp = qm9.QM9Experiment(
        objective=args.objective, prior=args.prior, potential=args.potential,
        flow_minutes=args.budget, scale_minutes=args.scale_budget, cache_dir=args.cache_dir,
        gram=args.gram, gram_components=args.gram_components, layers=args.layers,
        n_val=args.n_val, val_every_minutes=args.val_every_minutes, n_test=args.n_test,
        atol=args.tol, rtol=args.tol,
    )  # fmt: skip
    result = qm9_report.reproduce(args.out, args.runs, exp, progress=not args.no_progress,
                                  force=args.force, summary_dir=args.summary or None)  # fmt: skip
    print(qm9_report.markdown_table(result))


_POTENTIALS = ("graph", "mlp", "egnn")  # flows.POTENTIALS, without importing torch
_EFM_OPTIONS = ("hidden", "layers", "lr", "batch_size", "coupling", "dtype")


def cmd_reproduce_vs_enf(args) -> None:
    from .experiments import efm, vs_enf

    options = {k: getattr(args, k) for k in _EFM_OPTIONS if getattr(args, k) is not None}
    if args.model == "equivariant-cnf":
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
                                    val_every_minutes=args.val_every_minutes)  # fmt: skip
    vs_enf.sweep(
        tuple(args.systems), tuple(args.n_train), tuple(args.seeds), args.minutes, args.runs,
        args.out, base=base, progress=not args.no_progress,
        force=args.force, n_test=args.n_test,
    )  # fmt: skip
    for system in args.systems:
        print((Path(args.out) / "vs_enf" / f"{system}.md").read_text())


def cmd_data_make(args) -> None:
    from .data import mcmc
    from .data.particle_files import SOURCE_FILES

    n = args.n or DATA_SIZES[args.system]
    path = Path(args.out) / SOURCE_FILES["generated", args.system][0]
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
    from .experiments import sampler_check

    result = sampler_check.compare(args.data_dir, args.reference, args.out, systems=args.system)
    print(sampler_check.markdown_table(result))


# file sizes that `data make` writes by default: the largest paper training set + 2,000 held out
DATA_SIZES = {"dw4": 102_000, "lj13": 12_000}


def _debug_option(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument(
        "--debug", action="store_true", default=default,
        help=f"on an error, print the full traceback (also: {DEBUG_ENV}=1)",
    )


def _threads_option(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument(
        "--threads", default=default, metavar="N|auto",
        help="torch intra-op threads per process; auto (default): 1, or $GRASSFLOW_THREADS. "
             "One thread does the most work per CPU second and does not stall when the "
             "machine is busy; more threads speed up large models on an idle machine",
    )  # fmt: skip


class _Subcommands:
    """``add_parser`` that also accepts the global ``--debug`` and ``--threads`` after the
    subcommand."""

    def __init__(self, action):
        self.action = action
        self.common = argparse.ArgumentParser(add_help=False)
        # SUPPRESS: a subcommand without the option leaves the top-level value alone
        _debug_option(self.common, argparse.SUPPRESS)
        _threads_option(self.common, argparse.SUPPRESS)

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        return self.action.add_parser(name, parents=[self.common], **kwargs)

    def add_subparsers(self, parser: argparse.ArgumentParser, **kwargs) -> _Subcommands:
        return _Subcommands(parser.add_subparsers(**kwargs))


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .data.textures import TEXTURES

    parser = argparse.ArgumentParser(
        prog="grassflow", description="Continuous normalizing flows on Grassmann manifolds."
    )
    parser.add_argument("--version", action="version", version=f"grassflow {__version__}")
    _debug_option(parser, False)
    _threads_option(parser, "auto")
    sub = _Subcommands(parser.add_subparsers(dest="command", required=True))

    p = sub.add_parser("demo", help="train on a texture (25,000 iterations, ~3 CPU minutes), "
                                    "plot, print NLLs")
    p.add_argument("--dataset", default="2spirals", choices=TEXTURES)
    p.add_argument("--out", default="runs/demo", help="run directory")
    p.add_argument("--preset", default="fourier", choices=("fourier", "paper"),
                   help="fourier (default): flow matching with Fourier HorP features, the best "
                        "picture in ~3 minutes; paper: the paper's model trained by MLE")
    _add_train_options(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="train a GrCNF on a texture or DW4/LJ13 (resumable)")
    p.add_argument("--dataset", default="2spirals", choices=TEXTURES + PARTICLE_SYSTEMS)
    p.add_argument("--run-dir", required=True)
    _add_texture_preset(p)
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/last.pt")
    g = p.add_argument_group("your own point clouds (a ShapeFlow; --dataset is then ignored)")
    g.add_argument("--data", help="an (N, n, d) .npy, an .npz, or a folder of .xyz files")
    g.add_argument("--key", help="the array's name in an .npz")
    g.add_argument("--model", default="shapeflow", choices=("shapeflow", "equivariant-cnf"),
                   help="ours (default), or the equivariant flow-matching CNF baseline (EFM: "
                        "an EGNN, one flow on the whole budget)")  # fmt: skip
    g.add_argument("--potential", default="egnn", choices=_POTENTIALS,
                   help="the Grassmann field: an EGNN's velocity on the span's whitened points "
                        "(default), or the gradient of a permutation-invariant graph potential "
                        "or of the paper's MLP")  # fmt: skip
    g.add_argument("--gram", default="distance", choices=("distance", "wishart"),
                   help="the density of the cloud's scale and shape given its span: log-normal "
                        "pair distances (default) or a Wishart mixture")  # fmt: skip
    g.add_argument("--gram-components", type=int, default=1, help="mixture components of it")
    g.add_argument("--gram-iterations", type=int, help="Gram density steps (after the flow)")
    g = p.add_argument_group("DW4 / LJ13 data")
    _add_particle_data_options(g)
    g.add_argument("--protocol", default="com-free", choices=("com-free", "paper"))
    g.add_argument("--n-train", type=int, default=1000, help="training configurations")
    g.add_argument("--prior", choices=("gaussian", "uniform"),
                   help="base distribution: default gaussian (the paper's, sigma 0.3) for "
                        "DW4/LJ13, uniform (permutation invariant) for --data")
    _add_train_options(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="test NLL and MMD of a trained run")
    p.add_argument("run_dir")
    p.add_argument("--n-samples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("sample", help="draw samples and their log-densities to a .npz file")
    p.add_argument("run_dir")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--out", default="samples.npz")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("plot", help="pictures of a run and/or of the prior")
    p.add_argument("run_dir", nargs="?")
    p.add_argument("--prior", help="write the paper's prior-density figure to this PNG")
    p.add_argument("--sigma2", type=float, default=0.5, help="prior variance for --prior")
    p.set_defaults(func=cmd_plot)

    rep = sub.add_subparsers(
        sub.add_parser("reproduce", help="regenerate a paper experiment"),
        dest="experiment", required=True,
    )
    p = rep.add_parser("textures", help="paper §5.1: five textures, Figures 3-4, NLL table")
    p.add_argument("--out", default="results/textures", help="figures and tables")
    p.add_argument("--runs", default="runs/textures", help="run directories (checkpoints)")
    p.add_argument("--budget-minutes-per-dataset", type=float, default=10.0,
                   help="training CPU minutes per dataset, in total over reruns")
    p.add_argument("--datasets", nargs="+", default=list(TEXTURES), choices=TEXTURES)
    _add_texture_preset(p)
    _add_train_options(p)
    p.add_argument("--force", action="store_true",
                   help="retrain run directories that hold another preset or other data "
                        "(deletes them) instead of stopping with an error")
    p.set_defaults(func=cmd_reproduce_textures)

    p = rep.add_parser("fm-vs-mle", help="test NLL against training CPU time, MLE vs flow matching")
    p.add_argument("--out", default="results/fm_vs_mle")
    p.add_argument("--runs", default="runs/fm_vs_mle")
    p.add_argument("--budget-minutes-per-dataset", type=float, default=10.0,
                   help="training CPU minutes per objective and dataset, in total over reruns")
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
    p.add_argument("--budget", type=float, default=1.0,
                   help="training CPU minutes per run, in total over reruns (a larger one "
                        "continues)")
    p.add_argument("--objective", default="fm", choices=OBJECTIVE_NAMES)
    p.add_argument("--prior", default="uniform", choices=("gaussian", "uniform"),
                   help="base distribution (the paper's is gaussian; see the README)")
    _add_particle_data_options(p)
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
    p.add_argument("--potential", default="mlp", choices=_POTENTIALS,
                   help="the GrCNF's: mlp (the paper's), graph (invariant to relabelling the "
                        "atoms) or egnn (an EGNN's velocity; both validate far slower)")
    p.add_argument("--gram", default="wishart", choices=("wishart", "distance"),
                   help="the ShapeFlow's density of S given the span")
    p.add_argument("--gram-components", type=int, default=1)
    p.add_argument("--layers", type=int, help="the graph potential's or EGNN's layers")
    p.add_argument("--n-val", type=int, default=500,
                   help="validation molecules of the GrCNF's exact NLL")
    p.add_argument("--val-every-minutes", type=float, default=0.5)
    p.add_argument("--n-test", type=int,
                   help="score a seeded random N test molecules (default: all 1,813)")
    p.add_argument("--tol", type=float, default=1e-5,
                   help="ODE atol = rtol of the ShapeFlow's training and evaluation")
    p.add_argument("--budget", type=float, default=5.0,
                   help="GrCNF training CPU minutes, in total over reruns")
    p.add_argument("--scale-budget", type=float, default=1.0,
                   help="training CPU minutes of each of the Gram density and the "
                        "decoder")  # fmt: skip
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
                   choices=(*PARTICLE_SYSTEMS, "qm9"),
                   help="qm9: --model equivariant-cnf only (ShapeFlow's QM9 rows: table2)")
    p.add_argument("--n-train", nargs="+", type=int, default=[1000], help="training sizes")
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--minutes", type=float, default=7.0,
                   help="training CPU minutes per run, both parts, in total over reruns (a larger "
                        "one continues the runs)")  # fmt: skip
    p.add_argument("--model", default="shapeflow", choices=("shapeflow", "equivariant-cnf"),
                   help="ours, or the equivariant flow-matching baseline (EFM; "
                        "grassflow.baselines.EquivariantCNF)")  # fmt: skip
    p.add_argument("--potential", default="graph", choices=_POTENTIALS)
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
    efm_group.add_argument("--dtype", choices=("float32", "float64"), help="of training")
    p.add_argument("--gram", default="wishart", choices=("wishart", "distance"),
                   help="density of S given the span (ShapeFlow's gram)")
    p.add_argument("--gram-components", type=int, default=1,
                   help="mixture components of the Gram density")
    p.add_argument("--gram-fraction", type=float, default=0.1,
                   help="share of --minutes for the Gram density (capped by the next)")
    p.add_argument("--gram-max-minutes", type=float, default=1.0)
    p.add_argument("--n-val-flow", type=int, default=200,
                   help="validation configurations of the flow's exact NLL (selects the best "
                        "checkpoint; not counted in the budget)")  # fmt: skip
    p.add_argument("--val-every-minutes", type=float, default=1.0,
                   help="training CPU minutes between validations")
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

    data = sub.add_subparsers(
        sub.add_parser("data", help="make or check DW4/LJ13 datasets"),
        dest="data_command", required=True,
    )
    p = data.add_parser("make", help="sample DW4 or LJ13 by MCMC into OUT/<system>.npy")
    p.add_argument("system", choices=PARTICLE_SYSTEMS)
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
    return parser


def _report(args, what: str, err: BaseException) -> None:
    """One line on stderr; the traceback first under ``--debug`` or ``$GRASSFLOW_DEBUG``."""
    debug = args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    if debug:
        traceback.print_exception(err, file=sys.stderr)
    hint = "" if debug else " (rerun with --debug for the traceback)"
    print(f"grassflow {args.command}: {what}: {err}{hint}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code.

    0: done. 2: a user error (:data:`USER_ERRORS`: bad arguments, missing or existing files,
    invalid values), reported in one line. 3: training diverged. Other exceptions propagate
    with their traceback. Under torchrun the process group is left in every case.
    """
    import torch

    from .training import TrainingDiverged
    from .training import distributed as dd
    from .training.threads import set_threads

    args = build_parser().parse_args(argv)
    threads = torch.get_num_threads()  # restored on return: main() may be called in-process
    try:
        set_threads(args.threads)
        dd.init()  # under `torchrun --nproc_per_node N`: join the job (a no-op otherwise)
        with dd.quiet_unless_main():
            args.func(args)
    except TrainingDiverged as err:
        _report(args, "training diverged", err)
        return 3
    except USER_ERRORS as err:
        _report(args, "error", err)
        return 2
    finally:
        dd.shutdown()
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
