"""Data parallelism on ``torch.distributed`` for runs launched by ``torchrun``.

Under ``torchrun --nproc_per_node N`` (environment ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``)
`init` joins the process group: gloo for CPU tensors, NCCL for CUDA tensors (one GPU
per rank), with ``$GRASSFLOW_DIST_TIMEOUT_S`` (default 600 s) as the collective timeout, so a
lost peer ends the job instead of hanging it. Without torchrun, or with ``WORLD_SIZE=1``,
every function here is a no-op or the identity: a single-process run is unchanged.

What is sharded (``B`` is the configured, global batch size):

* Training batches: every rank builds the same global batch from the run seed (a shuffled
  index set or a sampler draw) and keeps its contiguous slice of ``B / N`` points
  (`ShardedBatches`); a tensor dataset is read only at this rank's rows.
* Gradients: DistributedDataParallel averages the ranks' gradients; each rank's loss is a
  mean over its shard, weighted by ``N * (its size) / B``, so the step is the global-batch
  mean gradient and the learning rate is unchanged.
* Noise (Hutchinson probes, flow-matching prior points and times): the global RNG of rank
  ``r`` is seeded by ``(seed, r)`` and checkpointed per rank; rank 0's stream is the
  single-process one.
* Evaluation: fixed chunks of ``batch_size`` points are split into contiguous blocks, one per
  rank, and gathered in order (`parallel_eval`); each chunk is solved exactly as a
  single process solves it, so the numbers do not depend on ``N``.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
import warnings

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .batches import BatchStream, TensorBatches

__all__ = [
    "DataParallelStep",
    "ShardedBatches",
    "all_gather_objects",
    "all_reduce_sum",
    "barrier",
    "check_batch_size",
    "device_for",
    "gather",
    "init",
    "is_main",
    "launched",
    "max_over_ranks",
    "quiet_unless_main",
    "rank",
    "shard",
    "shutdown",
    "world",
]

TIMEOUT_ENV = "GRASSFLOW_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0


def launched() -> bool:
    """Whether this process was started by torchrun (or alike) with more than one process."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(timeout_s: float | None = None) -> bool:
    """Join the process group if launched with ``WORLD_SIZE > 1``; idempotent.

    Args:
        timeout_s: collective timeout; default ``$GRASSFLOW_DIST_TIMEOUT_S`` or 600 s.

    Returns:
        Whether this process is now one of several ranks.
    """
    if not launched():
        return False
    if not dist.is_initialized():
        if timeout_s is None:
            timeout_s = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
        backend = "gloo"
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
        if torch.cuda.is_available() and local_world <= torch.cuda.device_count():
            # one GPU per rank: NCCL for CUDA tensors, gloo for CPU ones (e.g. --device cpu)
            backend = "cpu:gloo,cuda:nccl"
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return world() > 1


def shutdown() -> None:
    """Leave the process group (if joined)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _active() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank, 0 without a process group."""
    return dist.get_rank() if _active() else 0


def world() -> int:
    """Number of processes, 1 without a process group."""
    return dist.get_world_size() if _active() else 1


def is_main() -> bool:
    """Whether this process writes files and prints: rank 0 (also before `init`)."""
    if not _active():
        return not launched() or os.environ["RANK"] == "0"
    return rank() == 0


def barrier() -> None:
    """Wait for every rank (no-op in a single process)."""
    if world() > 1:
        dist.barrier()


def device_for(device: torch.device) -> torch.device:
    """``cuda`` without an index -> ``cuda:LOCAL_RANK`` when there are several ranks.

    Raises:
        ValueError: more ranks on this node than visible GPUs.
    """
    if world() == 1 or device.type != "cuda" or device.index is not None:
        return device
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if local >= torch.cuda.device_count():
        raise ValueError(
            f"local rank {local} has no GPU ({torch.cuda.device_count()} visible): start at "
            "most one process per GPU (torchrun --nproc_per_node), or train with --device cpu"
        )
    return torch.device("cuda", local)


def check_batch_size(batch_size: int) -> None:
    """Raise ``ValueError`` unless the global batch splits evenly over the ranks."""
    if batch_size % world():
        raise ValueError(
            f"batch_size {batch_size} is the global batch and must be divisible by the "
            f"{world()} processes (each takes batch_size / {world()}); choose e.g. "
            f"{batch_size - batch_size % world() or world()}"
        )


def shard(x: Tensor) -> Tensor:
    """This rank's contiguous block of ``x`` along dim 0 (sizes differ by at most one)."""
    return x.tensor_split(world())[rank()] if world() > 1 else x


def all_reduce_sum(x: Tensor) -> Tensor:
    """Sum of ``x`` over the ranks (a new tensor; ``x`` itself if there is one rank)."""
    if world() == 1:
        return x
    x = x.clone()
    dist.all_reduce(x)
    return x


