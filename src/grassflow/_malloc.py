"""glibc's allocator, set so that torch's large temporaries stop costing kernel time.

The exact divergences (the forward Laplacian's jets, the ``vmap``-ed Jacobian-vector products
through an EGNN) allocate and free tens of MB of temporaries at every ODE step: 16 clouds
x 33 directions x 132 point pairs x 32 features is 18 MB per tensor for a 12-point cloud.
With glibc's defaults (a dynamic mmap threshold capped at 32 MiB, and a trim threshold of
twice the largest freed mmapped block, 64 MiB at most) the heap is given back to the kernel
after a step and faulted in again at the next, page by page, and blocks over 32 MiB (larger
molecules) are mapped and unmapped at every operation. That was more than half the CPU time
of a training run (issue 33: 3.2 s system against 8.5 s user for one exact ``log_prob`` of 16
twelve-point clouds). Smaller or chunked temporaries do not remove it: any per-step working
set above the trim threshold churns (``docs/performance.md``, ``benchmarks/kernel_time.py``).

So at ``import grassflow`` we fix both thresholds at 2 GiB (the largest value ``mallopt``
takes, a C int), as ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` would: large
blocks come from the heap, and freed memory stays with the process for reuse. The price: the
resident size stays near the process's peak instead of falling between calls. Numbers are
unchanged (only where memory comes from changes).

It is skipped (`STATE` says why) where the C library is not glibc, where the user already
tunes glibc's malloc (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_TOP_PAD_``, ``MALLOC_MMAP_MAX_`` or ``glibc.malloc`` in ``GLIBC_TUNABLES``), and
when ``GRASSFLOW_MALLOC=default`` (keep glibc's defaults).
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["ENV", "STATE", "THRESHOLD", "configure"]

ENV = "GRASSFLOW_MALLOC"  # "default": leave glibc's allocator alone
THRESHOLD = 2**31 - 1  # bytes, both thresholds: mallopt's largest (its value is a C int)
_FALLBACK = 32 << 20  # the largest mmap threshold that older glibc accepts on 64-bit
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                  "MALLOC_MMAP_MAX_")  # fmt: skip

STATE: dict = {"applied": False, "reason": "not configured yet"}
"""What `configure` did: ``applied``, ``reason``, and the thresholds it set."""


def _skip_reason() -> str | None:
    value = os.environ.get(ENV, "").strip().lower()
    if value == "default":
        return f"${ENV}=default"
    if value not in ("", "tuned"):
        return f"unknown ${ENV}={value!r} (use 'default' or 'tuned'): left alone"
    if not sys.platform.startswith("linux") or sys.maxsize <= 2**32:
        return "not 64-bit Linux"
    user = [name for name in _USER_SETTINGS if name in os.environ]
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        user.append("GLIBC_TUNABLES")
    if user:
        return f"the environment already tunes malloc ({', '.join(user)})"
    return None


def configure() -> dict:
    """Set glibc's mmap and trim thresholds (see the module docs) unless skipped; idempotent.
    Returns `STATE`."""
    if STATE.get("applied"):
        return STATE
    reason = _skip_reason()
    if reason is not None:
        STATE.update(applied=False, reason=reason)
        return STATE
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl's mallopt does nothing)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        STATE.update(applied=False, reason="not glibc")
        return STATE
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    threshold = THRESHOLD
    # the mmap threshold first: a fixed trim threshold alone would also freeze the mmap
    # threshold at its 128 KiB start, mapping every block above it (far worse)
    if not mallopt(_M_MMAP_THRESHOLD, threshold):
        threshold = _FALLBACK
        if not mallopt(_M_MMAP_THRESHOLD, threshold):
            STATE.update(applied=False, reason="mallopt refused the mmap threshold")
            return STATE
    trim = THRESHOLD
    if not mallopt(_M_TRIM_THRESHOLD, trim):  # pragma: no cover - glibc accepts any value
        STATE.update(applied=False, reason="mallopt refused the trim threshold")
        return STATE
    STATE.update(applied=True, reason="glibc", mmap_threshold=threshold, trim_threshold=trim)
    return STATE
