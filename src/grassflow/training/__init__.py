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

The shape model (`grassflow.flows.ShapeFlow`) trains by conditional flow matching on point
clouds: `cfm_objective` (`shape_matching`: couplings, equivariant OT, alignment) and
`fit_shape_flow` / `load_shape_flow` (`shape_fit`); `fit_internal_flow` trains a molecule's
`grassflow.flows.InternalFlow` by maximum likelihood.
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
from .shape_fit import fit_internal_flow, fit_shape_flow, load_shape_flow
from .shape_matching import CFM_COUPLINGS, cfm_losses, cfm_objective

__all__ = [
    "CFM_COUPLINGS",
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
    "cfm_losses",
    "cfm_objective",
    "checkpoint_path",
    "distributed_log_prob",
    "distributed_mean_nll",
    "distributed_sample",
    "distributed_transport",
    "fit_internal_flow",
    "fit_shape_flow",
    "load_checkpoint",
    "load_shape_flow",
    "mean_nll",
    "nll_objective",
    "read_metrics",
    "resolve_device",
    "resolve_dtype",
    "save_samples",
    "train",
]
