"""Training: a resumable, budgeted loop generic over models and objectives.

``train(model, data, config, run_dir)`` fits any ``nn.Module`` with
``log_prob(Y: (B, D, k)) -> (B,)`` by maximum likelihood (or a pluggable objective) and
keeps ``config.json``, ``last.pt``, ``best.pt`` and ``metrics.jsonl`` in ``run_dir``.

Example:
    >>> from grassflow.training import TrainConfig, train
    >>> result = train(flow, Y_train, TrainConfig(batch_size=256, budget_minutes=10),
    ...                "runs/my_flow", val_data=Y_val, resume=True)
    >>> result.stopped  # "done" or "budget" (run again to continue)

The same call trains data-parallel under ``torchrun --nproc_per_node N``; see
`grassflow.training.distributed`.
"""

from .batches import Sampler, SamplerBatches, TensorBatches
from .checkpoint import CheckpointError, atomic_save, checkpoint_path, load_checkpoint
from .config import TRAJECTORY_FIELDS, TrainConfig, resolve_device, resolve_dtype
from .flow_matching import COUPLINGS, flow_matching_objective, ot_pairing
from .loop import train
from .metrics_log import read_metrics
from .objectives import OBJECTIVES, Objective, mean_nll, nll_objective
from .parallel_eval import (
    distributed_log_prob,
    distributed_mean_nll,
    distributed_sample,
    distributed_transport,
    save_samples,
)
from .result import TrainingDiverged, TrainingInterrupted, TrainResult

__all__ = [
    "OBJECTIVES",
    "TRAJECTORY_FIELDS",
    "CheckpointError",
    "COUPLINGS",
    "flow_matching_objective",
    "ot_pairing",
    "Objective",
    "Sampler",
    "SamplerBatches",
    "TensorBatches",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "TrainingInterrupted",
    "atomic_save",
    "checkpoint_path",
    "distributed_log_prob",
    "distributed_mean_nll",
    "distributed_sample",
    "distributed_transport",
    "load_checkpoint",
    "mean_nll",
    "nll_objective",
    "read_metrics",
    "resolve_device",
    "resolve_dtype",
    "save_samples",
    "train",
]
