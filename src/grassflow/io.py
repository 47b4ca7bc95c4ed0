"""Atomic file writes: JSON and bytes, shared by every package (data, training, tasks).

A file is written to a temporary file in the same directory, flushed to disk and then renamed
over the old one, so a crash mid-write never leaves a truncated file. Only the standard
library: any module may import this one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_write", "atomic_write_bytes", "write_json"]


def _fsync_dir(directory: Path) -> None:
    # makes the rename itself durable; not supported everywhere (e.g. Windows), so best effort
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write(f)`` on a binary temporary file beside ``path``, then rename it to ``path``
    (fsync first; the temporary file is removed if ``write`` fails)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(data: bytes, path: str | os.PathLike) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write(path, lambda f: f.write(data))


def write_json(obj: Any, path: str | os.PathLike) -> None:
    """Pretty JSON to ``path`` atomically."""
    atomic_write_bytes((json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), path)
