"""What made a result file: the command line of a study's run, and the "Made by" lines of its
Markdown table.

The studies in ``experiments/`` store the command that made each result (a ``"command"``
field in the JSON, per row where rows accumulate over several runs) and print it at the top
of the Markdown file, so that every number can be traced to the one command that made it.
Rows written by hand for runs made before a study recorded its command also carry
``"made_at"``, the commit that added them.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterable, Sequence

__all__ = ["command", "made_by"]

ENVIRONMENT = ("PYTHONPATH", "OMP_NUM_THREADS")  # the variables a recorded command keeps


def command(argv: Sequence[str] | None = None) -> str:
    """This process's command line as typed at the repository root, e.g.
    ``PYTHONPATH=src python experiments/two_part/gram_bound.py --minutes 5``.

    Args:
        argv: the script and its arguments (default ``sys.argv``); the script's path is made
            relative to the working directory.
    """
    script, *args = sys.argv if argv is None else argv
    env = [f"{k}={os.environ[k]}" for k in ENVIRONMENT if k in os.environ]
    return shlex.join([*env, "python", os.path.relpath(script), *args])


def made_by(rows: Iterable[dict]) -> str:
    """The Markdown lines that open a result table: each distinct ``command`` of its rows (with
    ``made_at``, where given), in the rows' order, then a blank line."""
    seen = dict.fromkeys((r.get("command", "unknown"), r.get("made_at")) for r in rows)
    items = [f"`{c}`" + (f" (at commit {at})" if at else "") for c, at in seen]
    text = f"Made by: {items[0]}\n" if len(items) == 1 else \
        "Made by:\n\n" + "".join(f"- {item}\n" for item in items)  # fmt: skip
    if any(at for _, at in seen):
        text += ("\nCommands given with a commit were written by hand (issue 42) for rows made "
                 "before the study recorded its command, from the docs and the git history; the "
                 "commit (`made_at` in the JSON) is the one that added the row. Until issue 42 "
                 "most studies lived in `benchmarks/`, under the same file names.\n")  # fmt: skip
    return text + "\n"
