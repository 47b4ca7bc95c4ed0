"""The run's metrics log: one JSON object per line in ``metrics.jsonl``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from torch import Tensor

from .checkpoint import atomic_write_bytes

__all__ = ["MetricsLog", "make_record", "read_metrics"]


def _jsonable(value: Any) -> Any:
    # NaN / inf are not JSON; a tensor scalar becomes a number
    if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All records of a ``metrics.jsonl`` file, in order (empty if it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class MetricsLog:
    """Appends records to ``metrics.jsonl``; earlier invocations' lines are kept.

    Args:
        path: the JSONL file.
        keep_until: drop existing records with ``iteration > keep_until``: after a crash
            they describe steps past the checkpoint that the resumed run will redo.
    """

    def __init__(self, path: str | os.PathLike, keep_until: int):
        self.path = Path(path)
        records = read_metrics(self.path)
        kept = [r for r in records if r.get("iteration", 0) <= keep_until]
        if len(kept) != len(records):
            text = "".join(json.dumps(r) + "\n" for r in kept)
            atomic_write_bytes(text.encode(), self.path)

    def append(self, record: dict[str, Any]) -> None:
        """Write one record (non-finite floats become ``null``) and flush it."""
        clean = {key: _jsonable(value) for key, value in record.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")


def make_record(
    done: int, loss: float, stats: dict, lr: float, grad_norm: float, elapsed: float
) -> dict[str, Any]:
    """One metrics line: the step's values plus the objective's extra scalar stats."""
    record = {
        "iteration": done,
        "loss": loss,
        "nfe": stats.get("nfe"),
        "lr": lr,
        "grad_norm": grad_norm,
        "elapsed": elapsed,
    }
    for key, value in stats.items():  # extra scalar stats of the objective
        if key not in record and isinstance(value, (int, float, Tensor)):
            if not isinstance(value, Tensor) or value.numel() == 1:
                record[key] = value
    return record
