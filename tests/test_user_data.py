"""Users' data as users have it (issue 33, item 5), end to end through the command line on tiny
runs (a couple of steps): ``eval --data`` on a held-out file, the checks it makes, and what
``sample`` writes (element symbols, which model drew the clouds)."""

import json

import numpy as np
import pytest

from grassflow.cli import main
from grassflow.data.point_clouds import load_point_clouds
from grassflow.tasks import shape_runs as shapes
from grassflow.tasks.run_dir import read_preset

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TINY = ["--iterations", "2", "--atol", "1e-3", "--rtol", "1e-3", "--no-progress"]
LABELS = np.array([6, 6, 8, 1, 1])


def clouds(N=40, n=5, d=3, seed=0):
    """Noisy copies of one random shape, translated."""
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((n, d))
        + 0.2 * rng.standard_normal((N, n, d))
        + rng.standard_normal((N, 1, d))
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The shape model trained two steps on 40 labelled clouds (labels from shapes_Z.npy)."""
    root = tmp_path_factory.mktemp("user_data")
    np.save(root / "shapes.npy", clouds())
    np.save(root / "shapes_Z.npy", LABELS)
    assert main(["train", "--data", str(root / "shapes.npy"), "--run-dir", str(root / "run"),
                 *TINY]) == 0  # fmt: skip
    return root, root / "run"


def test_eval_data_on_the_test_clouds_gives_the_test_split_numbers(run, capsys):
    # catches: `eval --data` scoring other clouds than the file's (the internal split, the
    # training clouds), writing over eval.json, or another model/sample seed than `eval`
    root, run_dir = run
    assert json.loads((run_dir / "experiment.json").read_text())["labels"] == LABELS.tolist()
    assert main(["eval", str(run_dir), "--n-samples", "20"]) == 0
    internal = json.loads((run_dir / "eval.json").read_text())
    exp = read_preset(run_dir, shapes.ShapeExperiment.from_dict, "shape")
    test = shapes.load_clouds(exp)["test"].numpy()
    # the same clouds, shuffled, in the user's own file (and its labels beside it)
    np.save(root / "heldout.npy", test[::-1])
    np.save(root / "heldout_Z.npy", LABELS)
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--n-samples", "20", "--data",
                 str(root / "heldout.npy")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "heldout.npy" in out and "eval_heldout.json" in out
    assert json.loads((run_dir / "eval.json").read_text()) == internal  # left alone
    mine = json.loads((run_dir / "eval_heldout.json").read_text())
    assert mine["n_test"] == len(test) == 4 and mine["labels_checked"] is True
    assert mine["data"] == str((root / "heldout.npy").resolve())
    for k in ("test_nll", "test_nll_sem", "distance_jsd"):
        assert mine[k] == pytest.approx(internal[k], rel=1e-9, abs=1e-12), k
    # other clouds give another number (the file is really read)
    np.save(root / "other.npy", clouds(N=6, seed=5))
    assert main(["eval", str(run_dir), "--n-samples", "20", "--data",
                 str(root / "other.npy")]) == 0  # fmt: skip
    other = json.loads((run_dir / "eval_other.json").read_text())
    assert other["n_test"] == 6 and other["test_nll"] != internal["test_nll"]
    assert other["labels_checked"] is False  # no labels in the file: said, not checked


@pytest.mark.parametrize("case", ["points", "dim", "labels"])
def test_eval_data_refuses_clouds_the_run_cannot_score(run, capsys, case):
    # catches: a held-out file of other clouds (another n, another d, other atom labels or
    # order) scored silently, giving a number of another model's density
    root, run_dir = run
    path = root / f"bad_{case}.npy"
    np.save(path, {"points": clouds(N=6, n=6), "dim": clouds(N=6, n=5, d=2),
                   "labels": clouds(N=6)}[case])  # fmt: skip
    if case == "labels":
        np.save(root / f"bad_{case}_Z.npy", LABELS[[0, 2, 1, 3, 4]])
    assert main(["eval", str(run_dir), "--n-samples", "20", "--data", str(path)]) == 2
    err = capsys.readouterr().err
    want = {"points": "6 points in 3-D, but the run models clouds of 5 points in 3-D",
            "dim": "5 points in 2-D, but the run models clouds of 5 points in 3-D",
            "labels": "other point labels than the run's"}[case]  # fmt: skip
    assert want in err and f"bad_{case}.npy" in err, err
    assert not (run_dir / f"eval_bad_{case}.json").exists()


def test_eval_data_on_a_kind_that_cannot_take_it(tmp_path, capsys):
    # catches: `eval --data` on a texture run silently ignoring the file and scoring the run's
    # own test set, or failing with a traceback
    (tmp_path / "experiment.json").write_text(json.dumps({"kind": "textures"}))
    assert main(["eval", str(tmp_path), "--data", "heldout.npy"]) == 2
    err = capsys.readouterr().err
    assert "'textures'" in err and "--data" in err


def test_sample_writes_element_symbols_and_the_model(run, tmp_path):
    # catches: every atom written as "X" (issue 33), and a comment line naming another model
    # than the one that drew the clouds
    _, run_dir = run
    assert main(["sample", str(run_dir), "--n", "3", "--out", str(tmp_path / "gen.npy")]) == 0
    lines = (tmp_path / "gen.xyz").read_text().splitlines()
    assert lines[0] == "5" and lines[1].startswith(
        "grassflow ShapeFlow (Cartesian geometry, the EFM baseline) sample")
    assert [ln.split()[0] for ln in lines[2:7]] == ["C", "C", "O", "H", "H"]
    back = load_point_clouds(tmp_path / "gen.npy")  # its labels come back from gen_Z.npy
    assert back.positions.shape == (3, 5, 3) and (back.labels == LABELS).all()


def test_baseline_samples_say_shape_flow_efm(tmp_path):
    # catches: the EFM baseline's samples labelled "grassflow ShapeFlow sample" (issue 33: the
    # two-part model's comment, now TwoPartShapeFlow's) or with another model's name
    np.save(tmp_path / "c.npy", clouds(N=30))
    np.save(tmp_path / "c_Z.npy", LABELS)
    run_dir = tmp_path / "efm"
    assert main(["train", "--data", str(tmp_path / "c.npy"), "--model", "equivariant-cnf",
                 "--run-dir", str(run_dir), *TINY]) == 0  # fmt: skip
    assert main(["sample", str(run_dir), "--n", "2", "--out", str(tmp_path / "g.npy")]) == 0
    for xyz in (tmp_path / "g.xyz", run_dir / "samples.xyz"):
        comment = xyz.read_text().splitlines()[1]
        assert "ShapeFlow (Cartesian geometry, the EFM baseline)" in comment \
                and "TwoPart" not in comment, comment  # fmt: skip
