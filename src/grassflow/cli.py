"""Command line: ``grassflow {demo,train,eval,sample,plot,reproduce}``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

__all__ = ["main"]


def _add_train_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("overrides of the preset (paper values by default)")
    g.add_argument("--budget-minutes", type=float, help="wall-clock budget of this invocation")
    g.add_argument("--iterations", type=int)
    g.add_argument("--batch-size", type=int)
    g.add_argument("--lr", type=float)
    g.add_argument("--grad-clip", type=float, help="clip the gradient norm to this value")
    g.add_argument("--seed", type=int)
    g.add_argument("--dtype", choices=("float32", "float64"))
    g.add_argument("--device", help="cpu, cuda, cuda:1 or auto")
    g.add_argument(
        "--objective", choices=("mle", "fm", "fm-ot"),
        help="maximum likelihood, flow matching, or flow matching with minibatch OT pairs",
    )
    g.add_argument("--divergence", choices=("exact", "hutchinson"))
    g.add_argument("--method", choices=("cayley_rkmk", "ambient"))
    g.add_argument("--atol", type=float)
    g.add_argument("--rtol", type=float)
    g.add_argument("--sigma", type=float, help="prior scale (U = sigma^2 I)")
    g.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _apply_overrides(exp, args):
    train_fields = {
        "budget_minutes": args.budget_minutes,
        "iterations": args.iterations,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "grad_clip": args.grad_clip,
        "seed": args.seed,
        "dtype": args.dtype,
        "device": args.device,
    }
    model_fields = {
        "objective": args.objective,
        "divergence": args.divergence,
        "method": args.method,
        "atol": args.atol,
        "rtol": args.rtol,
        "sigma": args.sigma,
    }
    exp = dataclasses.replace(exp, **{k: v for k, v in model_fields.items() if v is not None})
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
    from .experiments import textures as tx
    from .experiments import textures_figures as fig

    exp = dataclasses.replace(tx.DEMO, dataset=args.dataset)
    exp = _apply_overrides(exp, args)
    out = Path(args.out)
    resume = (out / "last.pt").exists()
    if resume:
        print(f"resuming the demo run in {out} (delete it to start over)")
    print(
        f"training GrCNF on '{exp.dataset}' (Gr(1,3)) for {exp.train.budget_minutes:g} min; "
        f"run directory {out}"
    )
    tx.run(exp, out, resume=resume, progress=not args.no_progress)
    result = tx.evaluate(out)
    paths = fig.plot_run(out)
    paths.append(fig.plot_prior(out / "prior.png"))
    _print_eval(result)
    print("pictures:", ", ".join(str(p) for p in paths))


def cmd_train(args) -> None:
    from .experiments import textures as tx

    exp = _apply_overrides(tx.TexturesExperiment(dataset=args.dataset), args)
    result = tx.run(exp, args.run_dir, resume=args.resume, progress=not args.no_progress)
    print(result.message or f"stopped: {result.stopped} after {result.iterations} iterations")


def cmd_eval(args) -> None:
    from .experiments import textures as tx

    result = tx.evaluate(args.run_dir, n_samples=args.n_samples, seed=args.seed)
    _print_eval(result)
    print(f"wrote {Path(args.run_dir) / 'eval.json'}")


def cmd_sample(args) -> None:
    import numpy as np
    import torch

    from .experiments import textures as tx

    _, model = tx.load_run(args.run_dir)
    with torch.no_grad():
        Y, logp = model.sample_with_log_prob(args.n, torch.Generator().manual_seed(args.seed))
    out = Path(args.out)
    np.savez(out, Y=Y.cpu().numpy(), log_prob=logp.cpu().numpy())
    print(f"wrote {args.n} samples (Y: {tuple(Y.shape)}, log_prob) to {out}")


def cmd_plot(args) -> None:
    from .experiments import textures_figures as fig

    if args.prior:
        print("wrote", fig.plot_prior(args.prior, sigma2=args.sigma2))
    if args.run_dir:
        print("wrote", ", ".join(str(p) for p in fig.plot_run(args.run_dir)))
    if not (args.prior or args.run_dir):
        raise SystemExit("grassflow plot: give a RUN_DIR and/or --prior OUT.png")


def cmd_reproduce(args) -> None:
    from .experiments import textures as tx
    from .experiments import textures_figures as fig

    if args.experiment == "fm-vs-mle":
        from .experiments import fm_vs_mle

        out = "results/fm_vs_mle" if args.out == "results/textures" else args.out
        runs = "runs/fm_vs_mle" if args.runs == "runs/textures" else args.runs
        result = fm_vs_mle.compare(
            out, runs, tuple(args.datasets), args.budget_minutes_per_dataset,
            objectives=tuple(args.objectives), progress=not args.no_progress,
        )
        print(fm_vs_mle.markdown_table(result))
        return

    base = _apply_overrides(
        tx.TexturesExperiment(
            train=tx.PAPER_TEXTURES.replace(batch_size=200, val_every=500, checkpoint_every=250)
        ),
        args,
    )
    rows = fig.reproduce(
        args.out,
        args.runs,
        budget_minutes=args.budget_minutes_per_dataset,
        datasets=tuple(args.datasets),
        base=base,
        progress=not args.no_progress,
    )
    for row in rows:
        _print_eval(row)
    print((Path(args.out) / "textures.md").read_text())


def build_parser() -> argparse.ArgumentParser:
    from .data.textures import TEXTURES

    parser = argparse.ArgumentParser(
        prog="grassflow", description="Continuous normalizing flows on Grassmann manifolds."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="train on a texture for ~3 minutes, plot, print NLLs")
    p.add_argument("--dataset", default="2spirals", choices=TEXTURES)
    p.add_argument("--out", default="runs/demo", help="run directory")
    _add_train_options(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="train a GrCNF on a texture dataset (resumable)")
    p.add_argument("--dataset", default="2spirals", choices=TEXTURES)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/last.pt")
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

    p = sub.add_parser("reproduce", help="regenerate a paper experiment")
    p.add_argument("experiment", choices=("textures", "fm-vs-mle"))
    p.add_argument(
        "--objectives", nargs="+", default=["mle", "fm"], choices=("mle", "fm", "fm-ot"),
        help="for fm-vs-mle: objectives to compare (MLE is always the reference)",
    )
    p.add_argument("--out", default="results/textures", help="figures and tables")
    p.add_argument("--runs", default="runs/textures", help="run directories (checkpoints)")
    p.add_argument(
        "--budget-minutes-per-dataset", type=float, default=10.0,
        help="training minutes per dataset (textures) or per objective and dataset (fm-vs-mle)",
    )
    p.add_argument("--datasets", nargs="+", default=list(TEXTURES), choices=TEXTURES)
    _add_train_options(p)
    p.set_defaults(func=cmd_reproduce)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .training import TrainingDiverged

    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except TrainingDiverged as err:
        print(f"grassflow {args.command}: training diverged: {err}", file=sys.stderr)
        return 3
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"grassflow {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
