"""Particle data files (DW4, LJ13): loaders, split protocols, Grassmann representation."""

from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import random_orthogonal
from grassflow.data.particle_files import (
    SOURCE_FILES,
    SOURCES,
    load_splits,
    missing_files,
    shared_data_dir,
)
from grassflow.manifolds import Grassmann, orthonormality_error
from grassflow.manifolds.shape_space import (
    from_grassmann,
    helmert_basis,
    representation_shape,
    to_grassmann,
)

SHAPES = {"dw4": (4, 2), "lj13": (13, 3)}


def _centred(X):
    return X - X.mean(axis=1, keepdims=True)


# ------------------------------------------------------------------ helmert / shapes
@pytest.mark.parametrize("n", range(2, 14))
def test_helmert_basis_is_orthonormal_and_orthogonal_to_ones(n):
    H = helmert_basis(n)
    assert H.shape == (n, n - 1) and H.dtype == torch.float64
    assert torch.allclose(H.mT @ H, torch.eye(n - 1), atol=1e-14)
    assert torch.allclose(H.sum(0), torch.zeros(n - 1), atol=1e-14)
    assert torch.allclose(H @ H.mT, torch.eye(n) - 1.0 / n, atol=1e-14)
    assert torch.equal(H, helmert_basis(n))


def test_helmert_basis_columns():
    H = helmert_basis(4, dtype=torch.float32)
    assert H.dtype == torch.float32
    expected = torch.tensor([1.0, 1.0, -2.0, 0.0], dtype=torch.float32) / 6**0.5
    assert torch.allclose(H[:, 1], expected)
    with pytest.raises(ValueError, match="n >= 2"):
        helmert_basis(1)


def test_representation_shape():
    assert representation_shape(4, 2, "paper") == (4, 2)
    assert representation_shape(13, 3, "paper") == (13, 3)
    assert representation_shape(4, 2, "com-free") == (3, 2)
    assert representation_shape(13, 3, "com-free") == (12, 3)
    with pytest.raises(ValueError, match="d < n - 1"):
        representation_shape(3, 2, "com-free")
    with pytest.raises(ValueError, match="protocol"):
        representation_shape(4, 2, "pca")


@pytest.mark.parametrize("protocol", ["paper", "com-free"])
@pytest.mark.parametrize("system", ["dw4", "lj13"])
def test_round_trip_and_invariances(protocol, system):
    n, d = SHAPES[system]
    X = torch.randn(16, n, d) + torch.randn(16, 1, d)  # random translations too
    P = X - X.mean(1, keepdim=True)
    Y, B = to_grassmann(X, protocol, return_factor=True)
    D, k = representation_shape(n, d, protocol)
    gr = Grassmann(k, D)
    assert Y.shape == (16, D, k) and B.shape == (16, k, k)
    assert orthonormality_error(Y).max() < 1e-12
    assert torch.allclose(from_grassmann(Y, B, protocol), P, atol=1e-12)
    assert torch.allclose(torch.tril(B, -1), torch.zeros_like(B))
    assert (torch.diagonal(B, dim1=-2, dim2=-1) > 0).all()
    Pp = P if protocol == "paper" else helmert_basis(n).mT @ P
    assert gr.same_subspace(Pp @ torch.linalg.inv(B), Y).all()
    if protocol == "paper":
        assert torch.allclose(Y.sum(-2), torch.zeros(16, k), atol=1e-12)
    # rotations and reflections of the configuration do not change the subspace
    Q = random_orthogonal(d)
    assert gr.same_subspace(to_grassmann(X @ Q, protocol), Y).all()
    # permuting particles acts on the rows: by the permutation itself (paper) or by the
    # orthogonal H^T Pi H (com-free); sign-fixed QR makes the representatives equal
    perm = torch.randperm(n)
    Pi = torch.eye(n)[perm]
    M = Pi if protocol == "paper" else helmert_basis(n).mT @ Pi @ helmert_basis(n)
    assert torch.allclose(to_grassmann(X[:, perm], protocol), M @ Y, atol=1e-12)


def test_to_grassmann_dtypes():
    X = np.random.default_rng(0).normal(size=(5, 4, 2)).astype(np.float32)
    assert to_grassmann(X).dtype == torch.float64
    Y32 = to_grassmann(torch.as_tensor(X), "paper")
    assert Y32.dtype == torch.float32 and orthonormality_error(Y32).max() < 1e-5
    with pytest.raises(ValueError, match=r"\(B, n, d\)"):
        to_grassmann(torch.randn(4, 2))
    with pytest.raises(ValueError, match="NaN"):
        to_grassmann(torch.full((2, 4, 2), float("nan")))


