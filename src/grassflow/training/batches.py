"""Reproducible, resumable streams of training batches.

Two sources: a finite tensor dataset read in shuffled epochs, and an infinite sampler
(e.g. the texture densities). Either way the batch of iteration ``i`` is the same whether
or not the run was interrupted before ``i``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..manifolds import Grassmann
from .rng import derive_seed

__all__ = ["BatchStream", "SamplerBatches", "Sampler", "TensorBatches", "check_points",
           "make_batches", "model_manifold"]  # fmt: skip

Sampler = Callable[[int, torch.Generator], Tensor]
"""``sampler(n, generator) -> (n, D, k)`` draws ``n`` points using ``generator`` (CPU)."""


def model_manifold(model: object) -> Grassmann | None:
    """``model.manifold`` if it is a `Grassmann` (a GrCNF's), else ``None``.

    The training loop passes it to `check_points`, so that a flow on Gr(k, D) is only
    ever fed orthonormal ``(N, D, k)`` points, while other models (e.g. the QM9 scale model,
    trained on raw positions) get the generic checks.
    """
    manifold = getattr(model, "manifold", None)
    return manifold if isinstance(manifold, Grassmann) else None


def check_points(Y: Tensor, name: str, manifold: Grassmann | None = None) -> None:
    """Raise ``ValueError`` unless ``Y`` is a usable training set ``(N, D, k)``.

    Always: a float32/float64 tensor with 3 dimensions, ``N >= 1``, finite. With a
    ``manifold`` Gr(k, D), also: the last two sizes are ``(D, k)`` and every point is
    orthonormal, ``max |Y^T Y - I| <= atol``. Called once per dataset (and on a sampler's
    first batch), never per training step.

    Args:
        Y: the points ``(N, D, k)``, in the dtype they were made in.
        name: what to call ``Y`` in the error message (e.g. ``"train data"``).
        manifold: the model's Gr(k, D), or ``None`` for data that are not Grassmann points.
    """
    shape = tuple(Y.shape) if isinstance(Y, Tensor) else type(Y).__name__
    if not isinstance(Y, Tensor) or not Y.is_floating_point() or Y.dim() != 3:
        dtype = f" {Y.dtype}" if isinstance(Y, Tensor) else ""
        raise ValueError(f"{name} must be a floating tensor of shape (N, D, k), got{dtype} {shape}")
    # float16/bfloat16 points cannot be orthonormal to better than ~1e-3, and training runs
    # in float32 or float64 anyway: make them in (at least) float32
    if Y.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"{name} must be float32 or float64, got {Y.dtype} (shape {shape})")
    if Y.numel() == 0:
        raise ValueError(f"{name} is empty (shape {shape})")
    finite = torch.isfinite(Y)
    if not finite.all():
        bad = int((~finite).sum())
        first = int((~finite).flatten(1).any(1).nonzero()[0, 0])
        raise ValueError(
            f"{name} contains {bad} NaN or inf value(s) (shape {shape}); first in point {first}"
        )
    if manifold is None:
        return
    # The tolerance is Grassmann's default for Y's own dtype, max(1e-7, 1000 eps): 1.2e-4 in
    # float32, 1e-7 in float64. QR/SVD/normalization leave |Y^T Y - I| at a few eps times
    # sqrt(D), far below it, while a point that was never orthonormalized (a scaled point, a
    # raw point cloud) is off by O(1). GrCNF.log_prob applies the same rule to its input,
    # in the training dtype: float32-made data (error ~5e-7) trained in float64 pass here and
    # flow matching is fine with them, but maximum likelihood needs them re-orthonormalized
    # (Grassmann.projx) in float64.
    manifold.check_point(Y, name=name)


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
        device: where batches are moved to.
        dtype: what batches are cast to.
        manifold: if given, the first batch must be orthonormal points of it (see
            `check_points`).
    """

    def __init__(
        self,
        sampler: Sampler,
        batch_size: int,
        seed: int,
        device: torch.device,
        dtype: torch.dtype,
        manifold: Grassmann | None = None,
    ):
        self.sampler, self.batch_size = sampler, batch_size
        self.device, self.dtype, self.manifold = device, dtype, manifold
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
            check_points(Y, "sampler batch", self.manifold)
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
    data: Tensor | Sampler,
    batch_size: int,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
    manifold: Grassmann | None = None,
) -> BatchStream:
    """A ``TensorBatches`` for a tensor ``(N, D, k)``, a ``SamplerBatches`` for a callable.

    The tensor (or the sampler's first batch) is validated by `check_points`, with
    ``manifold`` (the model's Gr(k, D), see `model_manifold`) if given.
    """
    if isinstance(data, Tensor):
        check_points(data, "train data", manifold)
        return TensorBatches(data.to(device=device, dtype=dtype), batch_size, seed)
    if callable(data):
        return SamplerBatches(data, batch_size, seed, device, dtype, manifold)
    raise ValueError(
        f"data must be a tensor (N, D, k) or a sampler(n, generator), got {type(data).__name__}"
    )
