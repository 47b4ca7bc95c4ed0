"""Reproducible, resumable streams of training batches.

Two sources: a finite tensor dataset read in shuffled epochs, and an infinite sampler
(e.g. the texture densities). Either way the batch of iteration ``i`` is the same whether
or not the run was interrupted before ``i``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .rng import derive_seed

__all__ = ["BatchStream", "SamplerBatches", "Sampler", "TensorBatches", "make_batches"]

Sampler = Callable[[int, torch.Generator], Tensor]
"""``sampler(n, generator) -> (n, D, k)`` draws ``n`` points using ``generator`` (CPU)."""


def check_points(Y: Tensor, name: str) -> None:
    """Raise ``ValueError`` unless ``Y`` is a non-empty, finite, floating ``(N, D, k)`` tensor."""
    if not isinstance(Y, Tensor) or not Y.is_floating_point() or Y.dim() != 3:
        shape = tuple(Y.shape) if isinstance(Y, Tensor) else type(Y).__name__
        raise ValueError(f"{name} must be a floating tensor of shape (N, D, k), got {shape}")
    if Y.shape[0] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(Y.shape)})")
    if not torch.isfinite(Y).all():
        raise ValueError(f"{name} contains NaN or inf")


class BatchStream:
    """Interface: ``batch(i)`` is the batch of 0-based iteration ``i``, called in order."""

    shape: tuple[int, int]  # (D, k)

    def batch(self, iteration: int) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class TensorBatches(BatchStream):
    """Shuffled epochs over a dataset ``(N, D, k)``; the last batch of an epoch may be short.

    Epoch ``e`` uses the permutation seeded by ``(seed, e)``, so batch ``i`` is a pure
    function of ``(seed, i)`` and needs no state to resume.

    Args:
        data: training points ``(N, D, k)``, already on the training device and dtype.
        batch_size: points per batch; ``min(batch_size, N)`` are used.
        seed: run seed.
    """

    def __init__(self, data: Tensor, batch_size: int, seed: int):
        self.data, self.seed = data, seed
        self.batch_size = min(batch_size, data.shape[0])
        self.per_epoch = -(-data.shape[0] // self.batch_size)
        self.shape = tuple(data.shape[1:])
        self._epoch, self._perm = -1, None

    def _permutation(self, epoch: int) -> Tensor:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(derive_seed(self.seed, "epoch", epoch))
            self._perm = torch.randperm(self.data.shape[0], generator=g).to(self.data.device)
            self._epoch = epoch
        return self._perm

    def indices(self, iteration: int) -> Tensor:
        """Row indices ``(b,)`` of the batch of iteration ``iteration``."""
        epoch, j = divmod(iteration, self.per_epoch)
        return self._permutation(epoch)[j * self.batch_size : (j + 1) * self.batch_size]

    def batch(self, iteration: int) -> Tensor:
        return self.data[self.indices(iteration)]

    def state_dict(self) -> dict:
        # nothing to restore; kept to detect resuming with a different dataset
        return {"kind": "tensor", "n": self.data.shape[0], "shape": list(self.shape)}

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        if state != mine:
            raise ValueError(f"checkpoint was trained on data {state}, now given {mine}")


class SamplerBatches(BatchStream):
    """Infinite stream ``sampler(batch_size, generator)`` with a seeded CPU generator.

    The generator's state is checkpointed, so a resumed stream continues where it stopped.

    Args:
        sampler: ``(n, torch.Generator) -> (n, D, k)``.
        batch_size: points per batch.
        seed: run seed.
        device, dtype: where batches are moved to.
    """

    def __init__(
        self,
        sampler: Sampler,
        batch_size: int,
        seed: int,
        device: torch.device,
        dtype: torch.dtype,
    ):
        self.sampler, self.batch_size = sampler, batch_size
        self.device, self.dtype = device, dtype
        self.generator = torch.Generator().manual_seed(derive_seed(seed, "data"))
        self.shape = None

    def batch(self, iteration: int) -> Tensor:
        Y = self.sampler(self.batch_size, self.generator)
        if self.shape is None:  # validate once, not in the hot loop
            if not isinstance(Y, Tensor) or Y.dim() != 3 or Y.shape[0] != self.batch_size:
                got = tuple(Y.shape) if isinstance(Y, Tensor) else type(Y).__name__
                raise ValueError(
                    f"sampler({self.batch_size}, generator) must return "
                    f"({self.batch_size}, D, k), got {got}"
                )
            self.shape = tuple(Y.shape[1:])
        return Y.to(device=self.device, dtype=self.dtype)

    def state_dict(self) -> dict:
        return {"kind": "sampler", "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != "sampler":
            kind = state.get("kind")
            raise ValueError(f"checkpoint was trained on a {kind} dataset, not a sampler")
        self.generator.set_state(state["generator"])


def make_batches(
    data: Tensor | Sampler, batch_size: int, seed: int, device: torch.device, dtype: torch.dtype
) -> BatchStream:
    """A ``TensorBatches`` for a tensor ``(N, D, k)``, a ``SamplerBatches`` for a callable."""
    if isinstance(data, Tensor):
        check_points(data, "train data")
        return TensorBatches(data.to(device=device, dtype=dtype), batch_size, seed)
    if callable(data):
        return SamplerBatches(data, batch_size, seed, device, dtype)
    raise ValueError(
        f"data must be a tensor (N, D, k) or a sampler(n, generator), got {type(data).__name__}"
    )
