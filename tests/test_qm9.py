"""QM9 positional data from qm9pack: E-NF's split, the cache, distance histograms."""

import importlib.util
import json
import math
import shutil

import numpy as np
import pytest

import grassflow.data.qm9 as qm9
from grassflow.data.particle_files import shared_data_dir
from grassflow.data.qm9 import (
    CACHE_NAME,
    CACHE_VERSION,
    N_ATOMS,
    N_MOLECULES,
    SPLIT_SIZES,
    SPLIT_SIZES_19,
    SPLITS,
    gdb9_split_positions,
    load_qm9_positional,
    rank_deficient,
)
from grassflow.metrics import distance_histogram, jsd

# not pytest.importorskip("qm9pack"): importing qm9pack 1.0.3 fails without pkg_resources
# (removed in setuptools 82) even when installed; the loader only needs its data files
try:
    qm9.qm9pack_data_dir()
except ImportError:
    pytest.skip("qm9pack is not installed (pip install -e '.[qm9]')", allow_module_level=True)


def _reference(name):
    """A file of the shared QM9 reference data, or skip."""
    root = shared_data_dir()
    if root is None or not (root / "qm9" / name).is_file():
        pytest.skip(f"no shared copy of qm9/{name}")
    return root / "qm9" / name


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A cache built once from qm9pack (about a second of parsing)."""
    folder = tmp_path_factory.mktemp("qm9")
    load_qm9_positional(folder, progress=False)
    return folder


@pytest.fixture(scope="module")
def data(cache_dir):
    return load_qm9_positional(cache_dir, progress=False)


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key


# ------------------------------------------------------------------ split
def test_split_positions_reproduce_cormorant():
    splits = gdb9_split_positions()
    assert {s: len(v) for s, v in splits.items()} == SPLIT_SIZES
    assert SPLIT_SIZES == {"train": 100_000, "valid": 17_748, "test": 13_083}
    # cormorant's gen_splits_gdb9 verbatim (the legacy global generator, on purpose)
    state = np.random.get_state()  # noqa: NPY002
    np.random.seed(0)  # noqa: NPY002
    perm = np.random.permutation(N_MOLECULES)  # noqa: NPY002
    np.random.set_state(state)  # noqa: NPY002
    assert np.array_equal(np.concatenate([splits[s] for s in SPLITS]), perm)
    with pytest.raises(ValueError, match="130831"):
        gdb9_split_positions(133_885)


def test_split_sizes_shapes_and_centring(data):
    assert set(data) == {f"{s}{k}" for s in SPLITS for k in ("", "_index", "_charges")}
    for s in SPLITS:
        P, idx, Z = data[s], data[f"{s}_index"], data[f"{s}_charges"]
        n = SPLIT_SIZES_19[s]
        assert P.shape == (n, N_ATOMS, 3) and P.dtype == np.float64
        assert idx.shape == (n,) and np.all(np.diff(idx) > 0) and idx.min() >= 1
        assert Z.shape == (n, N_ATOMS) and set(np.unique(Z)) <= {1, 6, 7, 8, 9}
        assert np.abs(P.mean(axis=1)).max() < 1e-12
        assert not rank_deficient(P).any()
    assert sum(len(data[f"{s}_index"]) for s in SPLITS) == len(
        np.unique(np.concatenate([data[f"{s}_index"] for s in SPLITS]))
    )


def test_test_split_matches_cormorant_file(data):
    ref = np.load(_reference("test.npz"))
    keep = ref["num_atoms"] == N_ATOMS
    assert np.array_equal(ref["index"][keep], data["test_index"])
    assert np.array_equal(ref["charges"][keep][:, :N_ATOMS], data["test_charges"])
    P = ref["positions"][keep][:, :N_ATOMS].astype(np.float64)
    # the README's 3e-7 Å (measured 2.71e-7: the float32 rounding of E-NF's file); catches
    # float32 anywhere in our pipeline (our positions cast to float32: 4.1e-7), a wrong unit
    # or centring, and a different molecule or atom order
    assert np.abs(P - P.mean(axis=1, keepdims=True) - data["test"]).max() <= 3e-7


def test_train_histogram_matches_enf_reference(data):
    ref = json.loads(_reference("enf_analyzed_19_distance_hist.json").read_text())
    h = distance_histogram(data["train"])
    assert h.sum() == ref["total"] == SPLIT_SIZES_19["train"] * N_ATOMS * (N_ATOMS - 1)
    # one pair sits on a bin edge (2.34 Å) and lands on either side depending on rounding
    assert np.abs(h - np.array(ref["counts"])).sum() <= 4
    assert jsd(h, np.array(ref["counts"], dtype=float)) < 1e-9


# ------------------------------------------------------------------ cache
def test_cache_round_trip_without_qm9pack(cache_dir, data, tmp_path, monkeypatch):
    assert sorted(p.name for p in cache_dir.iterdir()) == [CACHE_NAME]  # no temp files left
    shutil.copy(cache_dir / CACHE_NAME, tmp_path / CACHE_NAME)
    monkeypatch.setattr(qm9, "_build", lambda progress: pytest.fail("cache not used"))
    _assert_same(load_qm9_positional(tmp_path), data)


def test_corrupt_cache_raises(cache_dir, tmp_path):
    path = tmp_path / CACHE_NAME
    path.write_bytes(b"not an npz file")
    with pytest.raises(ValueError, match="refresh=True"):
        load_qm9_positional(tmp_path)
    path.write_bytes((cache_dir / CACHE_NAME).read_bytes()[:100_000])  # truncated
    with pytest.raises(ValueError, match="unreadable"):
        load_qm9_positional(tmp_path)
    np.savez(path, format_version=np.array(CACHE_VERSION), train=np.zeros((2, 5, 3)))
    with pytest.raises(ValueError, match="lacks"):
        load_qm9_positional(tmp_path)


def test_old_cache_version_and_refresh_rebuild(data, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(qm9, "_build", lambda progress: calls.append(1) or data)
    path = tmp_path / CACHE_NAME
    np.savez(path, format_version=np.array(CACHE_VERSION - 1))
    with pytest.warns(UserWarning, match="format version"):
        _assert_same(load_qm9_positional(tmp_path), data)
    assert int(np.load(path)["format_version"]) == CACHE_VERSION
    _assert_same(load_qm9_positional(tmp_path, refresh=True), data)
    assert len(calls) == 2


def test_missing_qm9pack_message(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    hide = lambda name, *args: None if name == "qm9pack" else find_spec(name, *args)
    monkeypatch.setattr(importlib.util, "find_spec", hide)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[qm9\]"'):
        load_qm9_positional(tmp_path / "new")


# ------------------------------------------------------------------ analysis
def test_distance_histogram_by_hand():
    # distances 1, 2 and sqrt(5) = 2.236 Å, each counted for both orders of the pair
    P = np.array([[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]])
    expected = np.zeros(100)
    for d in (1.0, 2.0, math.sqrt(5.0)):
        expected[min(int(d / 13 * 100), 99)] += 2  # bins 7, 15 and 17
    assert np.array_equal(distance_histogram(P), expected)
    # a second molecule: two coinciding atoms (dropped) and a pair past 13 Å (last bin)
    Q = np.array([[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 20.0]]])
    h = distance_histogram(np.concatenate([P, Q]), chunk=1)
    assert h.sum() == 6 + 4 and h[99] == 4 and np.array_equal(h[:99], expected[:99])
    assert np.array_equal(distance_histogram(P, bins=2, lo=0.0, hi=4.0), [2.0, 4.0])


def test_rank_deficient():
    rng = np.random.default_rng(0)
    line = np.outer(rng.normal(size=6), [1.0, 2.0, -1.0]) + [3.0, 0.0, 1.0]
    plane = np.concatenate([rng.normal(size=(6, 2)), np.zeros((6, 1))], axis=1) + 5.0
    generic = rng.normal(size=(6, 3))
    assert rank_deficient(np.stack([line, plane, generic])).tolist() == [True, True, False]
    with pytest.raises(ValueError, match=r"\(N, n, 3\)"):
        rank_deficient(generic)
