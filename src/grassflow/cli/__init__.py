"""Command line: ``grassflow {demo,train,eval,sample,plot,data}``, and the command groups that
installed packages add through the entry-point group `ENTRY_POINTS` (``reproduce``, from
the paper's reproduction package ``grassflow_paper``).

Each group lives in its own module (`run_commands`, `data_commands`) with an
``add_commands(sub)`` that adds its parsers to the `options.Subcommands` ``sub``.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from importlib.metadata import entry_points

from . import data_commands, run_commands
from .options import DEBUG_ENV, Subcommands, debug_option, threads_option

__all__ = ["DEBUG_ENV", "ENTRY_POINTS", "USER_ERRORS", "build_parser", "main"]

ENTRY_POINTS = "grassflow.commands"
"""Entry-point group of command groups: each value is an ``add_commands(sub)`` function."""

USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, IsADirectoryError,
               NotADirectoryError, PermissionError)
"""Exceptions reported as a one-line error (exit code 2): bad arguments, input files or run
directories, and the library's validation ``ValueError``s. Anything else is a bug and keeps
its traceback. ``--debug`` (or ``$GRASSFLOW_DEBUG=1``) shows the traceback of these too."""


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command, those of installed packages included."""
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="grassflow", description="Continuous normalizing flows on Grassmann manifolds."
    )
    parser.add_argument("--version", action="version", version=f"grassflow {__version__}")
    debug_option(parser, False)
    threads_option(parser, "auto")
    sub = Subcommands(parser.add_subparsers(dest="command", required=True))
    run_commands.add_commands(sub)
    for ep in sorted(entry_points(group=ENTRY_POINTS), key=lambda ep: ep.name):
        try:
            add = ep.load()
        except ModuleNotFoundError as err:  # metadata of a package since removed
            print(f"grassflow: skipping the {ep.name!r} commands: {err}", file=sys.stderr)
            continue
        add(sub)
    data_commands.add_commands(sub)
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

    0: done. 2: a user error (`USER_ERRORS`: bad arguments, missing or existing files,
    invalid values), reported in one line. 3: training diverged. 130: Ctrl-C, reported in
    one line that says what was saved and how to go on. Other exceptions propagate with
    their traceback. Under torchrun the process group is left in every case.
    """
    import torch

    from ..training import TrainingDiverged, TrainingInterrupted
    from ..training import distributed as dd
    from ..training.threads import set_threads

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
    except KeyboardInterrupt as err:
        if isinstance(err, TrainingInterrupted):
            again = " with --resume" if args.command == "train" else ""
            what = f"{err}; rerun the same command{again} to continue"
        else:
            what = "interrupted before its results were written"
        print(f"\ngrassflow {args.command}: {what}", file=sys.stderr)
        return 130
    except USER_ERRORS as err:
        _report(args, "error", err)
        return 2
    finally:
        dd.shutdown()
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
