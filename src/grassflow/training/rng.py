"""Seed derivation and capture/restore of the global random number generators.

A resumed run must draw the same random numbers as an uninterrupted one, so every
generator that training touches (torch CPU and CUDA, Python ``random``, NumPy's legacy
global) is stored in the checkpoint and restored on resume.
"""

from __future__ import annotations

import random
from contextlib import contextmanager

import numpy as np
import torch

__all__ = [
    "capture_rng_state", "derive_seed", "isolated_rng", "restore_rng_state", "seed_all",
    "seeded_init",
]  # fmt: skip

# stream names -> spawn keys, so the streams of one seed never overlap
STREAMS = {
    "global": 0, "data": 1, "epoch": 2, "validation": 3, "callback": 4, "sample": 5, "init": 6,
}  # fmt: skip


def derive_seed(seed: int, stream: str, *keys: int) -> int:
    """A 63-bit seed for ``stream`` (e.g. ``"epoch", 7``) derived from the run's ``seed``.

    Uses NumPy's ``SeedSequence`` hashing, so nearby seeds and epochs give unrelated streams.
    """
    ss = np.random.SeedSequence([seed, STREAMS[stream], *keys])
    lo, hi = ss.generate_state(2, dtype=np.uint32)
    return (int(hi) << 32 | int(lo)) & (2**63 - 1)


def seed_all(seed: int) -> None:
    """Seed torch (all devices), Python ``random`` and NumPy's global generator."""
    torch.manual_seed(seed)
    random.seed(seed)
    # the legacy global generator is what stray np.random calls in user code draw from
    np.random.seed(seed % 2**32)  # noqa: NPY002


def capture_rng_state() -> dict:
    """Global generator states as tensors and plain Python objects (``weights_only``-safe)."""
    np_state = np.random.get_state(legacy=False)  # noqa: NPY002
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
    }


def restore_rng_state(state: dict) -> None:
    """Inverse of ``capture_rng_state``. CUDA states are restored if CUDA is available."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    npd = state["numpy"]
    np.random.set_state(  # noqa: NPY002
        {
            "bit_generator": npd["bit_generator"],
            "state": {"key": npd["key"].numpy().astype(np.uint32), "pos": npd["pos"]},
            "has_gauss": npd["has_gauss"],
            "gauss": npd["gauss"],
        }
    )


@contextmanager
def isolated_rng(seed: int, device: torch.device):
    """Run a block with torch's CPU (and ``device``'s CUDA) generator seeded to ``seed``.

    The states are restored afterwards, so work inside (validation, pictures) neither
    consumes training randomness nor depends on when it runs.
    """
    devices = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        torch.default_generator.manual_seed(seed)
        if device.type == "cuda":
            with torch.cuda.device(devices[0]):
                torch.cuda.manual_seed(seed)
        yield


def seeded_init(seed: int):
    """Context for building a model: its initial weights depend on ``seed`` only.

    torch seeds its default generator randomly per process, so without this two runs with
    the same config would start from different weights.
    """
    return isolated_rng(derive_seed(seed, "init"), torch.device("cpu"))
