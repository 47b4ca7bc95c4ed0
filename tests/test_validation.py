"""Data are validated once, at the boundary: training (every objective), log_prob, loaders.

Each case names the failure it provokes; the error must be a ``ValueError`` that says what is
wrong, with the offending shape or value, before anything is trained or written.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from grassflow.data import qm9
from grassflow.data.particle_files import load_splits
from grassflow.data.textures import lift_to_grassmann
from grassflow.flows import GrCNF
from grassflow.manifolds import Grassmann
from grassflow.manifolds.shape_space import to_grassmann
from grassflow.nn import GrassmannField, Potential
from grassflow.training import OBJECTIVES, TrainConfig, train
from grassflow.training.batches import check_points, model_manifold

GR = Grassmann(2, 4)


def tiny_flow() -> GrCNF:
    torch.manual_seed(0)
    return GrCNF(GR, GrassmannField(Potential(4, 2, (8,))), atol=1e-6, rtol=1e-6).double()


def points(n: int = 12, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    return GR.random(n, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def config(**changes) -> TrainConfig:
    base = dict(lr=1e-3, batch_size=4, iterations=2, log_every=1, val_every=None,
                checkpoint_every=2, seed=0, device="cpu", dtype="float64")  # fmt: skip
    return TrainConfig(**{**base, **changes})


def with_value(Y: torch.Tensor, value: float) -> torch.Tensor:
    Y = Y.clone()
    Y[3, 1, 0] = value
    return Y


# (name, make bad points from good ones (N, 4, 2), expected message)
BAD = [
    ("off-manifold", lambda Y: 2 * Y, r"not orthonormal: max \|Y\^T Y - I\| = 3 > atol = 1e-07"),
    ("slightly off", lambda Y: Y + 1e-5, r"not orthonormal: max \|Y\^T Y - I\| = \d"),
    ("nan", lambda Y: with_value(Y, math.nan), r"1 NaN or inf value\(s\) \(shape \(12, 4, 2\)\)"),
    ("inf", lambda Y: with_value(Y, math.inf), r"1 NaN or inf value\(s\).*first in point 3"),
    ("empty", lambda Y: Y[:0], r"empty \(shape \(0, 4, 2\)\)"),
    ("integer", lambda Y: Y.round().long(), r"floating tensor .*torch.int64 \(12, 4, 2\)"),
    ("float16", lambda Y: Y.half(), r"float32 or float64, got torch.float16"),
    ("wrong k", lambda Y: Y[..., :1], r"shape \(\.\.\., 4, 2\) for Gr\(2, 4\), got \(12, 4, 1\)"),
    ("not 3-D", lambda Y: Y[0], r"shape \(N, D, k\), got torch.float64 \(4, 2\)"),
]  # fmt: skip
IDS = [name for name, _, _ in BAD]


# ------------------------------------------------------------------ training
@pytest.mark.parametrize("objective", ["mle", "fm", "fm-ot"])
@pytest.mark.parametrize("name,make,message", BAD, ids=IDS)
def test_train_rejects_bad_data_before_training(tmp_path, objective, name, make, message):
    # catches flow matching (which never calls log_prob) regressing onto points that are not
    # on Gr(k, D), and a check done lazily, after steps were taken or files written
    with pytest.raises(ValueError, match="train data .*" + message):
        train(tiny_flow(), make(points()), config(), tmp_path / "run",
              objective=OBJECTIVES[objective], progress=False)  # fmt: skip
    assert list((tmp_path / "run").iterdir()) == []  # nothing trained, nothing written


@pytest.mark.parametrize("name,make,message", BAD, ids=IDS)
def test_train_rejects_bad_val_data_up_front(tmp_path, name, make, message):
    # catches val_data checked only at the first validation, after the training was spent
    with pytest.raises(ValueError, match="val_data .*" + message):
        train(tiny_flow(), points(), config(), tmp_path / "run", val_data=make(points(seed=1)),
              objective=OBJECTIVES["fm"], progress=False)  # fmt: skip
    assert list((tmp_path / "run").iterdir()) == []


# the sampler's size and rank are checked first, with their own message
SAMPLER_SHAPE = {"empty": r"\(0, 4, 2\)", "not 3-D": r"\(4, 2\)"}


@pytest.mark.parametrize("name,make,message", BAD, ids=IDS)
def test_train_rejects_a_bad_first_sampler_batch(tmp_path, name, make, message):
    # catches a sampler stream whose batches are moved to the training dtype unchecked
    def sampler(n, generator):
        return make(GR.random(n, generator=generator))

    match = "sampler batch .*" + message
    if name in SAMPLER_SHAPE:
        match = r"sampler\(12, generator\) must return \(12, D, k\), got " + SAMPLER_SHAPE[name]
    with pytest.raises(ValueError, match=match):
        train(tiny_flow(), sampler, config(batch_size=12), tmp_path / "run",
              objective=OBJECTIVES["fm"], progress=False)  # fmt: skip
    assert not (tmp_path / "run" / "last.pt").exists()


@pytest.mark.parametrize("objective", ["mle", "fm"])
def test_train_accepts_orthonormal_data_of_either_precision(tmp_path, objective):
    # catches a tolerance too tight for data orthonormalized in float32 (or in float64 by QR)
    data = points(dtype=torch.float32) if objective == "fm" else points()
    result = train(tiny_flow(), data, config(), tmp_path / "run", val_data=points(6, 1),
                   objective=OBJECTIVES[objective], progress=False)  # fmt: skip
    assert result.iterations == 2 and math.isfinite(result.final_loss)


def test_float32_tolerance_still_rejects_unnormalized_points():
    # catches a float32 tolerance so loose that an unnormalized point passes
    Y = points(dtype=torch.float32)
    check_points(Y, "train data", GR)
    with pytest.raises(ValueError, match=r"max \|Y\^T Y - I\| = 0\.0\d+ > atol = 0\.000119"):
        check_points(Y * 1.01, "train data", GR)


def test_generic_models_get_only_the_generic_checks():
    # catches orthonormality demanded of models that are not flows on Gr(k, D) (the QM9
    # scale model trains on raw positions)
    positions = torch.randn(5, 19, 3)
    assert model_manifold(torch.nn.Linear(2, 2)) is None and model_manifold(tiny_flow()) is GR
    check_points(positions, "train data")
    with pytest.raises(ValueError, match="NaN"):
        check_points(with_value(positions, math.nan), "train data")


# ------------------------------------------------------------------ log_prob
LOG_PROB_BAD = [
    ("off-manifold", lambda Y: 2 * Y, r"Y is not orthonormal: max \|Y\^T Y - I\| = 3"),
    ("nan", lambda Y: with_value(Y, math.nan), "Y contains NaN or inf"),
    ("inf", lambda Y: with_value(Y, -math.inf), "Y contains NaN or inf"),
    ("empty", lambda Y: Y[:0], r"empty batch \(shape \(0, 4, 2\)\)"),
    ("integer", lambda Y: Y.round().long(), "floating-point tensor, got dtype torch.int64"),
    ("float32", lambda Y: Y.float(), r"dtype torch.float32 on cpu, but the flow is torch.float64"),
    ("device", lambda Y: Y.to("meta"), r"on meta, but the flow is torch.float64 on cpu"),
    ("wrong k", lambda Y: Y[..., :1], r"shape \(\.\.\., 4, 2\) for Gr\(2, 4\), got \(12, 4, 1\)"),
]  # fmt: skip


@pytest.mark.parametrize("name,make,message", LOG_PROB_BAD, ids=[b[0] for b in LOG_PROB_BAD])
def test_log_prob_rejects_bad_points(name, make, message):
    # catches a density silently evaluated at a non-point, in the wrong precision, or a
    # device mismatch that surfaces as a RuntimeError deep in the solver
    model = tiny_flow().eval()
    with pytest.raises(ValueError, match=message):
        model.log_prob(make(points()))


# ------------------------------------------------------------------ loaders
def _particle_file(tmp_path, name):
    rows = np.random.default_rng(0).normal(size=(30, 8))
    if name == "nan":
        rows[2, 5] = np.nan
    elif name == "inf":
        rows[4, 0] = -np.inf
    elif name == "empty":
        rows = rows[:0]
    elif name == "shape":
        rows = rows[:, :7]
    elif name == "dtype":
        rows = rows.astype(np.complex128)
    np.save(tmp_path / "dw4.npy", rows)


@pytest.mark.parametrize(
    "name,message",
    [("nan", r"dw4.npy: 1 NaN or inf"), ("inf", r"dw4.npy: 1 NaN or inf"),
     ("empty", r"dw4.npy has 0 rows"), ("shape", r"dw4.npy: expected rows of 8"),
     ("dtype", r"dw4.npy: expected real numbers, got dtype complex128")],
)  # fmt: skip
def test_particle_files_reject_bad_arrays(tmp_path, name, message):
    # catches NaN/inf or malformed rows reaching the Grassmann map unnamed
    _particle_file(tmp_path, name)
    with pytest.raises(ValueError, match=message):
        load_splits("dw4", "generated", tmp_path, n_train=10, n_val=5, n_test=5)


def _qm9_cache(tmp_path, name):
    rng = np.random.default_rng(0)
    arrays = {"format_version": np.array(qm9.CACHE_VERSION)}
    for split in qm9.SPLITS:
        m = 0 if name == "empty" and split == "valid" else 3
        arrays[split] = rng.normal(size=(m, qm9.N_ATOMS, 3))
        arrays[f"{split}_index"] = np.arange(1, m + 1)
        arrays[f"{split}_charges"] = np.ones((m, qm9.N_ATOMS), dtype=np.int64)
    if name == "nan":
        arrays["train"][1, 4, 2] = np.nan
    elif name == "inf":
        arrays["test"][2, 0, 0] = np.inf
    elif name == "integer positions":
        arrays["train"] = arrays["train"].astype(np.int64)
    elif name == "float charges":
        arrays["valid_charges"] = arrays["valid_charges"].astype(np.float64)
    elif name == "shape":
        arrays["train"] = arrays["train"][:, :18]
    np.savez(tmp_path / qm9.CACHE_NAME, **arrays)


@pytest.mark.parametrize(
    "name,message",
    [("nan", r"1 train molecule\(s\) with NaN or inf positions, first at row 1"),
     ("inf", r"1 test molecule\(s\) with NaN or inf positions, first at row 2"),
     ("empty", r"split 'valid' is empty"),
     ("integer positions", r"train positions have dtype int64, not floating"),
     ("float charges", r"valid_charges has dtype float64, not integer"),
     ("shape", r"train arrays have shapes \(3, 18, 3\)")],
)  # fmt: skip
def test_qm9_cache_rejects_bad_arrays(tmp_path, monkeypatch, name, message):
    # catches a corrupt or hand-made cache reaching training with NaN or empty splits
    _qm9_cache(tmp_path, "good")
    monkeypatch.setattr(qm9, "_build", lambda progress: pytest.fail("cache not used"))
    assert len(qm9.load_qm9_positional(tmp_path, progress=False)["valid"]) == 3
    _qm9_cache(tmp_path, name)
    path = re.escape(str(tmp_path / qm9.CACHE_NAME))
    with pytest.raises(ValueError, match=f"QM9 cache {path}.*{message}"):
        qm9.load_qm9_positional(tmp_path, progress=False)


@pytest.mark.parametrize(
    "xy,message",
    [(np.array([[0.1, 0.2], [np.nan, 0.0]]), r"1 row\(s\) with NaN or inf .*first at row 1"),
     (np.array([[0.1, np.inf]]), r"1 row\(s\) with NaN or inf"),
     (np.zeros((0, 2)), r"shape \(n, 2\) with n >= 1, got \(0, 2\)"),
     (np.zeros((4, 3)), r"shape \(n, 2\) with n >= 1, got \(4, 3\)"),
     (np.zeros((4, 2), dtype=complex), "real numbers, got dtype complex128")],
)  # fmt: skip
def test_texture_lift_rejects_bad_clouds(xy, message):
    # catches NaN rows normalized into NaN "points" of Gr(1, 3)
    with pytest.raises(ValueError, match=message):
        lift_to_grassmann(xy)


@pytest.mark.parametrize(
    "X,message",
    [(torch.full((2, 4, 2), math.nan), r"2 configuration\(s\) contain NaN or inf"),
     (torch.ones(3, 4, 2).index_fill_(0, torch.tensor([1]), math.inf), "first at index 1"),
     (torch.zeros(0, 4, 2), r"empty batch \(shape \(0, 4, 2\)\)"),
     (torch.randn(2, 4, 2).half(), r"float32 or float64, got torch.float16"),
     (torch.ones(2, 4, 2, dtype=torch.int64), r"floating \(B, n, d\) tensor"),
     (torch.randn(4, 2), r"of shape \(4, 2\)")],
)  # fmt: skip
def test_point_cloud_map_rejects_bad_configurations(X, message):
    # catches NaN/inf or half-precision clouds turned into Grassmann points unnoticed
    with pytest.raises(ValueError, match=message):
        to_grassmann(X)
