"""grassflow.data.overlap: verbatim and up-to-symmetry repeats across data splits."""

import numpy as np
import pytest
import torch

from grassflow.data.overlap import (
    contained_mask,
    deduplicate,
    distance_fingerprint,
    distinct_rows,
    invariant_match_mask,
    novel_mask,
    overlap_report,
)
from grassflow.data.particle_files import shared_data_dir


def clouds(n_rows: int, n: int = 4, d: int = 2, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n_rows, n, d)).astype(np.float32)


def test_distinct_rows_first_occurrence_in_order():
    # catches returning np.unique's sorted-by-value order, or the last occurrence of a repeat
    a, b, c = clouds(3)
    X = np.stack([b, a, b, c, a, a])
    np.testing.assert_array_equal(distinct_rows(X), [0, 1, 3])
    assert distinct_rows(X).dtype == np.int64


def test_rows_compared_whole():
    # catches comparing only part of a row (e.g. the first point, or a wrong reshape of
    # (N, n, d)): rows that differ in their very last value are distinct
    X = np.repeat(clouds(1), 3, axis=0)
    X[1, -1, -1] += 1.0
    X[2, 0, 0] += 1.0
    assert len(distinct_rows(X)) == 3
    assert len(distinct_rows(X.reshape(3, -1))) == 3


def test_equal_as_numbers_across_zero_sign_and_dtype():
    # catches raw byte comparison: -0.0 and 0.0 have different bytes but are the same value,
    # and a float32 row cast to float64 (exact) is still the same configuration
    X = np.zeros((2, 4, 2), dtype=np.float32)
    X[1, 0, 0] = -0.0
    assert len(distinct_rows(X)) == 1
    Y = clouds(5)
    assert contained_mask(Y.astype(np.float64), Y).all()
    assert contained_mask(Y, Y.astype(np.float64)).all()


def test_deduplicate_counts():
    # catches counts misaligned with the unique rows (e.g. counts in sorted order while the
    # rows are in first-occurrence order)
    a, b, c = clouds(3)
    X = np.stack([c, a, c, c, b, a])
    U, counts = deduplicate(X)
    np.testing.assert_array_equal(U, np.stack([c, a, b]))
    np.testing.assert_array_equal(counts, [3, 2, 1])
    assert counts.sum() == len(X)


def test_contained_and_novel_masks():
    # catches counting distinct rows instead of rows, ignoring all but the first of `others`,
    # and marking a test row as seen because it repeats within the test set itself
    base = clouds(6)
    test = np.stack([base[0], base[1], base[1], base[2], base[3], base[3]])
    train, val = base[[1, 5]], base[[2]]
    np.testing.assert_array_equal(contained_mask(test, train), [0, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(contained_mask(test, train, val), [0, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(novel_mask(test, train, val), [1, 0, 0, 0, 1, 1])
    # no others, or empty others: nothing is seen
    assert novel_mask(test).all() and novel_mask(test, train[:0]).all()


def test_overlap_report():
    # catches mixing up splits in the report, e.g. counting val rows found in test as
    # test rows found in val, or novel_test not equal to n_test - test_in_either
    base = clouds(8)
    train = base[[0, 1, 1, 2]]
    val = base[[2, 3, 7]]
    test = base[[1, 1, 3, 2, 4, 5, 5]]
    r = overlap_report(train, val, test)
    assert r == {
        "n_train": 4, "n_val": 3, "n_test": 7,
        "distinct_train": 3, "distinct_val": 3, "distinct_test": 5,
        "test_in_train": 3, "test_in_val": 2, "test_in_either": 4, "novel_test": 3,
        "distinct_test_in_train": 2, "distinct_test_in_either": 3, "distinct_novel_test": 2,
        "val_in_train": 1,
    }  # fmt: skip


def test_torch_and_empty_inputs():
    # catches rejecting tensors (the flows' datasets are tensors) or failing on empty splits
    X = torch.from_numpy(np.concatenate([clouds(3), clouds(3)]))
    np.testing.assert_array_equal(distinct_rows(X), [0, 1, 2])
    assert distinct_rows(X[:0]).shape == (0,)
    U, counts = deduplicate(X[:0])
    assert U.shape == (0, 4, 2) and counts.shape == (0,)
    assert contained_mask(X[:0], X).shape == (0,)
    assert overlap_report(X, X[:0], X)["novel_test"] == 0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: contained_mask(clouds(2), clouds(2, n=5)), "shape"),
        (lambda: overlap_report(clouds(2), clouds(2, d=3), clouds(2)), "shape"),
        (lambda: distinct_rows(np.array([[0.0, np.nan]])), "NaN or inf"),
        (lambda: novel_mask(clouds(2), np.full((1, 4, 2), np.inf)), "NaN or inf"),
        (lambda: distinct_rows(np.float32(1.0)), "scalar"),
        (lambda: distinct_rows(np.array([["a"], ["b"]])), "numeric"),
        (lambda: distinct_rows(np.zeros((3, 0))), "no values"),
        (lambda: invariant_match_mask(clouds(2), clouds(2), atol=-1.0), "atol"),
        (lambda: distance_fingerprint(np.zeros((2, 1, 3))), "n >= 2"),
    ],
)
def test_bad_input_raises(call, match):
    # catches silent garbage: NaN rows never equal themselves (every NaN row would look
    # novel), and rows of different shapes would compare as unequal byte strings
    with pytest.raises(ValueError, match=match):
        call()


def test_invariant_match_finds_moved_copies():
    # catches a fingerprint that is not invariant (unsorted distances, coordinates instead of
    # distances) and a tolerance that is ignored: a rotated, reflected, translated and
    # permuted copy matches though not verbatim; a copy moved by more than atol does not
    rng = np.random.default_rng(1)
    X = rng.normal(size=(5, 13, 3))
    Q = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    moved = X[:, rng.permutation(13)] @ Q.T + rng.normal(size=3)
    moved[:, :, 0] *= -1
    assert not contained_mask(moved, X).any()
    assert invariant_match_mask(moved, X).all()
    perturbed = X.copy()
    perturbed[:, 0, 0] += 1e-2
    assert not invariant_match_mask(perturbed, X, atol=1e-4).any()
    assert invariant_match_mask(perturbed, X, atol=1e-1).all()
    assert not invariant_match_mask(X).any()
    D = distance_fingerprint(X)
    assert D.shape == (5, 78) and (np.diff(D, axis=1) >= 0).all()


def test_dw4_files_repeat_configurations():
    # catches a regression in the counts quoted for the upstream DW4 files (Klein et al.
    # 2023 via DEM), and the split rows: test = test file[:1000], val = val file[:1000]
    # (ENF_SPLITS in grassflow_paper.vs_enf)
    shared = shared_data_dir()
    folder = None if shared is None else shared / "alt_klein2023_from_DEM"
    names = ("train_split_DW4.npy", "val_split_DW4.npy", "test_split_DW4.npy")
    if folder is None or not all((folder / n).is_file() for n in names):
        pytest.skip("DW4 files not in ../shared/data/alt_klein2023_from_DEM")
    train, val, test = (np.load(folder / n).reshape(-1, 4, 2) for n in names)
    assert len(distinct_rows(train)) == 30_091
    assert len(distinct_rows(test)) == 7_750
    t = test[:1000]
    assert contained_mask(t, train[:1000]).sum() == 63
    assert contained_mask(t, val[:1000]).sum() == 68
    assert contained_mask(t, train[:10_000]).sum() == 368
    assert contained_mask(t, train).sum() == 889
    # no extra repeats up to rotation, reflection, translation or permutation
    assert invariant_match_mask(t, train).sum() == 889