def test_degenerate_configurations():
    X = torch.randn(5, 13, 3)
    X[[1, 3]] = torch.randn(2, 13, 1) * torch.randn(2, 1, 3)  # collinear particles
    with pytest.raises(ValueError, match=r"2 of 5 .*rank < 3.*\[1, 3\]"):
        to_grassmann(X)
    Y, kept = to_grassmann(X, "paper", on_degenerate="skip")
    assert kept.tolist() == [True, False, True, False, True]
    assert torch.allclose(Y, to_grassmann(X[kept], "paper"))
    Y, B, kept = to_grassmann(X, on_degenerate="skip", return_factor=True)
    assert Y.shape == (3, 12, 3) and B.shape == (3, 3, 3) and int(kept.sum()) == 3
    with pytest.raises(ValueError, match="nothing is left"):
        to_grassmann(X[[1, 3]], on_degenerate="skip")
    with pytest.raises(ValueError, match="on_degenerate"):
        to_grassmann(X, on_degenerate="drop")


# ------------------------------------------------------------------ synthetic files
def _pattern(system):
    n, d = SHAPES[system]
    base = np.random.default_rng(1).normal(size=(n, d))
    return base - base.mean(0)


def _rows(system, ids, seed=0):
    """Rows ``(len(ids), n*d)``: configuration ``(id + 1) * pattern`` plus a translation."""
    n, d = SHAPES[system]
    shift = np.random.default_rng(seed).normal(size=(len(ids), 1, d)) * 5.0
    X = (np.asarray(ids, dtype=np.float64)[:, None, None] + 1.0) * _pattern(system) + shift
    return X.reshape(len(ids), n * d).astype(np.float32)


def _ids(system, X):
    """Recover the row ids from centred configurations (and check the pattern)."""
    base = _pattern(system)
    ids = np.rint((X * base).sum((1, 2)) / (base**2).sum()) - 1
    np.testing.assert_allclose(X, (ids[:, None, None] + 1) * base, rtol=1e-5, atol=1e-3)
    return ids.astype(int).tolist()


def _check_splits(splits, system, train, val, test):
    n, d = SHAPES[system]
    assert set(splits) == {"train", "val", "test"}
    for name, ids in (("train", train), ("val", val), ("test", test)):
        X = splits[name]
        assert X.dtype == np.float64 and X.shape == (len(ids), n, d)
        assert np.allclose(X.mean(1), 0.0, atol=1e-9)
        assert _ids(system, X) == list(ids)


def _write_enf_dw4(folder, rows, torch_data=True):
    obj = np.empty(2, dtype=object)
    obj[0] = torch.as_tensor(rows).view(-1, 4, 2) if torch_data else rows
    obj[1] = np.arange(len(rows))
    np.save(folder / "dw4-dataidx.npy", obj, allow_pickle=True)


@pytest.mark.parametrize("torch_data", [True, False])
def test_enf_dw4_layout(tmp_path, torch_data):
    _write_enf_dw4(tmp_path, _rows("dw4", range(30)), torch_data)
    splits = load_splits("dw4", "enf", tmp_path, n_train=8, n_val=5, n_test=4)
    _check_splits(splits, "dw4", range(8), range(21, 26), range(26, 30))


def test_enf_lj13_layout(tmp_path):
    idx = np.random.default_rng(2).permutation(40)
    np.save(tmp_path / "holdout_data_LJ13.npy", _rows("lj13", range(40)))
    np.save(tmp_path / "idx_LJ13.npy", idx)
    np.save(tmp_path / "all_data_LJ13.npy", _rows("lj13", range(100, 120)))
    splits = load_splits("lj13", "enf", tmp_path, n_train=12, n_val=6, n_test=5)
    _check_splits(splits, "lj13", idx[:12], range(105, 111), range(100, 105))
    np.save(tmp_path / "idx_LJ13.npy", idx + 1)
    with pytest.raises(ValueError, match=r"idx_LJ13.npy: indices must lie in \[0, 40\)"):
        load_splits("lj13", "enf", tmp_path, n_train=40, n_val=6, n_test=5)


def test_klein_layouts(tmp_path):
    for split, start in (("train", 0), ("val", 1000), ("test", 2000)):
        np.save(tmp_path / f"{split}_split_DW4.npy", _rows("dw4", range(start, start + 30)))
    splits = load_splits("dw4", "klein", tmp_path, n_train=20, n_val=7, n_test=9)
    _check_splits(splits, "dw4", range(20), range(1000, 1007), range(2000, 2009))
    np.save(tmp_path / "val_split_LJ13-1000.npy", _rows("lj13", range(25)))
    np.save(tmp_path / "test_split_LJ13-1000.npy", _rows("lj13", range(100, 125)))
    splits = load_splits("lj13", "klein", tmp_path, n_train=25, n_val=10, n_test=8)
    _check_splits(splits, "lj13", range(25), range(108, 118), range(100, 108))


