"""Users' own point clouds end to end: `grassflow train --data`, eval, sample, plot."""

import json
import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon, pdist

from grassflow.cli import main
from grassflow.data.point_clouds import load_point_clouds, write_xyz
from grassflow.tasks import shape_runs as shapes
from grassflow.tasks.run_dir import read_preset

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.slow]

FAST = ["--iterations", "30", "--budget-minutes", "10",
        "--atol", "1e-4", "--rtol", "1e-4", "--no-progress"]  # fmt: skip


def clouds(N, n, d, seed=0):
    """Noisy copies of one random shape, in random orientations and with shuffled points."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n, d))
    Q = np.linalg.qr(rng.standard_normal((N, d, d)))[0]
    X = (base + 0.1 * rng.standard_normal((N, n, d))) @ Q + rng.standard_normal((N, 1, d))
    return np.stack([x[rng.permutation(n)] for x in X])


def test_npy_train_eval_sample_plot(tmp_path, capsys):
    # catches: eval reading the wrong checkpoint, samples off their shape or not centred, and
    # a plot or sample command that writes nothing
    np.save(tmp_path / "shapes.npy", clouds(80, 5, 2))
    run = tmp_path / "run"
    assert main(["train", "--data", str(tmp_path / "shapes.npy"), "--run-dir", str(run),
                 *FAST]) == 0  # fmt: skip
    exp = json.loads((run / "experiment.json").read_text())
    # the one model since issue 34: one flow on the cloud, an EGNN of 3 layers
    assert (exp["n_points"], exp["dim"], exp["model"]) == (5, 2, "equivariant-cnf")
    assert exp["layers"] == 3
    assert not {"potential", "gram", "gram_density", "prior"} & set(exp)
    assert not (run / "gram").exists()
    assert main(["eval", str(run), "--n-samples", "50"]) == 0
    r = json.loads((run / "eval.json").read_text())
    assert math.isfinite(r["test_nll"]) and "test_nll_gram" not in r
    assert r["n_test"] == 8 and r["flow_iterations"] == 30 and "gram_iterations" not in r
    # catches: train / val / test overlapping or not covering the data (a row is a cloud)
    preset = read_preset(run, shapes.ShapeExperiment.from_dict, "shape")
    splits = shapes.load_clouds(preset)
    names = ("train", "val", "test")
    sets = {s: {x.tobytes() for x in splits[s].numpy()} for s in names}
    assert [len(sets[s]) for s in names] == [64, 8, 8]
    assert not (sets["train"] & sets["val"] or sets["train"] & sets["test"]
                or sets["val"] & sets["test"])  # fmt: skip
    assert set().union(*sets.values()) == {x.tobytes() for x in np.load(tmp_path / "shapes.npy")}
    # catches: the SEM not std / sqrt(N) and the NLL of other clouds: recomputed per cloud
    _, model = shapes.load_run(run)
    with torch.no_grad():
        lp = model.log_prob(splits["test"]).numpy()
    assert r["test_nll"] == pytest.approx(-lp.mean(), rel=1e-9)
    assert r["test_nll_sem"] == pytest.approx(lp.std(ddof=1) / np.sqrt(8), rel=1e-6)
    # catches: a JSD of other histograms or conventions: recomputed with numpy and scipy
    # (the project's JSD is in nats: the square of scipy's Jensen-Shannon distance, base e)
    X = shapes.sample(run, 50, seed=0, save=False)  # the samples eval drew
    a = np.concatenate([pdist(x) for x in X])
    b = np.concatenate([pdist(x) for x in splits["test"].numpy()])
    hi = 1.5 * np.quantile(b, 0.999)
    p = np.histogram(np.clip(a, 0.0, hi), bins=100, range=(0.0, hi))[0]
    q = np.histogram(b, bins=100, range=(0.0, hi))[0]
    assert X.shape == (50, 5, 2)
    assert r["distance_jsd"] == pytest.approx(jensenshannon(p, q) ** 2, rel=1e-6)
    # catches: a checkpoint picked on other clouds than the validation split's: best.pt's
    # val_nll is its weights' NLL on the first n_val_flow val clouds (validated in float32,
    # the training dtype; other clouds would differ by far more than its rounding)
    val, n_val = splits["val"], preset.n_val_flow
    with torch.no_grad():
        nll = -model.log_prob(val[:n_val]).mean()
        other = -model.log_prob(splits["test"]).mean()
    best = torch.load(run / "flow" / "best.pt", weights_only=False)
    assert best["val_nll"] == pytest.approx(nll.item(), rel=1e-4)
    assert abs(other - nll) > 1e-2
    assert preset.flow.dtype == "float32" and model.dtype == torch.float64  # eval in float64
    # the same numbers again: evaluation is deterministic; and it leaves the samples a user
    # drew alone (catches: eval overwriting samples.npy with its own 50)
    mine = np.full((3, 5, 2), 7.0)
    np.save(run / "samples.npy", mine)
    assert main(["eval", str(run), "--n-samples", "50"]) == 0
    assert json.loads((run / "eval.json").read_text()) == r
    assert np.array_equal(np.load(run / "samples.npy"), mine)
    assert "nats per shape" in capsys.readouterr().out
    assert main(["sample", str(run), "--n", "7", "--out", str(tmp_path / "s.npy")]) == 0
    X = np.load(tmp_path / "s.npy")
    assert X.shape == (7, 5, 2) and np.abs(X.mean(axis=1)).max() < 1e-12
    assert main(["plot", str(run)]) == 0
    assert (run / "shapes.png").stat().st_size > 10_000
    # catches: a longer run refused as "another run" instead of continuing (resume)
    more = [a if a != "30" else "45" for a in FAST]
    assert main(["train", "--data", str(tmp_path / "shapes.npy"), "--run-dir", str(run),
                 *more, "--resume"]) == 0  # fmt: skip
    assert main(["eval", str(run), "--n-samples", "50"]) == 0
    r = json.loads((run / "eval.json").read_text())
    assert r["flow_iterations"] == 45
    # the model behind the numbers is the one the command-line evaluated
    _, model = shapes.load_run(run)
    test = shapes.load_clouds(read_preset(run, shapes.ShapeExperiment.from_dict, "shape"))["test"]
    with torch.no_grad():
        assert -model.log_prob(test).mean().item() == pytest.approx(r["test_nll"], rel=1e-6)


def test_xyz_folder_with_shared_labels(tmp_path):
    # catches: atom types lost on the way from .xyz to the model, and .xyz samples not written
    folder = tmp_path / "mols"
    X = clouds(40, 6, 3)
    labels = np.array([6, 6, 8, 1, 1, 1])
    write_xyz(folder / "a.xyz", X[:25], np.broadcast_to(labels, (25, 6)))
    write_xyz(folder / "b.xyz", X[25:], np.broadcast_to(labels, (15, 6)))
    run = tmp_path / "run"
    assert main(["train", "--data", str(folder), "--run-dir", str(run), *FAST]) == 0
    exp = json.loads((run / "experiment.json").read_text())
    assert exp["labels"] == labels.tolist() and exp["efm_labels"] is True
    assert main(["sample", str(run), "--n", "3", "--out", str(tmp_path / "gen.npy")]) == 0
    back = load_point_clouds(tmp_path / "gen.xyz")
    assert back.positions.shape == (3, 6, 3) and (back.labels == labels).all()


def test_bad_inputs_are_named(tmp_path, capsys):
    # catches: a ragged, NaN or too-small input reaching the model as a silent wrong answer,
    # each by its own message (a run directory of its own, so no later error stands in)
    ragged = tmp_path / "ragged"
    write_xyz(ragged / "a.xyz", clouds(3, 5, 3))
    write_xyz(ragged / "b.xyz", clouds(3, 6, 3))
    cases = {
        "nan.npy": "contain NaN or inf",
        "small.npy": "n >= d + 2",  # 3 points in 2-D: Gr(2, 2) does not exist
        "ragged": "ragged clouds",
        "missing.npy": "no such file or folder",
    }
    np.save(tmp_path / "nan.npy", np.where(np.arange(5)[None, :, None] == 2, np.nan,
                                           clouds(20, 5, 2)))  # fmt: skip
    np.save(tmp_path / "small.npy", clouds(20, 3, 2))
    for name, message in cases.items():
        run = tmp_path / f"run-{name}"
        rc = main(["train", "--data", str(tmp_path / name), "--run-dir", str(run), *FAST])
        err = capsys.readouterr().err
        assert rc == 2 and name in err and message in err, (name, err)
        assert not run.exists()  # refused before anything is written
    # a second train into the same run directory without --resume is refused
    np.save(tmp_path / "ok.npy", clouds(30, 5, 2))
    args = ["train", "--data", str(tmp_path / "ok.npy"), "--run-dir", str(tmp_path / "ok")]
    assert main([*args, *FAST]) == 0
    assert main([*args, *FAST]) == 2 and "--resume" in capsys.readouterr().err


def test_runs_train_in_float32_and_a_float64_run_continues_as_trained(tmp_path):
    # catches: a run of the old float64 preset refused (or silently switched) on resume by the
    # float32 default, and a --dtype that does not reach --data's training
    np.save(tmp_path / "shapes.npy", clouds(40, 4, 2))
    data = ["train", "--data", str(tmp_path / "shapes.npy"), "--no-eval", "--atol", "1e-3",
            "--rtol", "1e-3", "--no-progress", "--budget-minutes", "10"]  # fmt: skip
    dtype = lambda run: json.loads((run / "flow" / "config.json").read_text())["dtype"]
    assert main([*data, "--run-dir", str(tmp_path / "new"), "--iterations", "4"]) == 0
    assert dtype(tmp_path / "new") == "float32"
    old = tmp_path / "old"
    assert main([*data, "--run-dir", str(old), "--iterations", "4", "--dtype", "float64"]) == 0
    assert main([*data, "--run-dir", str(old), "--iterations", "8", "--resume"]) == 0
    assert dtype(old) == "float64"
    assert torch.load(old / "flow" / "last.pt", weights_only=False)["iteration"] == 8


def test_a_fixed_mixture_survives_the_saved_preset_and_old_runs_read_as_trained():
    """Catches ``train_base`` lost between the preset, its experiment.json and the model
    (a run continued with the other choice), and an old run's preset (no ``train_base``)
    read as anything but the mixture it trained."""
    new = shapes.ShapeExperiment(data="x.npz", geometry="internal", n_points=4,
                                 bonds=((0, 1), (1, 2), (2, 3)), labels=(6, 6, 6, 6),
                                 train_base=False)  # fmt: skip
    saved = {k: v for k, v in new.to_dict().items() if k != "train_base"}
    old = shapes.ShapeExperiment.from_dict(json.loads(json.dumps(saved)))
    assert old.train_base is True
    assert shapes.ShapeExperiment.from_dict(json.loads(json.dumps(new.to_dict()))).train_base \
        is False  # fmt: skip
    for exp in (new, old):
        model = shapes.build_model(exp)
        assert model.config.train_base is exp.train_base
        assert all(p.requires_grad is exp.train_base for p in model.flow.base.parameters())
