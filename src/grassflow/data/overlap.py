"""Repeated configurations within and across data splits.

Upstream point-cloud files can repeat configurations: DW4's ``train_split_DW4.npy`` (Klein
et al. 2023, via DEM) holds 30,091 distinct rows in 100,000, and most of the test rows we use
also occur in the training file. A test NLL measured on configurations the model was trained
on is not a held-out number, so these helpers count such repeats.

Two notions of "the same configuration":

* **Verbatim** (`distinct_rows`, `deduplicate`, `contained_mask`,
  `novel_mask`, `overlap_report`): two rows are equal when all their values are
  equal as numbers, i.e. their bytes are equal after a cast to one dtype and after ``-0.0`` is
  made ``0.0``. This is the right test for float32 files whose repeats are copies of a row; it
  finds verbatim repeats only, not a configuration that recurs rotated, translated, reflected,
  with its points permuted, or perturbed by rounding.
* **Up to symmetry** (`distance_fingerprint`, `invariant_match_mask`): two
  configurations match when their sorted interpoint distances agree within a tolerance. Equal
  configurations up to rotation, reflection, translation and a permutation of the points
  always match; the converse can fail (distinct point sets can share all distances), so a
  match count is an upper bound on such repeats, and the verbatim count a lower bound.

Pure numpy (torch tensors are accepted and converted); no experiment code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "contained_mask",
    "deduplicate",
    "distance_fingerprint",
    "distinct_rows",
    "invariant_match_mask",
    "novel_mask",
    "overlap_report",
]


# ------------------------------------------------------------------ input checks
def _as_array(X: Any, name: str) -> np.ndarray:
    """``X`` as a numpy array of at least one dimension, numeric and finite."""
    if hasattr(X, "detach"):  # a torch tensor
        X = X.detach().cpu().numpy()
    X = np.asarray(X)
    if X.ndim < 1:
        raise ValueError(f"{name} must be an array of rows (N, ...), got a scalar")
    if not (np.issubdtype(X.dtype, np.number) or X.dtype == np.bool_):
        raise ValueError(f"{name} must be numeric, got dtype {X.dtype}")
    if np.issubdtype(X.dtype, np.inexact) and not np.isfinite(X).all():
        bad = ~np.isfinite(X.reshape(len(X), -1)).all(axis=1)
        raise ValueError(
            f"{name} has {int(bad.sum())} row(s) with NaN or inf values, first at row "
            f"{int(bad.argmax())}; NaN never equals itself, so repeats cannot be counted"
        )
    return X


def _checked(arrays: dict[str, Any]) -> tuple[list[np.ndarray], np.dtype]:
    """Validated arrays with one trailing shape, and the dtype they are compared in."""
    out = [_as_array(X, name) for name, X in arrays.items()]
    names = list(arrays)
    for name, X in zip(names[1:], out[1:]):
        if X.shape[1:] != out[0].shape[1:]:
            raise ValueError(
                f"{names[0]} has rows of shape {out[0].shape[1:]} but {name} has rows of shape "
                f"{X.shape[1:]}; rows of different shapes cannot repeat each other"
            )
    if int(np.prod(out[0].shape[1:])) == 0:
        raise ValueError(f"rows of shape {out[0].shape[1:]} hold no values")
    return out, np.result_type(*out)


def _keys(X: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """One opaque ``np.void`` key per row of ``X``: equal keys <=> equal rows (as numbers)."""
    X = np.ascontiguousarray(X, dtype=dtype).reshape(len(X), -1)
    if np.issubdtype(dtype, np.inexact):
        X = X + np.zeros((), dtype)  # -0.0 + 0.0 = 0.0: the two zeros get one key
    return X.view(np.dtype((np.void, X.shape[1] * X.itemsize))).ravel()


# ------------------------------------------------------------------ verbatim repeats
def distinct_rows(X: Any) -> np.ndarray:
    """Positions of the first occurrence of each distinct row, in the order of ``X``.

    Rows are compared verbatim (see the module docstring): exactly equal values, not equality
    up to a rotation, translation or permutation of points.

    Args:
        X: ``(N, ...)`` array or tensor, e.g. ``(N, n, d)`` point clouds or ``(N, n * d)``
            flattened rows; finite values.

    Returns:
        int64 ``(M,)`` increasing positions into ``X``, ``M`` = the number of distinct rows;
        ``X[distinct_rows(X)]`` has each configuration once, first occurrences kept.

    Raises:
        ValueError: ``X`` is a scalar, not numeric, has non-finite values, or empty rows.
    """
    (X,), dtype = _checked({"X": X})
    if len(X) == 0:
        return np.zeros(0, dtype=np.int64)
    _, first = np.unique(_keys(X, dtype), return_index=True)  # first occurrence of each key
    return np.sort(first).astype(np.int64)


def deduplicate(X: Any) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``X`` (first occurrences, order kept) and how often each occurs.

    Args:
        X: ``(N, ...)`` array or tensor (see `distinct_rows`).

    Returns:
        ``(X_unique, counts)``: ``X_unique`` is a numpy ``(M, ...)`` array, ``X`` at
        `distinct_rows`; ``counts`` is int64 ``(M,)``, the number of rows of ``X``
        equal to each (``counts.sum() == N``; the number of distinct rows is
        ``len(X_unique)``).

    Raises:
        ValueError: as `distinct_rows`.
    """
    (X,), dtype = _checked({"X": X})
    if len(X) == 0:
        return X[:0], np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(_keys(X, dtype), return_index=True, return_inverse=True)
    counts = np.bincount(inverse.ravel(), minlength=len(first))
    order = np.argsort(first)
    return X[first[order]], counts[order].astype(np.int64)