@pytest.mark.parametrize("system", ["dw4", "lj13"])
def test_generated_layout_default_sizes(tmp_path, system):
    np.save(tmp_path / f"{system}.npy", _rows(system, range(2100)))
    splits = load_splits(system, "generated", tmp_path, n_train=50)
    _check_splits(splits, system, range(50), range(100, 1100), range(1100, 2100))
    # the held-out sets do not depend on n_train
    splits = load_splits(system, "generated", tmp_path, n_train=100, n_val=0)
    _check_splits(splits, system, range(100), [], range(1100, 2100))


def test_source_table():
    assert set(SOURCE_FILES) == {(s, x) for s in SOURCES for x in SHAPES}


# ------------------------------------------------------------------ bad input
def test_missing_file(tmp_path):
    np.save(tmp_path / "val_split_LJ13-1000.npy", _rows("lj13", range(5)))
    with pytest.raises(FileNotFoundError, match="missing: test_split_LJ13-1000.npy") as err:
        load_splits("lj13", "klein", tmp_path, n_train=2)
    assert str(tmp_path) in str(err.value)
    assert missing_files("lj13", "klein", tmp_path) == ["test_split_LJ13-1000.npy"]
    assert missing_files("lj13", "enf", tmp_path) == list(SOURCE_FILES["enf", "lj13"])
    with pytest.raises(FileNotFoundError, match="dw4-dataidx.npy"):
        load_splits("dw4", "enf", tmp_path, n_train=2)


def test_wrong_row_length(tmp_path):
    np.save(tmp_path / "dw4.npy", _rows("lj13", range(10)))
    with pytest.raises(ValueError, match=r"dw4.npy: expected rows of 8 .*got shape \(10, 39\)"):
        load_splits("dw4", "generated", tmp_path, n_train=2, n_val=2, n_test=2)
    np.save(tmp_path / "dw4-dataidx.npy", _rows("dw4", range(10)))  # not (data, idx)
    with pytest.raises(ValueError, match="2-element object array"):
        load_splits("dw4", "enf", tmp_path, n_train=2, n_val=2, n_test=2)


def test_non_finite_values(tmp_path):
    rows = _rows("dw4", range(10))
    rows[3, [1, 5]] = [np.nan, np.inf]
    np.save(tmp_path / "dw4.npy", rows)
    with pytest.raises(ValueError, match=r"dw4.npy: 2 NaN or inf"):
        load_splits("dw4", "generated", tmp_path, n_train=4, n_val=2, n_test=2)


def test_too_few_rows_and_bad_arguments(tmp_path):
    np.save(tmp_path / "lj13.npy", _rows("lj13", range(10)))
    msg = r"lj13.npy has 10 rows; the protocol needs n_train=5 \+ n_val=3 \+ n_test=3 = 11"
    with pytest.raises(ValueError, match=msg):
        load_splits("lj13", "generated", tmp_path, n_train=5, n_val=3, n_test=3)
    with pytest.raises(ValueError, match="n_train must be an integer >= 1"):
        load_splits("lj13", "generated", tmp_path, n_train=0)
    with pytest.raises(ValueError, match="choices are dw4, lj13"):
        load_splits("lj55", "generated", tmp_path, n_train=1)
    with pytest.raises(ValueError, match="choices are enf, klein, generated"):
        load_splits("lj13", "bgflow", tmp_path, n_train=1)


def test_shared_data_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GRASSFLOW_SHARED_DATA", str(tmp_path))
    assert shared_data_dir() == tmp_path.resolve()


# ------------------------------------------------------------------ shared copies
def _klein_dir() -> Path:
    root = shared_data_dir()
    folder = None if root is None else root / "alt_klein2023_from_DEM"
    if folder is None or not folder.is_dir():
        pytest.skip("no shared copy of the Klein et al. (2023) files")
    return folder


@pytest.mark.parametrize("system", ["dw4", "lj13"])
def test_shared_klein_files(system):
    n, d = SHAPES[system]
    splits = load_splits(system, "klein", _klein_dir(), n_train=1000)
    for name, X in splits.items():
        assert X.shape == (1000, n, d), name
        assert np.isfinite(X).all() and np.abs(X.mean(1)).max() < 1e-5
    assert not np.allclose(splits["val"], splits["test"][:1000])
    for protocol in ("paper", "com-free"):
        for X in splits.values():
            assert orthonormality_error(to_grassmann(X, protocol)).max() < 1e-12
