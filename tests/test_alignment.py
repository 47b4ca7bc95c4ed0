"""manifolds.alignment: the assignment and Procrustes steps, the flow-matching pairs'
alignment (`align_pairs`) and the evaluation's superposition (`superpose`)."""

import itertools

import numpy as np
import pytest
import torch

from conftest import random_orthogonal
from grassflow.manifolds.alignment import (
    align_pairs,
    assignment,
    label_groups,
    orthogonal_cost,
    procrustes,
    superpose,
)

LABELS = torch.tensor([6, 6, 1, 1, 1, 8])  # two C, three H, one O


def _molecule(rng, n=19):
    """A molecule-like point set: a random walk with ~1.5 Å steps, centred, (n, 3)."""
    steps = rng.standard_normal((n, 3))
    steps *= 1.5 / np.linalg.norm(steps, axis=1, keepdims=True)
    P = np.cumsum(steps, 0)
    return P - P.mean(0)


def _orthogonal(rng, reflect):
    Q, r = np.linalg.qr(rng.standard_normal((3, 3)))
    Q = Q * np.sign(np.diag(r))
    if (np.linalg.det(Q) < 0) != reflect:
        Q[:, 0] *= -1
    return Q


# ------------------------------------------------------------------ the two steps


def test_assignment_minimizes_the_summed_cost_and_argsort_inverts_it():
    # bug caught: returning the inverse permutation (row i paired with the wrong column), or
    # a tensor cost answered in another kind or device
    C = torch.rand(5, 5)
    p = assignment(C)
    assert p.dtype == torch.int64 and p.device == C.device
    best = min(sum(C[i, q[i]].item() for i in range(5)) for q in itertools.permutations(range(5)))
    assert sum(C[i, p[i]].item() for i in range(5)) == pytest.approx(best)
    inverse = p.argsort()  # the row of each column
    assert sum(C[inverse[j], j].item() for j in range(5)) == pytest.approx(best)
    assert np.array_equal(assignment(C.numpy()), p.numpy())


def test_assignment_within_labels_keeps_each_group_and_is_optimal_in_it():
    # bug caught: a label group matched across labels, or indices of the group's block
    # returned instead of the cloud's
    rng = np.random.default_rng(0)
    labels = np.array([1, 6, 1, 8, 6, 1])
    groups = label_groups(labels, 6)
    C = rng.random((6, 6))
    p = assignment(C, groups)
    assert (labels[p] == labels).all() and sorted(p) == list(range(6))
    keeps = [q for q in itertools.permutations(range(6)) if (labels[list(q)] == labels).all()]
    best = min(sum(C[i, q[i]] for i in range(6)) for q in keeps)
    assert sum(C[i, p[i]] for i in range(6)) == pytest.approx(best)
    with pytest.raises(ValueError, match="labels must be 6 integers"):
        label_groups(labels[:4], 6)


def test_orthogonal_cost_is_the_procrustes_minimum():
    # bug caught: svdvals of the wrong product, a rotation-only (det +1) minimum
    X0, X1 = (torch.randn(5, 6, 3) for _ in range(2))
    X0, X1 = X0 - X0.mean(1, keepdim=True), X1 - X1.mean(1, keepdim=True)
    C = orthogonal_cost(X0, X1)
    for a, b in itertools.product(range(5), range(5)):
        R = procrustes(X0[a], X1[b])
        torch.testing.assert_close(R.mT @ R, torch.eye(3))
        assert C[a, b] == pytest.approx((X0[a] - X1[b] @ R).square().sum().item(), abs=1e-10)
        for _ in range(3):  # no other orthogonal matrix does better
            assert C[a, b] <= (X0[a] - X1[b] @ random_orthogonal(3)).square().sum() + 1e-10


def test_procrustes_without_reflections_is_the_best_rotation_for_tensors_and_arrays():
    # bug caught: the sign fix of the last singular vector lost, or applied to one kind only
    from scipy.spatial.transform import Rotation

    rng = np.random.default_rng(1)
    A = _molecule(rng, 8)
    B = (A + 0.2 * rng.standard_normal(A.shape)) @ _orthogonal(rng, reflect=True)
    for kind in (np.asarray, torch.as_tensor):
        R = np.asarray(procrustes(kind(A), kind(B), reflections=False))
        assert np.linalg.det(R) == pytest.approx(1.0)
        best = Rotation.align_vectors(A, B)[1]  # the best rotation's residual
        assert np.linalg.norm(A - B @ R) == pytest.approx(best, rel=1e-9)
        assert np.linalg.det(np.asarray(procrustes(kind(A), kind(B)))) == pytest.approx(-1.0)


# ------------------------------------------------------------------ training pairs


