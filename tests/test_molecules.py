"""metrics.nearest (nearest molecules, shape descriptors) and viz.molecules (the Figure 5
plot); the superposition itself is tests/test_alignment.py's."""

import numpy as np
import pytest

from grassflow.manifolds.alignment import superpose
from grassflow.metrics.nearest import nearest, shape_descriptor
from grassflow.viz.molecules import plot_nearest, plot_side_by_side
from test_alignment import _molecule, _orthogonal


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
        assert np.linalg.norm(d[0] - d[1]) <= np.sqrt(2 * 19) * superpose(A, B)[2]


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
    with pytest.raises(ValueError, match=r"\(19, 3\)"):
        nearest(A, A[None])
    with pytest.raises(ValueError, match=r"\(2, 18, 3\)"):
        nearest(A[None], np.zeros((2, 18, 3)))
    with pytest.raises(ValueError, match=r"\(5, 19\)"):
        plot_nearest(A[None], A[None], "unused.png", n=1, charges=np.ones((5, 19)))
    with pytest.raises(ValueError, match="non-finite"):
        nearest(A[None], np.full((2, 19, 3), np.nan))


def test_generated_atoms_of_a_typed_model_are_drawn_by_element(tmp_path):
    # catches element colours taken from the wrong molecule or the wrong table
    from grassflow.viz.molecules import _colours

    assert _colours([1, 6, 8, 16], "tab:cyan") == ["0.85", "0.25", "tab:red", "tab:purple"]
    assert _colours(None, "tab:cyan") == "tab:cyan"
    rng = np.random.default_rng(5)
    T = np.stack([_molecule(rng) for _ in range(6)])
    X = np.stack([_molecule(rng) for _ in range(4)])
    z = rng.choice([1, 6, 7, 8, 9], size=(4, 19))
    plot_nearest(X, T, tmp_path / "a.png", n=2, sample_charges=z, candidates=3, restarts=0)
    plot_side_by_side({"typed": X}, tmp_path / "b.png", n=2, charges={"typed": z})
    assert (tmp_path / "a.png").stat().st_size > 1000 and (tmp_path / "b.png").stat().st_size