def max_over_ranks(value: float) -> float:
    """The largest of the ranks' ``value``, on every rank."""
    if world() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def all_gather_objects(obj) -> list:
    """Every rank's picklable ``obj``, in rank order (``[obj]`` in a single process)."""
    if world() == 1:
        return [obj]
    out = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def gather(x: Tensor) -> Tensor:
    """Concatenation of every rank's ``x`` along dim 0, in rank order, on every rank.

    The ranks' first dimensions may differ; the other dimensions must agree.
    """
    if world() == 1:
        return x
    sizes = torch.tensor([x.shape[0]], device=x.device)
    all_sizes = [torch.empty_like(sizes) for _ in range(world())]
    dist.all_gather(all_sizes, sizes)
    n = [int(s.item()) for s in all_sizes]
    padded = x.new_zeros((max(n), *x.shape[1:]))
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in n]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[:k] for p, k in zip(parts, n)])


@contextlib.contextmanager
def quiet_unless_main():
    """Silence ``stdout`` of ranks other than 0, so that a job prints each line once."""
    if is_main():
        yield
        return
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        yield


class ShardedBatches(BatchStream):
    """This rank's share of an inner stream's global batches.

    Every rank computes the same global batch of iteration ``i`` (the inner stream is seeded
    by the run seed), so the data order is the single-process one. For a tensor dataset
    only this rank's rows are read. After ``batch(i)``, ``fraction`` is this shard's share
    of the global batch (``1 / N`` except for an epoch's short last batch).
    """

    def __init__(self, inner: BatchStream):
        self.inner, self.fraction = inner, 1.0 / world()

    @property
    def shape(self):
        return self.inner.shape

    def batch(self, iteration: int) -> Tensor:
        if isinstance(self.inner, TensorBatches):
            idx = self.inner.indices(iteration)
            mine, total = self.inner.data[shard(idx)], idx.shape[0]
        else:
            full = self.inner.batch(iteration)
            mine, total = shard(full), full.shape[0]
        self.fraction = mine.shape[0] / total
        return mine

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)


class _ObjectiveModule(nn.Module):
    """``forward(batch) = objective(model, batch)``, so that DDP's gradient hooks fire."""

    def __init__(self, model: nn.Module, objective):
        super().__init__()
        self.model, self.objective = model, objective

    def forward(self, batch: Tensor):
        if batch.shape[0] == 0:  # an empty shard still joins the gradient all-reduce
            zero = sum(p.sum() for p in self.model.parameters() if p.requires_grad) * 0.0
            return zero, {}
        return self.objective(self.model, batch)


class DataParallelStep:
    """One data-parallel step of a rank: DDP forward and backward, and the global loss.

    Args:
        model: the model, already on ``device`` (its parameters are the optimizer's).
        objective: ``objective(model, batch) -> (loss, stats)``; the loss must be a mean
            over the batch's points.
        device: the training device.
    """

    def __init__(self, model: nn.Module, objective, device: torch.device):
        ids = [device.index] if device.type == "cuda" else None
        # buffers (prior parameters) are constant: synced once, not before every step
        ddp = nn.parallel.DistributedDataParallel
        new = "forward_sync_buffers" in inspect.signature(ddp.__init__).parameters  # torch 2.13+
        no_sync = {"forward_sync_buffers" if new else "broadcast_buffers": False}
        self.ddp = ddp(_ObjectiveModule(model, objective), device_ids=ids,
                       gradient_as_bucket_view=True, **no_sync)  # fmt: skip

    def loss_and_backward(self, batch: Tensor, fraction: float) -> tuple[float, dict]:
        """Forward and backward of this rank's shard: ``(global-batch loss, rank's stats)``.

        DDP averages gradients over the N ranks, so the local loss is scaled by
        ``N * fraction``: the average is then ``sum_r fraction_r * grad(loss_r)``, the
        gradient of the global-batch mean. The global loss value is summed over the ranks
        while the backward pass runs; every rank runs the backward, so a non-finite loss
        on one rank (whose gradients are then non-finite everywhere) stops every rank.
        """
        loss, stats = self.ddp(batch)
        value = (loss.detach() * fraction).reshape(1)
        pending = dist.all_reduce(value, async_op=True)  # issued before DDP's own, on all
        scale = fraction * world()
        with warnings.catch_warnings():
            # a (1, n) weight's gradient can arrive with strides (1, 1) instead of (n, 1):
            # the same memory layout, which DDP copies (n numbers) but warns about
            warnings.filterwarnings("ignore", message="Grad strides do not match")
            (loss if scale == 1.0 else loss * scale).backward()
        pending.wait()
        return float(value), stats
