"""metrics.alignment (alignment, nearest molecules) and viz.molecules (the Figure 5 plot)."""

import numpy as np
import pytest

from grassflow.metrics.alignment import align, nearest, shape_descriptor
from grassflow.viz.molecules import plot_nearest, plot_side_by_side


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


@pytest.mark.parametrize("reflect", [False, True])
def test_align_recovers_transform_and_permutation(reflect):
    rng = np.random.default_rng(0)
    for _ in range(3):
        A = _molecule(rng)
        q = rng.permutation(len(A))
        B = A[q] @ _orthogonal(rng, reflect).T + rng.standard_normal(3)  # B[j] = Q A[q[j]] + c
        B_al, perm, rmsd = align(A, B)
        assert rmsd < 1e-10
        np.testing.assert_array_equal(perm, np.argsort(q))
        np.testing.assert_allclose(B_al, A, atol=1e-10)


def test_align_without_reflections_cannot_undo_a_mirror():
    rng = np.random.default_rng(1)
    A = _molecule(rng)
    B = A @ _orthogonal(rng, reflect=True).T
    assert align(A, B, reflections=True)[2] < 1e-10
    # a random walk is chiral, so only a reflection maps it onto its mirror image
    assert align(A, B, reflections=False)[2] > 1e-3


def test_align_without_reflections_returns_a_rotation_on_noisy_relabelled_mirrors():
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
        B_al, perm, rmsd = align(A, B, reflections=False, restarts=8)
        Bc = B[perm] - B.mean(0)
        Rt = np.linalg.lstsq(Bc, B_al - A.mean(0), rcond=None)[0]  # B_al = Bc R^T + a0
        np.testing.assert_allclose(Rt.T @ Rt, np.eye(3), atol=1e-8)
        assert np.linalg.det(Rt) > 0
        rssd = Rotation.align_vectors(A - A.mean(0), Bc)[1]
        assert rmsd == pytest.approx(rssd / np.sqrt(len(A)), rel=1e-8, abs=1e-10)
        assert rmsd > 0.3  # a chiral walk: no rotation undoes the mirror (power)


def test_align_rmsd_invariant_and_symmetric():
    rng = np.random.default_rng(2)
    A = _molecule(rng)
    B = A[rng.permutation(19)] + 0.3 * rng.standard_normal((19, 3))
    r = align(A, B)[2]
    assert 0.05 < r < 0.5
    for _ in range(3):
        Ra, Rb = _orthogonal(rng, False), _orthogonal(rng, True)
        Ar, Br = A[rng.permutation(19)] @ Ra.T, B[rng.permutation(19)] @ Rb.T
        assert align(Ar, Br)[2] == pytest.approx(r, abs=1e-9)
    assert align(B, A)[2] == pytest.approx(r, abs=1e-9)


def test_shape_descriptor_invariant():
    rng = np.random.default_rng(3)
    A = _molecule(rng)
    B = A[rng.permutation(19)] @ _orthogonal(rng, True).T
    d = shape_descriptor(np.stack([A, B]))
    assert d.shape == (2, 22)
    np.testing.assert_allclose(d[0], d[1], atol=1e-12)


def test_shape_descriptor_bounds_rmsd():
    rng = np.random.default_rng(7)
    for _ in range(5):
        A, B = _molecule(rng), _molecule(rng)
        d = shape_descriptor(np.stack([A, B]))
        assert np.linalg.norm(d[0] - d[1]) <= np.sqrt(2 * 19) * align(A, B)[2]


def test_nearest_finds_planted_copy():
    rng = np.random.default_rng(4)
    T = np.stack([_molecule(rng) for _ in range(300)])
    planted = [17, 123, 250]
    X = np.stack([T[j][rng.permutation(19)] @ _orthogonal(rng, True).T for j in planted])
    for candidates, refine in [(4, 16), (300, 3)]:  # descriptor screen only; all stages
        idx, rmsd = nearest(X, T, k=2, candidates=candidates, refine=refine, restarts=0)
        assert idx.shape == rmsd.shape == (3, 2)
        np.testing.assert_array_equal(idx[:, 0], planted)
        assert (rmsd[:, 0] < 1e-10).all() and (rmsd[:, 1] > 0.1).all()
    with pytest.raises(ValueError, match="k=4"):
        nearest(X, T, k=4, refine=3)


def test_plot_nearest_writes_png(tmp_path):
    rng = np.random.default_rng(5)
    T = np.stack([_molecule(rng) for _ in range(20)])
    X = np.stack([_molecule(rng) for _ in range(3)])
    charges = rng.choice([1, 6, 7, 8, 9], size=(20, 19))
    path = tmp_path / "sub" / "fig5.png"
    idx, rmsd = plot_nearest(X, T, path, n=2, charges=charges, candidates=3, restarts=0)
    assert path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert idx.shape == rmsd.shape == (2,) and (rmsd > 0).all()


def test_plot_side_by_side_counts_clashes(tmp_path):
    # catches: a clash fraction over the drawn rows only, or with the wrong threshold
    rng = np.random.default_rng(7)
    grid = 1.5 * np.stack(np.meshgrid(*[np.arange(3.0)] * 3), -1).reshape(27, 3)
    X = np.stack([grid[rng.permutation(27)[:19]] for _ in range(10)])  # atoms >= 1.5 Å apart
    Y = X.copy()
    Y[:3, 1] = Y[:3, 0] + 0.5  # three molecules with two atoms 0.5 Å apart
    path = tmp_path / "side.png"
    got = plot_side_by_side({"a": X, "b": Y}, path, n=2)
    assert got == {"a": 0.0, "b": 0.3}
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="n = 4"):
        plot_side_by_side({"a": X[:3]}, path)


def test_bad_shapes_raise():
    rng = np.random.default_rng(6)
    A = _molecule(rng)
    with pytest.raises(ValueError, match=r"\(19, 2\)"):
        align(A, A[:, :2])
    with pytest.raises(ValueError, match=r"\(19, 3\) and \(18, 3\)"):
        align(A, A[:18])
    with pytest.raises(ValueError, match=r"\(19, 3\)"):
        nearest(A, A[None])
    with pytest.raises(ValueError, match=r"\(2, 18, 3\)"):
        nearest(A[None], np.zeros((2, 18, 3)))
    with pytest.raises(ValueError, match=r"\(5, 19\)"):
        plot_nearest(A[None], A[None], "unused.png", n=1, charges=np.ones((5, 19)))
    with pytest.raises(ValueError, match="non-finite"):
        align(A, np.full((19, 3), np.nan))
