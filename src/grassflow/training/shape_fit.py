"""Fitting a shape model to clouds with the generic training loop, the best checkpoint chosen
by the exact validation NLL: a `ShapeFlow` by flow matching (`fit_shape_flow`), an
`InternalFlow` by maximum likelihood (`fit_internal_flow`)."""

from __future__ import annotations

import functools
from pathlib import Path

from torch import Tensor

from ..flows.internal_flow import InternalFlow
from ..flows.shape_flow import ShapeFlow
from ..manifolds.shape_paths import GEOMETRIES, check_full_rank
from .checkpoint import load_checkpoint
from .clock import Stopwatch
from .config import TrainConfig
from .loop import train
from .objectives import nll_objective
from .progress import Progress
from .result import TrainResult
from .shape_matching import CFM_COUPLINGS, cfm_objective

__all__ = ["fit_internal_flow", "fit_shape_flow", "load_shape_flow"]


def fit_shape_flow(
    model: ShapeFlow,
    train_clouds: Tensor,
    val_clouds: Tensor | None,
    run_dir: str | Path,
    config: TrainConfig,
    *,
    coupling: str | None = None,
    geometry: str | None = None,
    progress: bool | Progress = True,
    setup: Stopwatch | None = None,
) -> TrainResult:
    """Train (or continue) ``model`` on ``train_clouds: (N, n, d)`` in ``run_dir`` (packed
    ``(N, n, d + 1)`` with their labels for a model with labels per cloud, as the
    validation clouds; `grassflow.flows.shape_flow.pack_labels`).

    The prior's scale is first fitted to the training clouds (`fit_prior`;
    the same value on resume). ``val_clouds: (M, n, d)`` are scored by the exact
    NLL at ``config``'s validation times, and the best model is ``run_dir/best.pt``.

    Args:
        coupling: of the minibatch pairs, one of `CFM_COUPLINGS` (default the model's
            ``config.coupling``).
        geometry: of the conditional paths, one of `GEOMETRIES` (``"cartesian"``: straight
            lines, EFM's; ``"grassmann"``: span and metric on their own geodesics; default
            the model's ``config.geometry``).
        progress: show progress (or a command's `Progress` line).
        setup: the caller's work before training, charged as `train` says.
    """
    coupling = model.config.coupling if coupling is None else coupling
    geometry = model.config.geometry if geometry is None else geometry
    if coupling not in CFM_COUPLINGS:
        raise ValueError(f"coupling must be one of {CFM_COUPLINGS}, got {coupling!r}")
    if geometry not in GEOMETRIES:
        raise ValueError(f"geometry must be one of {GEOMETRIES}, got {geometry!r}")
    if geometry == "grassmann":  # fail before training, not at the first bad batch
        check_full_rank(model.split_labels(train_clouds, dtype=False)[0], "training clouds")
    model.fit_prior(train_clouds)
    objective = functools.partial(cfm_objective, coupling=coupling, geometry=geometry)
    return train(model, train_clouds, config, run_dir, val_data=val_clouds, objective=objective,
                 resume=True, progress=progress, setup=setup)  # fmt: skip


def fit_internal_flow(
    model: InternalFlow,
    train_clouds: Tensor,
    val_clouds: Tensor | None,
    run_dir: str | Path,
    config: TrainConfig,
    *,
    progress: bool | Progress = True,
    setup: Stopwatch | None = None,
) -> TrainResult:
    """Train (or continue) ``model`` on molecules ``train_clouds: (N, n, 3)`` in ``run_dir`` by
    maximum likelihood (one pass gives the exact density). Its normalization (torsion cuts,
    whitening) is first fitted to the training molecules (the same on resume);
    ``val_clouds: (M, n, 3)`` pick ``best.pt``; ``progress`` and ``setup`` as in
    `fit_shape_flow`."""
    model.fit_normalization(train_clouds)
    return train(model, train_clouds, config, run_dir, val_data=val_clouds,
                 objective=nll_objective, resume=True, progress=progress,
                 setup=setup)  # fmt: skip


def load_shape_flow(
    model: ShapeFlow, run_dir: str | Path, which: str = "best"
) -> ShapeFlow:
    """``model`` with the ``which`` (``"best"`` or ``"last"``) checkpoint of ``run_dir``, cast
    to ``model``'s dtype, in eval mode."""
    ckpt = load_checkpoint(Path(run_dir) / f"{which}.pt", required=("model",))
    model.load_state_dict(ckpt["model"])
    return model.eval()