def contained_mask(X: Any, *others: Any) -> np.ndarray:
    """Which rows of ``X`` occur verbatim in at least one of ``others``.

    Args:
        X: ``(N, ...)`` array or tensor.
        *others: arrays or tensors ``(N_i, ...)`` with the same trailing shape as ``X``.
            Arrays of different dtypes are compared after a cast to their common dtype
            (float32 values cast to float64 exactly, so such a pair still matches).

    Returns:
        bool ``(N,)``; every row is counted, so a row of ``X`` that repeats within ``X`` is
        marked at each of its positions. All False when ``others`` is empty.

    Raises:
        ValueError: a trailing shape differs from ``X``'s, or as `distinct_rows`.
    """
    arrays, dtype = _checked({"X": X, **{f"others[{i}]": A for i, A in enumerate(others)}})
    X, rest = arrays[0], arrays[1:]
    if len(X) == 0 or not any(len(A) for A in rest):
        return np.zeros(len(X), dtype=bool)
    keys = np.concatenate([_keys(A, dtype) for A in arrays])
    _, inverse = np.unique(keys, return_inverse=True)
    inverse = inverse.ravel()
    seen = np.zeros(inverse.max() + 1, dtype=bool)
    seen[inverse[len(X) :]] = True
    return seen[inverse[: len(X)]]


def novel_mask(test: Any, *others: Any) -> np.ndarray:
    """Which rows of ``test`` occur verbatim in none of ``others``: the held-out rows.

    Args:
        test: ``(N, ...)`` array or tensor, e.g. ``(N, n, d)`` test configurations.
        *others: ``(N_i, ...)`` arrays or tensors, e.g. the training and validation sets.

    Returns:
        bool ``(N,)``, the negation of `contained_mask`.

    Raises:
        ValueError: as `contained_mask`.
    """
    return ~contained_mask(test, *others)


