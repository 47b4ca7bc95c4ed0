"""Bond lengths and the bonds-kept fraction of generated molecules (grassflow.metrics.bonds)."""

import itertools

import numpy as np
import pytest

from grassflow.manifolds.alignment import superpose
from grassflow.metrics import bond_lengths, bonds_kept, bonds_kept_fraction

# ethanol-like: C0 C1 O2, H3-H5 on C0, H6-H7 on C1, H8 on O2
LABELS = np.array([6, 6, 8, 1, 1, 1, 1, 1, 1])
BONDS = np.array([[0, 1], [0, 3], [0, 4], [0, 5], [1, 2], [1, 6], [1, 7], [2, 8]])
TEMPLATE = np.array([
    [0.00, 0.00, 0.00], [1.52, 0.00, 0.00], [2.00, 1.35, 0.00],
    [-0.36, -1.03, 0.00], [-0.36, 0.51, 0.89], [-0.36, 0.51, -0.89],
    [1.90, -0.52, 0.89], [1.90, -0.52, -0.89], [2.96, 1.33, 0.00],
])  # fmt: skip


def _random_orthogonal(rng) -> np.ndarray:
    Q, r = np.linalg.qr(rng.standard_normal((3, 3)))
    return Q * np.sign(np.diag(r))


def _label_preserving_perm(rng) -> np.ndarray:
    perm = np.arange(len(LABELS))
    for v in np.unique(LABELS):
        g = np.flatnonzero(LABELS == v)
        perm[g] = rng.permutation(g)
    return perm


def _data(N=40, seed=0):
    """Noisy copies (0.02 Å) of the template, each rotated, reflected or not, translated."""
    rng = np.random.default_rng(seed)
    X = TEMPLATE + 0.02 * rng.standard_normal((N, 9, 3))
    return np.stack([x @ _random_orthogonal(rng) + rng.standard_normal(3) for x in X])


def _stretch(x: np.ndarray, i: int, j: int, factor: float) -> np.ndarray:
    """``x`` with atom j (terminal) moved along bond (i, j) to ``factor`` times its length."""
    y = x.copy()
    y[j] = x[i] + factor * (x[j] - x[i])
    return y


def test_bond_lengths_match_a_direct_loop():
    # bug caught: the wrong axis, pairs taken from the wrong end, or squared lengths
    X = _data(5)
    L = bond_lengths(X, BONDS)
    assert L.shape == (5, 8)
    for m in range(5):
        for b, (i, j) in enumerate(BONDS):
            assert L[m, b] == pytest.approx(np.sqrt(((X[m, i] - X[m, j]) ** 2).sum()), rel=1e-14)


def test_the_data_keep_all_their_bonds_with_and_without_labels():
    # bug caught: a tolerance applied to absolute rather than relative deviations, or a
    # matching that scrambles a molecule given in the reference's own order
    X = _data()
    l0 = bond_lengths(X, BONDS).mean(0)
    assert bonds_kept_fraction(X, BONDS, l0) == 1.0
    assert bonds_kept_fraction(X, BONDS, l0, labels=LABELS, reference=TEMPLATE) == 1.0


def test_invariant_to_rigid_motion_reflection_and_label_preserving_relabelling():
    # bug caught: a matching without reflections, one that ignores the labels, or a verdict
    # that depends on the sample's frame or atom order. Half the samples are broken, so the
    # verdicts to preserve are not all the same.
    rng = np.random.default_rng(1)
    X = _data(20)
    l0 = bond_lengths(X, BONDS).mean(0)
    X[::2] = [_stretch(x, 0, 1, 1.3) for x in X[::2]]  # C-C bond 30 % long
    before = bonds_kept(X, BONDS, l0, labels=LABELS, reference=TEMPLATE)
    assert before.tolist() == [False, True] * 10
    Y = np.stack([(x @ _random_orthogonal(rng) + 5 * rng.standard_normal(3))[
        _label_preserving_perm(rng)] for x in X])  # fmt: skip
    after = bonds_kept(Y, BONDS, l0, labels=LABELS, reference=TEMPLATE)
    np.testing.assert_array_equal(after, before)
    # without labels the relabelled samples break their bonds: the matching is doing work
    assert bonds_kept_fraction(Y, BONDS, l0) < 0.5


def test_one_bond_stretched_by_15_percent_drops_the_sample():
    # bug caught: a tolerance that is not relative (10 % of 1.09 Å vs of 1.52 Å), or a
    # matching that "repairs" a broken bond by handing the atom to another partner
    X = _data()
    l0 = bond_lengths(X, BONDS).mean(0)
    for i, j in ((0, 3), (2, 8), (1, 2)):  # C-H, O-H, C-O
        Y = X.copy()
        Y[7] = _stretch(X[7], i, j, 1.15 * l0[(BONDS == (i, j)).all(1)][0]
                        / np.linalg.norm(X[7, j] - X[7, i]))  # fmt: skip
        for kw in ({}, {"labels": LABELS, "reference": TEMPLATE}):
            kept = bonds_kept(Y, BONDS, l0, **kw)
            assert not kept[7] and kept.sum() == len(X) - 1, (i, j, kw)
    # 5 % is within the tolerance
    Y = X.copy()
    Y[7] = _stretch(X[7], 0, 3, 1.05)
    assert bonds_kept_fraction(Y, BONDS, l0, labels=LABELS, reference=TEMPLATE) == 1.0


