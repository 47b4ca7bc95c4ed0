"""Evaluation sharded over the ranks of a torchrun job: log-densities, transports, samples.

The points are cut into fixed chunks of ``batch_size`` (the unit of an adaptive ODE solve:
one step size serves a chunk), the chunks into contiguous blocks, one block per rank, and
the results are gathered in the original order on every rank. Each chunk is solved as a
single process solves it, so the results do not depend on the number of ranks. In a single
process every function here is a plain loop over the chunks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
from torch import Tensor, nn

from . import distributed as dd
from .objectives import mean_nll, model_stats
from .rng import derive_seed

__all__ = ["distributed_log_prob", "distributed_mean_nll", "distributed_sample",
           "distributed_transport", "save_samples"]  # fmt: skip


def _my_chunks(n: int, batch_size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of this rank's chunks of ``range(n)``."""
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    ids = torch.arange(math.ceil(n / batch_size)).tensor_split(dd.world())[dd.rank()]
    return [(j * batch_size, min(n, (j + 1) * batch_size)) for j in ids.tolist()]


def _map_chunks(
    model: nn.Module, fn: Callable[[Tensor], Tensor], X: Tensor, batch_size: int, empty: Tensor
) -> tuple[Tensor, list[float]]:
    """``fn`` over this rank's chunks of ``X``; the gathered results and per-chunk NFEs."""
    outs, nfes = [], []
    with torch.no_grad():
        for a, b in _my_chunks(X.shape[0], batch_size):
            outs.append(fn(X[a:b]))
            nfe = model_stats(model).get("nfe")
            nfes.append(math.nan if nfe is None else float(nfe))
    nfes = dd.gather(torch.tensor(nfes, dtype=torch.float64)).tolist()
    return dd.gather(torch.cat(outs) if outs else empty), nfes


def distributed_log_prob(
    model: nn.Module, Y: Tensor, batch_size: int, with_nfe: bool = False
) -> Tensor | tuple[Tensor, list[float]]:
    """``model.log_prob`` of ``Y: (N, D, k)`` -> ``(N,)``, chunk by chunk, on every rank.

    Runs under ``torch.no_grad()`` in the model's current mode (use ``model.eval()`` for the
    exact divergence). With ``with_nfe``, also returns every chunk's ODE function
    evaluations (``model.last_stats["nfe"]``, NaN where the model keeps none), in order.
    """
    logp, nfes = _map_chunks(model, model.log_prob, Y, batch_size, Y.new_empty(0))
    return (logp, nfes) if with_nfe else logp


def distributed_transport(model: nn.Module, Y0: Tensor, batch_size: int) -> Tensor:
    """``model.transport_forward`` of prior points ``Y0: (n, D, k)``, chunk by chunk.

    With ``Y0 = model.sample_prior(n, generator)`` drawn identically on every rank, this is
    ``model.sample`` sharded: the samples are the same for any number of ranks.
    """
    return _map_chunks(model, model.transport_forward, Y0, batch_size, Y0[:0])[0]


def distributed_mean_nll(model: nn.Module, Y: Tensor, batch_size: int) -> float:
    """`mean_nll` with the chunks shared among the ranks.

    The per-chunk sums are gathered and added in chunk order, as a single process adds
    them, so the value is the single-process one.
    """
    if dd.world() == 1:
        return mean_nll(model, Y, batch_size)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            sums = [-model.log_prob(Y[a:b]).detach().sum().item()
                    for a, b in _my_chunks(Y.shape[0], batch_size)]  # fmt: skip
    finally:
        model.train(was_training)
    total = 0.0
    for value in dd.gather(torch.tensor(sums, dtype=torch.float64)).tolist():
        total += value
    return total / Y.shape[0]


def distributed_sample(model: nn.Module, n: int, seed: int) -> tuple[Tensor, Tensor]:
    """``n`` samples ``(n, D, k)`` and their log-densities ``(n,)``, gathered on every rank.

    One process draws them as ``model.sample_with_log_prob(n, Generator(seed))``. N ranks
    each draw a contiguous share with their own generator, seeded by ``(seed, rank)``: the
    samples then differ from the single-process ones, but are the same for a given N.
    """
    if dd.world() == 1:
        with torch.no_grad():
            return model.sample_with_log_prob(n, torch.Generator().manual_seed(seed))
    if not (isinstance(n, int) and n >= 1):
        raise ValueError(f"number of samples must be an integer >= 1, got {n!r}")
    mine = len(torch.arange(n).tensor_split(dd.world())[dd.rank()])
    ref = model.prior_mean
    Y, logp = ref.new_empty((0, *ref.shape)), ref.new_empty(0)
    if mine:
        g = torch.Generator().manual_seed(derive_seed(seed, "sample", dd.rank()))
        with torch.no_grad():
            Y, logp = model.sample_with_log_prob(mine, g)
    return dd.gather(Y), dd.gather(logp)


def save_samples(model: nn.Module, n: int, seed: int, out: str | os.PathLike) -> str | None:
    """Draw ``n`` samples of a GrCNF and their log-densities to the ``.npz`` file ``out``
    (arrays ``Y: (n, D, k)`` and ``log_prob: (n,)``). Under torchrun each rank draws a share
    with its own seed and rank 0 writes; returns what was written (None on other ranks)."""
    import numpy as np

    Y, logp = distributed_sample(model, n, seed)
    if not dd.is_main():
        return None
    np.savez(out, Y=Y.cpu().numpy(), log_prob=logp.cpu().numpy())
    return f"wrote {n} samples (Y: {tuple(Y.shape)}, log_prob) to {out}"