def test_align_pairs_relabels_and_rotates_without_distorting():
    # bug caught: an alignment that changes the shape (a non-orthogonal map, duplicated points),
    # or a relabelling applied backwards, which moves x1 away from x0
    x0 = torch.randn(16, 7, 3)
    Q, perm = random_orthogonal(3), torch.randperm(7)
    x1 = (x0 @ Q)[:, perm] + 0.3 * torch.randn(16, 7, 3)
    x0, x1 = x0 - x0.mean(1, keepdim=True), x1 - x1.mean(1, keepdim=True)
    y = align_pairs(x0, x1)
    d = lambda X: torch.cdist(X, X).flatten(1).sort(1).values
    torch.testing.assert_close(d(y), d(x1))
    rotated = (x0 - x1 @ procrustes(x0, x1)).square().sum((1, 2))  # rotation alone
    assert ((y - x0).square().sum((1, 2)) <= rotated + 1e-9).all()
    # from the principal-axis starts it finds the labels and the rotation of a noisy copy:
    # what is left is about the noise (0.3^2 per coordinate, 21 coordinates)
    assert (y - x0).square().sum((1, 2)).median() < 0.3**2 * 21


def test_labelled_align_pairs_swaps_only_points_of_equal_labels():
    # bug caught: the equivariant-OT coupling relabelling a data cloud across elements (its
    # O would become an H: the regression target would be another molecule)
    x0 = torch.randn(8, 6, 3)
    x0 = x0 - x0.mean(1, keepdim=True)
    cross = torch.tensor([5, 2, 1, 4, 3, 0])  # every point moves to another label's slot
    x1 = x0[:, cross] @ random_orthogonal(3)
    group_shape = lambda X, g: torch.cdist(X[:, g], X[:, g]).flatten(1).sort(1).values
    y, y_plain = align_pairs(x0, x1, labels=LABELS), align_pairs(x0, x1)
    for v in LABELS.unique():
        g = (LABELS == v).nonzero().flatten()
        torch.testing.assert_close(group_shape(y, g), group_shape(x1, g))
    assert (y_plain - x0).square().sum() < 1e-12 < (y - x0).square().sum()  # power


# ------------------------------------------------------------------ evaluation


@pytest.mark.parametrize("reflect", [False, True])
def test_superpose_recovers_transform_and_permutation(reflect):
    rng = np.random.default_rng(0)
    for _ in range(3):
        A = _molecule(rng)
        q = rng.permutation(len(A))
        B = A[q] @ _orthogonal(rng, reflect).T + rng.standard_normal(3)  # B[j] = Q A[q[j]] + c
        B_al, perm, rmsd = superpose(A, B)
        assert rmsd < 1e-10
        np.testing.assert_array_equal(perm, np.argsort(q))
        np.testing.assert_allclose(B_al, A, atol=1e-10)


def test_superpose_without_reflections_cannot_undo_a_mirror():
    rng = np.random.default_rng(1)
    A = _molecule(rng)
    B = A @ _orthogonal(rng, reflect=True).T
    assert superpose(A, B, reflections=True)[2] < 1e-10
    # a random walk is chiral, so only a reflection maps it onto its mirror image
    assert superpose(A, B, reflections=False)[2] > 1e-3


def test_superpose_without_reflections_returns_a_rotation_on_noisy_relabelled_mirrors():
    # catches: Kabsch allowing reflections under reflections=False (the SVD step without its
    # sign fix: on noisy, relabelled mirror images it returned det R = -1). The transform
    # recovered from the output (least squares) must be a proper rotation, and the RMSD must
    # be the best rotation's for the returned matching (scipy's align_vectors, proper only)
    from scipy.spatial.transform import Rotation

    rng = np.random.default_rng(5)
    for _ in range(6):
        A = _molecule(rng, 12)
        q = rng.permutation(len(A))
        B = (A + 0.15 * rng.standard_normal(A.shape))[q] @ _orthogonal(rng, reflect=True).T
        B = B + rng.standard_normal(3)
        B_al, perm, rmsd = superpose(A, B, reflections=False, restarts=8)
        Bc = B[perm] - B.mean(0)
        Rt = np.linalg.lstsq(Bc, B_al - A.mean(0), rcond=None)[0]  # B_al = Bc R^T + a0
        np.testing.assert_allclose(Rt.T @ Rt, np.eye(3), atol=1e-8)
        assert np.linalg.det(Rt) > 0
        rssd = Rotation.align_vectors(A - A.mean(0), Bc)[1]
        assert rmsd == pytest.approx(rssd / np.sqrt(len(A)), rel=1e-8, abs=1e-10)
        assert rmsd > 0.3  # a chiral walk: no rotation undoes the mirror (power)


def test_superpose_rmsd_invariant_and_symmetric():
    rng = np.random.default_rng(2)
    A = _molecule(rng)
    B = A[rng.permutation(19)] + 0.3 * rng.standard_normal((19, 3))
    r = superpose(A, B)[2]
    assert 0.05 < r < 0.5
    for _ in range(3):
        Ra, Rb = _orthogonal(rng, False), _orthogonal(rng, True)
        Ar, Br = A[rng.permutation(19)] @ Ra.T, B[rng.permutation(19)] @ Rb.T
        assert superpose(Ar, Br)[2] == pytest.approx(r, abs=1e-9)
    assert superpose(B, A)[2] == pytest.approx(r, abs=1e-9)


def test_superpose_names_bad_shapes():
    A = _molecule(np.random.default_rng(6))
    with pytest.raises(ValueError, match=r"\(19, 2\)"):
        superpose(A, A[:, :2])
    with pytest.raises(ValueError, match=r"\(19, 3\) and \(18, 3\)"):
        superpose(A, A[:18])
    with pytest.raises(ValueError, match="non-finite"):
        superpose(A, np.full((19, 3), np.nan))