@pytest.mark.parametrize("broken", [0, 39])
def test_counted_over_all_samples(broken):
    # bug caught: only the first (or the last) sample decides, or a count not divided by N
    X = _data()
    l0 = bond_lengths(X, BONDS).mean(0)
    X[broken] = _stretch(X[broken], 1, 6, 1.4)
    for kw in ({}, {"labels": LABELS, "reference": TEMPLATE}):
        assert bonds_kept_fraction(X, BONDS, l0, **kw) == pytest.approx(39 / 40)


def test_several_references_rescue_a_backwards_match():
    # bug caught: only the first reference tried. The first one here has the two carbons'
    # (and their hydrogens') coordinates swapped, like a conformer that matches the molecule
    # backwards: every sample's match to it breaks C-O, and the local search cannot undo it
    X = _data(10)
    l0 = bond_lengths(X, BONDS).mean(0)
    backwards = TEMPLATE[[1, 0, 2, 6, 7, 3, 4, 5, 8]]
    one = bonds_kept_fraction(X, BONDS, l0, labels=LABELS, reference=backwards)
    two = bonds_kept_fraction(X, BONDS, l0, labels=LABELS,
                              reference=np.stack([backwards, TEMPLATE]))  # fmt: skip
    assert one == 0.0 and two == 1.0


# fluoroethane: the template without H8, its O a terminal F (C1-F 1.40 A)
F_LABELS = np.array([6, 6, 9, 1, 1, 1, 1, 1])
F_BONDS = BONDS[:-1]
F_TEMPLATE = TEMPLATE[:-1]


def _kept_by_brute_force(x: np.ndarray, l0: np.ndarray, tol: float = 0.1) -> bool:
    """Whether some label-preserving matching of fluoroethane's atoms in x keeps every bond
    (all 2! 5! matchings: the quantity `bonds_kept` bounds from below)."""
    groups = [np.flatnonzero(F_LABELS == v) for v in np.unique(F_LABELS)]
    for choice in itertools.product(*[itertools.permutations(g) for g in groups]):
        perm = np.empty(len(F_LABELS), np.int64)
        for g, c in zip(groups, choice):
            perm[g] = c
        if (np.abs(bond_lengths(x[perm][None], F_BONDS)[0] / l0 - 1) <= tol).all():
            return True
    return False


def test_matching_never_hands_an_atom_to_another_element():
    # catches: bond matching that refines across elements (the bond-length re-matching
    # without the label groups). With the F and a hydrogen of C1 swapped, the F sits 1.10 A
    # from C1: no label-preserving matching keeps the C-F bond (brute force over all of them),
    # so the sample is broken; a re-matching that may swap F and H back calls it kept.
    # bonds_kept is a lower bound of the brute-force verdict, and equals it on the intact
    # samples.
    rng = np.random.default_rng(3)
    X = F_TEMPLATE + 0.02 * rng.standard_normal((6, 8, 3))
    X = np.stack([x @ _random_orthogonal(rng) + rng.standard_normal(3) for x in X])
    l0 = bond_lengths(X, F_BONDS).mean(0)
    X[::2, [2, 6]] = X[::2, [6, 2]]  # F at H6's place and H6 at the F's
    X = np.stack([x[perm] for x, perm in zip(X, _label_preserving_perms(rng, F_LABELS, 6))])
    truth = [_kept_by_brute_force(x, l0) for x in X]
    assert truth == [False, True] * 3
    kept = bonds_kept(X, F_BONDS, l0, labels=F_LABELS, reference=F_TEMPLATE)
    assert kept.tolist() == truth


def _label_preserving_perms(rng, labels, m):
    perms = np.tile(np.arange(len(labels)), (m, 1))
    for perm in perms:
        for v in np.unique(labels):
            g = np.flatnonzero(labels == v)
            perm[g] = rng.permutation(g)
    return perms


def test_superpose_with_labels_matches_only_equal_labels():
    # bug caught: the label restriction ignored (an H matched to the O)
    rng = np.random.default_rng(2)
    B = TEMPLATE[_label_preserving_perm(rng)] @ _random_orthogonal(rng)
    _, perm, rmsd = superpose(TEMPLATE, B, labels=LABELS)
    assert (LABELS[perm] == LABELS).all() and rmsd < 1e-8
    _, perm, _ = superpose(TEMPLATE, B[::-1], labels=LABELS[::-1].copy())
    assert (LABELS[::-1][perm] == LABELS[::-1]).all()


def test_bad_input_is_named():
    X = _data(3)
    l0 = bond_lengths(X, BONDS).mean(0)
    with pytest.raises(ValueError, match="reference"):
        bonds_kept_fraction(X, BONDS, l0, labels=LABELS)
    with pytest.raises(ValueError, match=r"\[0, 9\)"):
        bond_lengths(X, np.array([[0, 9]]))
    with pytest.raises(ValueError, match="reference_lengths"):
        bonds_kept_fraction(X, BONDS, l0[:3])
    with pytest.raises(ValueError, match=r"\(N, n, 3\)"):
        bond_lengths(X[0], BONDS)
    with pytest.raises(ValueError, match="labels must be 9 integers"):
        bonds_kept_fraction(X, BONDS, l0, labels=LABELS[:4], reference=TEMPLATE)
