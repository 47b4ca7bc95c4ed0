"""Fitting a `ShapeFlow`: its two parts, each trained resumably in
its own directory, and loading them back.

The Cartesian NLL of a ShapeFlow is the sum of its Grassmann part, its Gram part and a term of
the data alone, so each part can be trained (and its checkpoint picked by its validation
NLL) on its own, as the whole would be.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from ..flows import ShapeFlow
from ..manifolds.shape_space import shape_factor
from .checkpoint import checkpoint_path, load_checkpoint
from .config import TrainConfig
from .loop import train
from .objectives import OBJECTIVES
from .progress import Progress
from .result import TrainResult

__all__ = ["GramTerm", "load_shape_flow", "train_shape_flow"]


class GramTerm(nn.Module):
    """``log_prob(P)`` = the Gram density's term of `ShapeFlow.log_prob` (for training
    it alone by maximum likelihood; it holds no flow parameters)."""

    def __init__(self, model: ShapeFlow):
        super().__init__()
        self.gram = model.gram
        self.register_buffer("H", model.H.clone(), persistent=False)  # follows .to(device)

    def log_prob(self, P: Tensor) -> Tensor:
        Y, lam, _ = shape_factor(self.H.mT @ (P - P.mean(dim=-2, keepdim=True)))
        return self.gram.log_prob(torch.diag_embed(lam), Y)


def train_shape_flow(
    model: ShapeFlow,
    train_clouds: Tensor,
    val_clouds: Tensor,
    run_dir: str | Path,
    flow: TrainConfig,
    gram: TrainConfig,
    *,
    objective: str = "fm",
    n_val_flow: int | None = None,
    progress: bool | Progress = True,
) -> tuple[TrainResult, TrainResult]:
    """Train (or continue) both parts of ``model``, each resumably in its own directory.

    First the flow on the canonical representatives of the training clouds' spans, by
    ``objective`` (``"fm"``, ``"fm-ot"`` or ``"mle"``) with ``flow``, in ``run_dir/flow``;
    then the Gram density by maximum likelihood (`GramTerm`) with ``gram``, in
    ``run_dir/gram``. A fresh Gram density first takes the training clouds' mean scale
    (its ``initialize``); a resumed one continues from its checkpoint.

    Args:
        model: the `ShapeFlow`, in the clouds' dtype; each part is moved in place to
            its configuration's device and dtype.
        train_clouds: ``(N, n, d)`` clouds (any translation).
        val_clouds: ``(M, n, d)`` clouds (any translation).
        run_dir: the run directory (``flow/`` and ``gram/`` are made in it).
        flow: the flow's training configuration.
        gram: the Gram density's training configuration.
        objective: the flow's.
        n_val_flow: validation clouds for the flow's exact NLL (None: all); the Gram density
            is validated on all of them.
        progress: show progress (or a command's `Progress` line, shared by both parts).

    Returns:
        The two parts' `TrainResult`: the flow's, then the Gram density's.
    """
    run_dir = Path(run_dir)
    Y_train, S_train = model.factor(train_clouds)
    Y_val = model.factor(val_clouds[:n_val_flow])[0]
    model.gram.initialize(S_train, Y_train)
    flow_result = train(model.flow, Y_train, flow, run_dir / "flow", val_data=Y_val,
                        objective=OBJECTIVES[objective], resume=True, progress=progress)
    gram_result = train(GramTerm(model), train_clouds, gram, run_dir / "gram",
                        val_data=val_clouds, objective=OBJECTIVES["mle"], resume=True,
                        progress=progress)  # fmt: skip
    return flow_result, gram_result


def load_shape_flow(model: ShapeFlow, run_dir: str | Path, which: str = "best") -> ShapeFlow:
    """``model`` with the ``which`` checkpoint of each part trained by
    `train_shape_flow` in ``run_dir`` (cast to ``model``'s dtype), in eval mode."""
    run_dir = Path(run_dir)
    for part, module in (("flow", model.flow), ("gram", model.gram)):
        ckpt = load_checkpoint(checkpoint_path(run_dir / part, which), required=("model",))
        state = ckpt["model"]
        if part == "gram":  # saved from a GramTerm
            state = {k.removeprefix("gram."): v for k, v in state.items()}
        module.load_state_dict(state)
    return model.eval()
