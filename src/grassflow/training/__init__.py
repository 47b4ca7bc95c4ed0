"""Training: a resumable, budgeted loop generic over models and objectives.

``train(model, data, config, run_dir)`` fits any ``nn.Module`` with
``log_prob(Y: (B, D, k)) -> (B,)`` by maximum likelihood (or a pluggable objective) and
keeps ``config.json``, ``last.pt``, ``best.pt`` and ``metrics.jsonl`` in ``run_dir``.

Example:
    >>> from grassflow.training import TrainConfig, train
    >>> result = train(flow, Y_train, TrainConfig(batch_size=256, budget_minutes=10),
    ...                "runs/my_flow", val_data=Y_val, resume=True)
    >>> result.stopped  # "done" or "budget" (run again to continue)

`train_shape_flow` fits both parts of a `ShapeFlow` with it.
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
from .shape_fit import GramTerm, load_shape_flow, train_shape_flow

__all__ = [
    "OBJECTIVES",
    "TRAJECTORY_FIELDS",
    "CheckpointError",
    "GramTerm",
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
    "load_shape_flow",
    "mean_nll",
    "nll_objective",
    "read_metrics",
    "resolve_device",
    "resolve_dtype",
    "save_samples",
    "train",
    "train_shape_flow",
]
