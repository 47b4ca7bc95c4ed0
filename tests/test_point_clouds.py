"""Tests for grassflow.data.point_clouds: loading users' .npy/.npz/.xyz point clouds."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from grassflow.data.point_clouds import (
    ELEMENTS,
    PointClouds,
    element_symbol,
    load_point_clouds,
    save_clouds,
    write_xyz,
)


def clouds(N: int = 4, n: int = 6, d: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(N, n, d)) * 2.0 + 5.0


# --- round trips -------------------------------------------------------------------------------


# Catches: positions centred (or cast to float32) on load although they must come back as read.
def test_npy_round_trip(tmp_path):
    P = clouds(N=5, n=7, d=2)
    np.save(tmp_path / "shapes.npy", P)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pc = load_point_clouds(tmp_path / "shapes.npy")
    assert isinstance(pc, PointClouds)
    assert pc.positions.dtype == np.float64 and pc.positions.shape == (5, 7, 2)
    np.testing.assert_array_equal(pc.positions, P)
    assert pc.labels is None and pc.skipped == []
    assert pc.sources == [f"shapes.npy[{i}]" for i in range(5)]


# Catches: integer arrays rejected as non-numeric, or returned with an integer dtype.
def test_npy_integer_positions_become_float64(tmp_path):
    P = np.random.default_rng(1).integers(-50, 50, size=(3, 6, 3))
    np.save(tmp_path / "ints.npy", P)
    pc = load_point_clouds(str(tmp_path / "ints.npy"))
    assert pc.positions.dtype == np.float64
    np.testing.assert_array_equal(pc.positions, P)


# Catches: the only array of an .npz ignored because it is not named "positions".
def test_npz_only_array(tmp_path):
    P = clouds()
    np.savez(tmp_path / "a.npz", coords=P)
    pc = load_point_clouds(tmp_path / "a.npz")
    np.testing.assert_array_equal(pc.positions, P)
    assert pc.labels is None
    assert pc.sources[2] == "a.npz:coords[2]"


# Catches: key= ignored in favour of "positions", or (N, n) labels dropped or mis-cast.
def test_npz_key_and_labels(tmp_path):
    P, Q = clouds(seed=1), clouds(seed=2)
    L = np.random.default_rng(3).integers(1, 10, size=(4, 6))
    np.savez(tmp_path / "b.npz", positions=P, other=Q, labels=L)
    pc = load_point_clouds(tmp_path / "b.npz", key="other")
    np.testing.assert_array_equal(pc.positions, Q)
    assert pc.labels.dtype == np.int64
    np.testing.assert_array_equal(pc.labels, L)
    pc = load_point_clouds(tmp_path / "b.npz")  # "positions" wins when there are several
    np.testing.assert_array_equal(pc.positions, P)


# Catches: per-point labels (n,) not broadcast to every cloud.
def test_npz_labels_broadcast(tmp_path):
    L = np.array([6, 1, 1, 1, 8, 7])
    np.savez(tmp_path / "c.npz", positions=clouds(), labels=L)
    pc = load_point_clouds(tmp_path / "c.npz")
    assert pc.labels.shape == (4, 6)
    np.testing.assert_array_equal(pc.labels, np.tile(L, (4, 1)))


# Catches: frames after the first of a multi-frame file lost, files read out of name order,
# or symbols not turned back into the same atomic numbers.
def test_xyz_folder_round_trip(tmp_path):
    folder = tmp_path / "mols"
    P = clouds(N=5, n=6)
    L = np.array([[6, 1, 17, 35, 53, 8]] * 2 + [[7, 7, 9, 16, 1, 1]] * 3)
    write_xyz(folder / "b.xyz", P[2:], L[2:])  # written first, read second
    write_xyz(folder / "a.xyz", P[:2], L[:2])
    (folder / "notes.txt").write_text("not a cloud")
    pc = load_point_clouds(folder)
    np.testing.assert_allclose(pc.positions, P, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(pc.labels, L)
    assert pc.sources == [
        "mols/a.xyz#frame0",
        "mols/a.xyz#frame1",
        "mols/b.xyz#frame0",
        "mols/b.xyz#frame1",
        "mols/b.xyz#frame2",
    ]


# Catches: a single .xyz file (not a folder) refused; labels=None not written as X / read as 0.
def test_single_xyz_file_without_labels(tmp_path):
    P = clouds(N=3)
    write_xyz(tmp_path / "s.xyz", P)
    assert (tmp_path / "s.xyz").read_text().splitlines()[2].startswith("X ")
    pc = load_point_clouds(tmp_path / "s.xyz")
    np.testing.assert_allclose(pc.positions, P, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(pc.labels, 0)
    assert pc.sources == ["s.xyz#frame0", "s.xyz#frame1", "s.xyz#frame2"]


# Catches: parser choking on extra columns, atomic-number symbols, lowercase symbols, blank lines.
def test_xyz_tolerant_parsing(tmp_path):
    text = (
        "6 extra tokens\nmolecule one\n"
        "C 0 0 0 0.1 charge\n6 1 0 0\ncl 0 1 0\nBR 0 0 1\nI 1 1 1\n8 2 1 3 x y\n"
        "\n"
        "6\n\n"
        "H 0 0 0\nH 1 0 0\nH 0 1 0\nH 0 0 1\nH 1 1 1\nH 2 1 3\n"
    )
    (tmp_path / "t.xyz").write_text(text)
    pc = load_point_clouds(tmp_path / "t.xyz")
    assert pc.positions.shape == (2, 6, 3)
    np.testing.assert_array_equal(pc.labels[0], [6, 6, 17, 35, 53, 8])
    np.testing.assert_array_equal(pc.labels[1], 1)
    np.testing.assert_array_equal(pc.positions[1, 5], [2, 1, 3])


# Catches: element table missing the common organic elements or halogens.
def test_element_table():
    assert [ELEMENTS[s] for s in ("H", "C", "N", "O", "F", "P", "S", "Cl", "Br", "I")] == [
        1,
        6,
        7,
        8,
        9,
        15,
        16,
        17,
        35,
        53,
    ]
    assert all(ELEMENTS[s] == z for z, s in enumerate(["X", "H", "He", "Li", "Be", "B"]))


# --- errors ------------------------------------------------------------------------------------


# Catches: a missing path reported as an unknown extension (or not raised at all).
def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.npy"):
        load_point_clouds(tmp_path / "nope.npy")


# Catches: unknown extensions silently parsed as something.
def test_unknown_extension(tmp_path):
    (tmp_path / "data.csv").write_text("1,2,3\n")
    with pytest.raises(ValueError, match=r"data\.csv.*unknown extension"):
        load_point_clouds(tmp_path / "data.csv")


# Catches: a folder without .xyz files returning zero clouds instead of raising.
def test_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.md").write_text("hi")
    with pytest.raises(ValueError, match=r"empty.*no \.xyz files"):
        load_point_clouds(tmp_path / "empty")


# Catches: empty arrays passing through to a crash in the SVD.
@pytest.mark.parametrize("shape", [(0, 6, 3), (0,)])
def test_empty_array(tmp_path, shape):
    np.save(tmp_path / "e.npy", np.zeros(shape))
    with pytest.raises(ValueError, match=r"e\.npy.*empty"):
        load_point_clouds(tmp_path / "e.npy")


# Catches: xyz frames of different atom counts stacked into an object array or truncated.
def test_ragged_xyz(tmp_path):
    write_xyz(tmp_path / "m" / "a.xyz", clouds(N=2, n=6))
    write_xyz(tmp_path / "m" / "b.xyz", clouds(N=3, n=7))
    with pytest.raises(
        ValueError,
        match=r"ragged.*6 in m/a\.xyz#frame0 and 1 more; "
        r"7 in m/b\.xyz#frame0 and 2 more",
    ):
        load_point_clouds(tmp_path / "m")


# Catches: a ragged (object) .npy array loaded by pickle or failing with numpy's bare message.
def test_ragged_npy(tmp_path):
    a = np.empty(2, dtype=object)
    a[0], a[1] = np.zeros((5, 3)), np.zeros((6, 3))
    np.save(tmp_path / "r.npy", a, allow_pickle=True)
    with pytest.raises(ValueError, match=r"r\.npy.*ragged"):
        load_point_clouds(tmp_path / "r.npy")


# Catches: a single 2-D cloud or a 4-D batch accepted as (N, n, d).
@pytest.mark.parametrize("shape", [(6, 3), (2, 2, 6, 3)])
def test_wrong_ndim(tmp_path, shape):
    np.save(tmp_path / "w.npy", np.ones(shape))
    with pytest.raises(ValueError, match=r"w\.npy.*must be 3-D"):
        load_point_clouds(tmp_path / "w.npy")


# Catches: NaN/inf clouds silently kept (or skipped) instead of reported with count and first.
def test_nonfinite(tmp_path):
    P = clouds(N=5)
    P[1, 0, 0], P[3, 2, 1] = np.nan, np.inf
    np.save(tmp_path / "nan.npy", P)
    with pytest.raises(
        ValueError,
        match=r"nan\.npy: 2 of 5 clouds contain NaN or inf "
        r"\(first: nan\.npy\[1\]\)",
    ):
        load_point_clouds(tmp_path / "nan.npy")


# Catches: clouds with n < d + 2 accepted (Gr(d, n - 1) would be degenerate or empty).
def test_too_few_points(tmp_path):
    np.save(tmp_path / "few.npy", clouds(n=4, d=3))
    with pytest.raises(ValueError, match=r"few\.npy.*n = 4.*d = 3.*needs n >= d \+ 2 = 5"):
        load_point_clouds(tmp_path / "few.npy")
    np.save(tmp_path / "ok.npy", clouds(n=5, d=3))  # boundary n = d + 2 is fine
    assert load_point_clouds(tmp_path / "ok.npy").positions.shape == (4, 5, 3)


# Catches: string, boolean or complex arrays cast to float (or crashing inside numpy).
@pytest.mark.parametrize(
    "arr", [np.full((2, 6, 3), "a"), np.ones((2, 6, 3), bool), np.ones((2, 6, 3), complex)]
)
def test_non_numeric_dtype(tmp_path, arr):
    np.savez(tmp_path / "s.npz", positions=arr)
    with pytest.raises(ValueError, match=r"s\.npz.*non-numeric dtype"):
        load_point_clouds(tmp_path / "s.npz")


# Catches: an .npz with several arrays and no "positions" guessed instead of listing keys.
def test_npz_ambiguous_and_missing_key(tmp_path):
    np.savez(tmp_path / "k.npz", a=clouds(), b=clouds())
    with pytest.raises(ValueError, match=r"k\.npz.*no 'positions'.*\['a', 'b'\]"):
        load_point_clouds(tmp_path / "k.npz")
    with pytest.raises(ValueError, match=r"k\.npz.*no key 'c'.*\['a', 'b'\]"):
        load_point_clouds(tmp_path / "k.npz", key="c")


# Catches: labels of the wrong shape silently broadcast or misaligned with the clouds.
def test_npz_bad_labels(tmp_path):
    np.savez(tmp_path / "l.npz", positions=clouds(), labels=np.ones((4, 5), int))
    with pytest.raises(ValueError, match=r"l\.npz.*labels of shape \(4, 5\)"):
        load_point_clouds(tmp_path / "l.npz")


# Catches: unknown element symbols mapped to 0/X silently, or reported without file and line.
def test_unknown_symbol(tmp_path):
    (tmp_path / "u.xyz").write_text("5\nc\nC 0 0 0\nC 1 0 0\nQq 0 1 0\nC 0 0 1\nC 1 1 1\n")
    with pytest.raises(
        ValueError,
        match=r"u\.xyz: line 5 \(frame 0\): unknown element "
        r"symbol 'Qq'",
    ):
        load_point_clouds(tmp_path / "u.xyz")


# Catches: truncated frames, bad count lines or bad coordinates read as garbage or IndexError.
@pytest.mark.parametrize(
    "text, problem",
    [
        ("5\nc\nC 0 0 0\nC 1 0 0\n", r"frame 0 \(line 1\) announces 5 atoms but the file ends"),
        ("five\nc\n", r"line 1 \(frame 0\): expected a positive atom count"),
        ("1\nc\nC 0 0\n", r"line 3 \(frame 0\): expected 'Symbol x y z'"),
        ("1\nc\nC 0 a 0\n", r"line 3 \(frame 0\): non-numeric coordinates"),
        ("", r"no frames"),
    ],
)
def test_malformed_xyz(tmp_path, text, problem):
    (tmp_path / "bad.xyz").write_text(text)
    with pytest.raises(ValueError, match=r"bad\.xyz.*" + problem):
        load_point_clouds(tmp_path / "bad.xyz")


# Catches: write_xyz silently writing 2-D clouds that would read back as rank-deficient 3-D ones.
def test_write_xyz_rejects_non_3d(tmp_path):
    with pytest.raises(ValueError, match=r"o\.xyz.*\(N, n, 3\)"):
        write_xyz(tmp_path / "o.xyz", clouds(d=2))


# --- rank deficiency ---------------------------------------------------------------------------


# Catches: collinear/coplanar clouds kept (not on Gr(d, n-1)), dropped silently, labels or
# sources left misaligned with the kept positions, or one warning per cloud.
def test_rank_deficient_skipped(tmp_path):
    P = clouds(N=5, n=6)
    t = np.linspace(0, 1, 6)[:, None]
    P[1] = 3.0 + t * np.array([1.0, 2.0, 3.0])  # collinear
    P[3, :, 2] = 7.0  # coplanar
    L = np.arange(30).reshape(5, 6)
    np.savez(tmp_path / "r.npz", positions=P, labels=L)
    with pytest.warns(
        UserWarning,
        match=r"r\.npz: skipped 2 of 5 rank-deficient clouds "
        r"\(first: r\.npz:positions\[1\]\)",
    ) as rec:
        pc = load_point_clouds(tmp_path / "r.npz")
    assert len([w for w in rec if "rank-deficient" in str(w.message)]) == 1
    keep = [0, 2, 4]
    np.testing.assert_array_equal(pc.positions, P[keep])
    np.testing.assert_array_equal(pc.labels, L[keep])
    assert pc.sources == [f"r.npz:positions[{i}]" for i in keep]
    assert len(pc.skipped) == 2
    assert (
        pc.skipped[0].startswith("r.npz:positions[1]: rank deficient")
        and "collinear" in pc.skipped[0]
    )
    assert (
        pc.skipped[1].startswith("r.npz:positions[3]: rank deficient")
        and "coplanar" in pc.skipped[1]
    )


# Catches: the skipped note naming the wrong frame of a multi-frame xyz file.
def test_rank_deficient_xyz_frame_named(tmp_path):
    P = clouds(N=3, n=6)
    P[2, :, 0] = 0.0
    write_xyz(tmp_path / "f.xyz", P)
    with pytest.warns(UserWarning, match=r"first: f\.xyz#frame2"):
        pc = load_point_clouds(tmp_path / "f.xyz")
    assert pc.sources == ["f.xyz#frame0", "f.xyz#frame1"]
    assert pc.skipped[0].startswith("f.xyz#frame2: rank deficient")


# Catches: an empty PointClouds returned when every cloud is rank deficient.
def test_all_rank_deficient_raises(tmp_path):
    P = np.zeros((3, 6, 3))
    P[..., 0] = np.arange(6)  # every cloud collinear
    np.save(tmp_path / "line.npy", P)
    with pytest.raises(ValueError, match=r"line\.npy: all 3 clouds are rank deficient"):
        load_point_clouds(tmp_path / "line.npy")


# Catches: rtol ignored, so nearly flat clouds can be neither kept nor dropped on request.
def test_rtol_controls_skipping(tmp_path):
    P = clouds(N=2)
    P[0, :, 2] = 5.0 + 1e-4 * np.arange(6)  # nearly flat: s_min/s_max ~ 1e-4
    np.save(tmp_path / "flat.npy", P)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_point_clouds(tmp_path / "flat.npy").sources) == 2
    with pytest.warns(UserWarning, match="skipped 1 of 2"):
        assert len(load_point_clouds(tmp_path / "flat.npy", rtol=1e-3).sources) == 1
    with pytest.raises(ValueError, match="rtol"):
        load_point_clouds(tmp_path / "flat.npy", rtol=-1.0)


# --- labels beside a .npy, element symbols, the 2-D hint (issue 33, item 5) ---------------------


# Catches: a .npy reading no labels although shapes_Z.npy lies beside it (the bug), or
# (N, n) per-cloud labels broadcast or reordered.
@pytest.mark.parametrize("per_cloud", [False, True])
def test_npy_labels_from_z_file(tmp_path, per_cloud):
    P = clouds(N=4, n=6)
    Z = np.array([6, 6, 8, 1, 1, 1])
    if per_cloud:
        Z = np.stack([np.roll(Z, i) for i in range(4)])
    np.save(tmp_path / "shapes.npy", P)
    np.save(tmp_path / "shapes_Z.npy", Z)
    pc = load_point_clouds(tmp_path / "shapes.npy")
    assert pc.labels.dtype == np.int64 and pc.labels.shape == (4, 6)
    np.testing.assert_array_equal(pc.labels, np.broadcast_to(Z, (4, 6)))
    assert pc.labels_from == "shapes_Z.npy"
    # no _Z file: no labels; another file's _Z is not taken
    np.save(tmp_path / "other.npy", P)
    assert load_point_clouds(tmp_path / "other.npy").labels is None


# Catches: a _Z.npy of the wrong shape silently broadcast, truncated or ignored, or reported
# without naming the labels file.
@pytest.mark.parametrize("bad", [np.arange(5), np.ones((3, 6), int), np.full(6, 1.5)])
def test_npy_labels_bad_shape_or_dtype(tmp_path, bad):
    np.save(tmp_path / "shapes.npy", clouds(N=4, n=6))
    np.save(tmp_path / "shapes_Z.npy", bad)
    with pytest.raises(ValueError, match=r"shapes_Z\.npy.*labels of shapes\.npy.*(fit|integers)"):
        load_point_clouds(tmp_path / "shapes.npy")


# Catches: labels kept for the wrong clouds when a rank-deficient cloud is dropped.
def test_npy_labels_follow_skipped_clouds(tmp_path):
    P = clouds(N=3, n=6)
    P[1] = np.outer(np.arange(6.0), [1.0, 2.0, 3.0])  # collinear
    Z = np.arange(18).reshape(3, 6) + 1
    np.save(tmp_path / "s.npy", P)
    np.save(tmp_path / "s_Z.npy", Z)
    with pytest.warns(UserWarning, match="rank-deficient"):
        pc = load_point_clouds(tmp_path / "s.npy")
    np.testing.assert_array_equal(pc.labels, Z[[0, 2]])


# Catches: atomic numbers written as "X" (the issue: every atom was X), or labels that are not
# atomic numbers collapsed to X so that they no longer read back as written.
def test_write_xyz_element_symbols_and_fallback(tmp_path):
    P = clouds(N=2, n=6)
    Z = np.array([[6, 1, 8, 17, 26, 79], [0, 118, -1, 200, 7, 1]])
    write_xyz(tmp_path / "z.xyz", P, Z, "made by a test")
    lines = (tmp_path / "z.xyz").read_text().splitlines()
    assert lines[1] == "made by a test"
    assert [ln.split()[0] for ln in lines[2:8]] == ["C", "H", "O", "Cl", "Fe", "Au"]
    assert [ln.split()[0] for ln in lines[10:16]] == ["X", "Og", "-1", "200", "N", "H"]
    back = load_point_clouds(tmp_path / "z.xyz")
    np.testing.assert_array_equal(back.labels, Z)
    assert back.labels_from == "xyz element symbols"
    assert element_symbol(53) == "I" and ELEMENTS["Xe"] == 54 and ELEMENTS["U"] == 92


# Catches: save_clouds still writing "grassflow ShapeFlow sample" whatever drew the clouds,
# or dropping the labels, so that the written .npy reads back without them.
def test_save_clouds_comment_and_labels(tmp_path):
    X, Z = clouds(N=3, n=5), np.array([6, 8, 1, 1, 1])
    written = save_clouds(X, tmp_path / "gen.npy", Z, "grassflow EquivariantCNF sample")
    assert [p.name for p in written] == ["gen.npy", "gen_Z.npy", "gen.xyz"]
    text = (tmp_path / "gen.xyz").read_text().splitlines()
    assert text[1] == "grassflow EquivariantCNF sample" and text[2].split()[0] == "C"
    for path in (tmp_path / "gen.npy", tmp_path / "gen.xyz"):
        np.testing.assert_array_equal(load_point_clouds(path).labels, np.broadcast_to(Z, (3, 5)))


# Catches: the (N, n) hint saying only "one cloud? add a leading axis", wrong when the array
# holds N clouds with their coordinate axis missing or flattened (issue 33).
def test_two_d_hint_names_both_readings(tmp_path):
    np.save(tmp_path / "flat.npy", clouds(N=40, n=5).reshape(40, 15))
    with pytest.raises(ValueError) as info:
        load_point_clouds(tmp_path / "flat.npy")
    msg = str(info.value)
    assert "one cloud of 40 points in 15-D" in msg and "P[None]" in msg
    assert "40 clouds" in msg and "P[..., None]" in msg and "P.reshape(40, 5, 3)" in msg
