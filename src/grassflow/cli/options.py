"""Options shared by the command groups of ``grassflow`` (and of packages that add groups)."""

from __future__ import annotations

import argparse
import dataclasses

__all__ = [
    "DEBUG_ENV", "MODEL_FIELDS", "OBJECTIVE_NAMES", "PARTICLE_SYSTEMS", "Subcommands",
    "add_minutes_option", "add_particle_data_options", "add_texture_preset", "add_train_options",
    "apply_overrides",
    "debug_option", "threads_option",
]  # fmt: skip

DEBUG_ENV = "GRASSFLOW_DEBUG"
"""Environment variable: set to anything but ``""`` or ``"0"`` to act as ``--debug``."""

PARTICLE_SYSTEMS = ("dw4", "lj13")
OBJECTIVE_NAMES = ("mle", "fm", "fm-ot")


def add_particle_data_options(g) -> None:
    g.add_argument("--source", default="generated", choices=("generated", "klein", "enf"),
                   help="file layout: `grassflow data make` output, Klein et al. or E-NF")
    g.add_argument("--data-dir", default="data", help="directory holding the source's files")


def add_minutes_option(
    p, default: float | None = None, old: tuple[str, ...] = (), dest: str = "minutes",
    flag: str = "--minutes",
    what: str = "training CPU minutes of the run (validation and evaluation not charged)",
) -> None:
    """The budget option (``--minutes``): a run's training budget in total over invocations,
    so that a larger value continues the run. ``old`` spellings stay as hidden aliases."""
    p.add_argument(flag, dest=dest, type=float, default=default,
                   help=f"{what}, in total over reruns (a larger value continues the run; "
                        "--clock wall: wall-clock minutes)")  # fmt: skip
    for name in old:  # first the option above, so that its default wins
        p.add_argument(name, dest=dest, type=float, help=argparse.SUPPRESS)


def add_train_options(
    p: argparse.ArgumentParser, run_minutes: bool = True, minutes_what: str | None = None
) -> None:
    """Overrides of a preset's training; ``run_minutes``: with ``--minutes`` (commands whose
    own ``--minutes`` means something else pass False), ``minutes_what`` its help."""
    g = p.add_argument_group("overrides of the preset (paper values by default)")
    p.set_defaults(run_minutes=run_minutes)
    if run_minutes:
        add_minutes_option(g, what=minutes_what or "CPU minutes of training and validation")
    g.add_argument(
        "--session-minutes", "--budget-minutes", dest="session_minutes", type=float,
        help="at most this many training CPU minutes in this invocation (--budget-minutes: "
             "its former name)",
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


def add_texture_preset(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="fourier", choices=("fourier", "paper"),
                   help="textures: fourier (default), Fourier HorP features trained by flow "
                        "matching, which resolve thin structure such as spiral arms; paper, the "
                        "paper's model and objective (maximum likelihood)")  # fmt: skip


MODEL_FIELDS = ("objective", "divergence", "method", "atol", "rtol", "sigma")


def apply_overrides(exp, args):
    """``exp`` with the preset overrides of `add_train_options` that ``args`` set."""
    train_fields = {
        "total_budget_minutes": args.minutes if args.run_minutes else None,
        "budget_minutes": args.session_minutes,
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


def debug_option(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument(
        "--debug", action="store_true", default=default,
        help=f"on an error, print the full traceback (also: {DEBUG_ENV}=1)",
    )


def threads_option(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument(
        "--threads", default=default, metavar="N|auto",
        help="torch intra-op threads per process; auto (default): 1, or $GRASSFLOW_THREADS. "
             "One thread does the most work per CPU second and does not stall when the "
             "machine is busy; more threads speed up large models on an idle machine",
    )  # fmt: skip


class Subcommands:
    """``add_parser`` that also accepts the global ``--debug`` and ``--threads`` after the
    subcommand."""

    def __init__(self, action):
        self.action = action
        self.common = argparse.ArgumentParser(add_help=False)
        # SUPPRESS: a subcommand without the option leaves the top-level value alone
        debug_option(self.common, argparse.SUPPRESS)
        threads_option(self.common, argparse.SUPPRESS)

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        return self.action.add_parser(name, parents=[self.common], **kwargs)

    def add_subparsers(self, parser: argparse.ArgumentParser, **kwargs) -> Subcommands:
        return Subcommands(parser.add_subparsers(**kwargs))