def overlap_report(train: Any, val: Any, test: Any) -> dict[str, int]:
    """Counts of verbatim repeats within and across a train / validation / test split.

    Args:
        train: ``(N_train, ...)`` array or tensor, e.g. ``(N, n, d)`` point clouds.
        val: ``(N_val, ...)``, same trailing shape.
        test: ``(N_test, ...)``, same trailing shape.

    Returns:
        A dict of ints. Row counts ``n_train``, ``n_val``, ``n_test``; distinct rows
        ``distinct_train``, ``distinct_val``, ``distinct_test``; test rows (each row counted,
        repeats within the test set included) occurring in train ``test_in_train``, in val
        ``test_in_val``, in either ``test_in_either``, and in neither ``novel_test``
        (``= n_test - test_in_either``); the same for distinct test configurations
        (``distinct_test_in_train``, ``distinct_test_in_either``, ``distinct_novel_test``);
        validation rows occurring in train ``val_in_train``.

    Raises:
        ValueError: the trailing shapes differ, or as `distinct_rows`.
    """
    (train, val, test), _ = _checked({"train": train, "val": val, "test": test})
    in_train = contained_mask(test, train)
    in_val = contained_mask(test, val)
    either = in_train | in_val
    first = distinct_rows(test)
    return {
        "n_train": len(train),
        "n_val": len(val),
        "n_test": len(test),
        "distinct_train": len(distinct_rows(train)),
        "distinct_val": len(distinct_rows(val)),
        "distinct_test": len(first),
        "test_in_train": int(in_train.sum()),
        "test_in_val": int(in_val.sum()),
        "test_in_either": int(either.sum()),
        "novel_test": int((~either).sum()),
        "distinct_test_in_train": int(in_train[first].sum()),
        "distinct_test_in_either": int(either[first].sum()),
        "distinct_novel_test": int((~either[first]).sum()),
        "val_in_train": int(contained_mask(val, train).sum()),
    }


# ------------------------------------------------------------------ repeats up to symmetry
def distance_fingerprint(X: Any) -> np.ndarray:
    """Sorted interpoint distances of each configuration: invariant to rigid motions,
    reflections and permutations of the points.

    Args:
        X: ``(N, n, d)`` point clouds, ``n >= 2``.

    Returns:
        float64 ``(N, n (n - 1) / 2)``: the distances ``|x_i - x_j|``, ``i < j``, of each
        configuration in increasing order.

    Raises:
        ValueError: ``X`` is not ``(N, n, d)`` with ``n >= 2``, or as `distinct_rows`.
    """
    X = _as_array(X, "X")
    if X.ndim != 3 or X.shape[1] < 2 or X.shape[2] < 1:
        raise ValueError(f"X must be point clouds (N, n, d) with n >= 2, got shape {X.shape}")
    X = X.astype(np.float64)
    i, j = np.triu_indices(X.shape[1], k=1)
    D = np.sqrt(((X[:, i, :] - X[:, j, :]) ** 2).sum(-1))
    return np.sort(D, axis=1)


def invariant_match_mask(X: Any, *others: Any, atol: float = 1e-4) -> np.ndarray:
    """Which configurations of ``X`` match one in ``others`` up to rotation, reflection,
    translation and permutation of the points, to within ``atol``.

    Two configurations match when their `distance_fingerprint` vectors differ by at most
    ``atol`` in every entry. Equal configurations up to those symmetries (and rounding below
    ``atol``) always match; configurations that match need not be equal (distinct point sets
    can share all interpoint distances), so the count of matches is an upper bound on repeats
    up to symmetry. Only the rows of ``others`` whose smallest distance is within ``atol`` of
    the row's are compared, so the cost stays near ``O((N + sum(N_i)) n^2 log)`` unless many
    configurations share their smallest distance.

    Args:
        X: ``(N, n, d)`` point clouds.
        *others: ``(N_i, n, d)`` point clouds.
        atol: tolerance on each sorted distance, in the units of the coordinates.

    Returns:
        bool ``(N,)``. All False when ``others`` is empty.

    Raises:
        ValueError: shapes differ or are not ``(N, n, d)``, ``atol`` is negative or not
            finite, or non-finite values.
    """
    if not 0 <= atol < np.inf:
        raise ValueError(f"atol must be finite and >= 0, got {atol!r}")
    _checked({"X": X, **{f"others[{i}]": A for i, A in enumerate(others)}})
    F = distance_fingerprint(X)
    out = np.zeros(len(F), dtype=bool)
    for A in others:
        G = distance_fingerprint(A)
        if len(G) == 0:
            continue
        G = G[np.argsort(G[:, 0], kind="stable")]  # by smallest distance
        lo = np.searchsorted(G[:, 0], F[:, 0] - atol, side="left")
        hi = np.searchsorted(G[:, 0], F[:, 0] + atol, side="right")
        for r in np.flatnonzero(~out & (hi > lo)):
            out[r] = bool((np.abs(G[lo[r] : hi[r]] - F[r]).max(axis=1) <= atol).any())
    return out
