"""How many intra-op threads torch uses: ``set_threads("auto" | n)``.

Small models (every model in this project's experiments) gain little from a second thread,
and lose a lot when the machine is busy: OpenMP threads wait for each other at every
operation, and one thread that the scheduler parks stalls the rest (``benchmarks/threads.py``:
QM9's flow ran 2.8 steps/s on 2 threads against 104 on 1, with two other busy processes on a
2-core machine). With CPU-time budgets, a second thread never buys more steps per CPU second.
So ``"auto"`` takes one thread per process, unless ``GRASSFLOW_THREADS`` says otherwise.
"""

from __future__ import annotations

import os

import torch

__all__ = ["THREADS_ENV", "resolve_threads", "set_threads"]

THREADS_ENV = "GRASSFLOW_THREADS"
"""Environment variable read by ``"auto"``: a positive integer."""


def resolve_threads(spec: int | str = "auto") -> int:
    """The thread count ``spec`` stands for: a positive integer as is; ``"auto"``:
    ``$GRASSFLOW_THREADS`` if set, else 1."""
    if spec == "auto":
        spec = os.environ.get(THREADS_ENV, "1")
    try:
        n = int(spec)
    except (TypeError, ValueError):
        n = 0
    if isinstance(spec, bool) or n < 1 or str(n) != str(spec).strip():
        raise ValueError(f"threads must be 'auto' or a positive integer, got {spec!r}"
                         + (f" (from ${THREADS_ENV})" if os.environ.get(THREADS_ENV) else ""))
    return n


def set_threads(spec: int | str = "auto") -> int:
    """Set torch's intra-op threads to ``resolve_threads(spec)``; returns the count."""
    n = resolve_threads(spec)
    torch.set_num_threads(n)
    return n
